"""How many threads a server's engine arithmetic should use: the CPUs the rest of the machine leaves it.

An OpenMP team waits at the end of every parallel region for its slowest thread, and a decode step is
hundreds of regions. When another process keeps one core of a 2-core machine busy (a browser drawing
the page, a vLLM server, a visitor's study in a second app), the team's second thread runs only in the
slices the scheduler leaves it, and each region waits for one. On a 2-core AVX2 EPYC, plain decoding of
96 tokens took 1.98 s on two threads alone, 4.60 s on two threads beside one busy core and 2.15 s on one
thread beside it (`python -m playground.evaluation.cpu_contention`). So the compute thread asks, between
steps, how much of its CPUs others used over the last second, and runs on what is left (at least one
thread, at most what it started with).

Linux only (it reads /proc/stat and /proc/self/stat); elsewhere the thread count stays as it started.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch

EVERY_S = 1.0   # how often the share is measured again: long enough that a step's bursts average out
# A thread runs on a CPU of which others leave it at least KEEP; one is added back only where ADD is free
# (the gap keeps the count from flapping when others use about a third of a CPU).
KEEP, ADD = 0.65, 0.8


# the threads the engine computes on when it has its CPUs to itself (torch's count as the process starts):
# what a host's figures are described and cached by, whatever a CpuShare has set for the moment
CONFIGURED_THREADS = torch.get_num_threads()


class CpuTimes(NamedTuple):
    """Jiffies since boot: busy and all, summed over the CPUs we may run on, and this process's own."""
    busy: int
    total: int
    own: int


def read_times(cpus: frozenset[int]) -> CpuTimes | None:
    """The CPU times now, or None where /proc cannot tell them."""
    try:
        busy = total = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                continue
            jiffies = [int(f) for f in fields[:8]]   # user nice system idle iowait irq softirq steal
            total += sum(jiffies)
            busy += sum(jiffies) - jiffies[3] - jiffies[4]
        # the fields after the command (which may hold spaces): utime and stime are the 12th and 13th
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        own = int(stat[11]) + int(stat[12])
    except (OSError, ValueError, IndexError):
        return None
    return CpuTimes(busy, total, own) if total else None


def threads_for(free: float, most: int, current: int) -> int:
    """The threads to run on when `free` CPUs are left by other processes, `current` now, at most `most`."""
    keep, add = int(free + 1 - KEEP), int(free + 1 - ADD)
    if current > keep:
        return max(1, keep)
    if current < add:
        return min(most, add)
    return current


class CpuShare:
    """Between steps, `adjust()` sets torch's thread count to the CPUs other processes leave free."""

    def __init__(self, most: int | None = None, read: Callable[[frozenset[int]], CpuTimes | None] = read_times,
                 clock: Callable[[], float] = time.monotonic):
        self.cpus = frozenset(os.sched_getaffinity(0))
        self.most = min(most or CONFIGURED_THREADS, len(self.cpus))
        self.threads = self.most
        self._read, self._clock = read, clock
        self._last, self._at = read(self.cpus), clock()

    def others(self, now: CpuTimes) -> float:
        """CPUs the other processes used since the last reading."""
        total = now.total - self._last.total
        others = (now.busy - self._last.busy) - (now.own - self._last.own)
        return max(0.0, others / total * len(self.cpus)) if total > 0 else 0.0

    def adjust(self) -> int:
        """At most every EVERY_S: measure, and set the thread count where it changes; the count in force."""
        if self._last is None or self._clock() - self._at < EVERY_S:
            return self.threads
        now = self._read(self.cpus)
        if now is None:
            return self.threads
        wanted = threads_for(len(self.cpus) - self.others(now), self.most, self.threads)
        self._last, self._at = now, self._clock()
        if wanted != self.threads:
            torch.set_num_threads(wanted)
            self.threads = wanted
        return self.threads
