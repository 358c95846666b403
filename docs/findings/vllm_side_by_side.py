"""Three vLLM CPU servers started side by side by the launcher: how long until all are healthy, and three
answers at once and one after another, with the launcher's binding (each server on cores of its own) and
with vLLM's (VLLM_CPU_OMP_THREADS_BIND=auto, which the launcher leaves alone where it is set).

    PYTHONPATH=. .venv/bin/python docs/findings/vllm_side_by_side.py [--rounds 2] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.vllm.backend import NONE, LaunchSpec, launch_config
from playground.engines.vllm.client import VLLMEngine
from playground.engines.vllm.cpu_binding import BIND_VARIABLE
from playground.engines.vllm.launch import Launched

RUNS = (("Write a haiku about the sea.", "eagle3"), ("Write a Python function that reverses a list.", "eagle3.1"),
        ("Explain photosynthesis.", NONE))


def measure(engine: ReferenceEngine, rounds: int, max_tokens: int) -> None:
    started = time.monotonic()
    config = launch_config(engine, LaunchSpec(k=5, server_args=("--enforce-eager",)), tuple(d for _, d in RUNS))
    launched = Launched(config, status=lambda line: None)
    try:
        vllm = VLLMEngine(launched.wait_healthy(status=lambda line: None), max_tokens_limit=engine.max_tokens_limit)
        print(f"  healthy after {time.monotonic() - started:.1f} s", flush=True)
        requests = [GenerationRequest(prompt=p, drafter=d, k=5, max_tokens=max_tokens) for p, d in RUNS]
        for _ in range(rounds):
            started = time.monotonic()
            with ThreadPoolExecutor(len(requests)) as pool:
                list(pool.map(lambda request: list(vllm.generate(request)), requests))
            at_once = time.monotonic() - started
            started = time.monotonic()
            for request in requests:
                list(vllm.generate(request))
            print(f"  three answers at once {at_once:.1f} s, one after another {time.monotonic() - started:.1f} s",
                  flush=True)
    finally:
        launched.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engine = ReferenceEngine.load()
    for label, bind in (("vLLM's binding (auto)", "auto"), ("the launcher's binding", None)):
        print(label, flush=True)
        if bind:
            os.environ[BIND_VARIABLE] = bind
        else:
            os.environ.pop(BIND_VARIABLE, None)
        measure(engine, args.rounds, args.max_tokens)


if __name__ == "__main__":
    main()
