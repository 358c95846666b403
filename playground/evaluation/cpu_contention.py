"""Plain decoding alone and beside a process that keeps one CPU busy: what cpu_share's thread count is for.

    python -m playground.evaluation.cpu_contention
"""

from __future__ import annotations

import multiprocessing
import time

import torch

from playground.engines.cpu_share import CONFIGURED_THREADS, EVERY_S, CpuShare
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.evaluation.machine import described, machine


def spin_until(deadline: float) -> None:
    """Keep one CPU busy until time.monotonic() reaches `deadline`."""
    while time.monotonic() < deadline:
        pass


def beside_a_busy_cpu(tokens: int = 96) -> list[tuple[str, float]]:
    """Seconds of plain greedy decoding of `tokens` tokens on the embedded engine: alone, then beside a
    process that keeps one CPU busy on the configured threads, on one fewer, and as a CpuShare sets them
    between steps (as the page's compute thread does)."""
    engine, most = ReferenceEngine.load(), CONFIGURED_THREADS
    request = GenerationRequest(prompt="Tell me a long story about a lighthouse keeper.", drafter="none",
                                temperature=0.0, max_tokens=tokens)

    def decode(threads: int | None, share: CpuShare | None = None) -> float:
        torch.set_num_threads(threads or most)
        start = time.perf_counter()
        for _ in engine.generate(request):
            if share:
                share.adjust()
        return time.perf_counter() - start

    decode(most)   # warm
    rows = [(f"alone, {most} threads", decode(most))]
    busy = multiprocessing.get_context("spawn").Process(target=spin_until, args=(time.monotonic() + 600,))
    busy.start()
    try:
        time.sleep(EVERY_S)
        rows += [(f"beside a busy CPU, {most} threads", decode(most)),
                 (f"beside a busy CPU, {max(1, most - 1)} threads", decode(max(1, most - 1)))]
        share = CpuShare(most)
        time.sleep(EVERY_S)
        rows.append(("beside a busy CPU, as CpuShare sets them", decode(None, share)))
    finally:
        busy.terminate()
        torch.set_num_threads(most)
    return rows


if __name__ == "__main__":   # python -m playground.evaluation.cpu_contention
    print(f"Plain greedy decoding of 96 tokens on {described(machine())}:")
    for label, seconds in beside_a_busy_cpu():
        print(f"  {label}: {seconds:.2f} s")
