"""Speed measurements, side by side in one process (machines here are noisy: compare ratios).

    python -m playground bench baseline --max-tokens 128 --repeats 3
        the engine's plain path (drafter none) and each drafter vs transformers' greedy generate
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from playground.engines.reference import ReferenceEngine
from playground.request import GenerationRequest
from playground.stats import summarize

BASELINE_PROMPTS = (
    "Write a detailed essay about the history of the printing press.",
    "Write a Python function that merges two sorted lists, and explain it.",
)


@dataclass(frozen=True)
class BaselineConfig:
    max_tokens: int = 128
    repeats: int = 3
    drafters: tuple[str, ...] = ("none", "eagle3", "eagle3.1")
    k: int = 5


def hf_generate_tokens_per_s(engine: ReferenceEngine, request: GenerationRequest) -> tuple[float, list[int]]:
    ids = torch.tensor([engine.prompt_ids(request)])
    start = time.perf_counter()
    out = engine.target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.max_tokens,
                                       do_sample=False, pad_token_id=min(engine.target.eos_ids))
    elapsed = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    return len(new) / elapsed, new


def baseline(config: BaselineConfig) -> list[dict]:
    """Rows of tokens/s per method, interleaved per repeat so drift hits all methods alike."""
    engine = ReferenceEngine.load()
    rows: dict[str, list[float]] = {"transformers generate": []}
    rows.update({f"engine, drafter {d}": [] for d in config.drafters})
    for _ in range(config.repeats):
        for prompt in BASELINE_PROMPTS:
            request = GenerationRequest(prompt=prompt, max_tokens=config.max_tokens, k=config.k)
            tps, expected = hf_generate_tokens_per_s(engine, request)
            rows["transformers generate"].append(tps)
            for drafter in config.drafters:
                s = summarize(list(engine.generate(GenerationRequest(prompt=prompt, max_tokens=config.max_tokens,
                                                                     k=config.k, drafter=drafter))))
                assert list(s.token_ids) == expected, f"{drafter} diverged from generate"
                rows[f"engine, drafter {drafter}"].append(s.tokens_per_s)
    base = sum(rows["transformers generate"]) / len(rows["transformers generate"])
    return [{"method": name, "tokens_per_s": sum(v) / len(v), "vs_generate": sum(v) / len(v) / base}
            for name, v in rows.items()]


def format_table(rows: list[dict]) -> str:
    lines = ["| method | tokens/s | vs generate |", "|---|---:|---:|"]
    lines += [f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['vs_generate']:.2f}x |" for r in rows]
    return "\n".join(lines)


def ui_update_cost(steps: tuple[int, ...] = (16, 64, 256), repeats: int = 20) -> list[tuple[int, float, float]]:
    """Server-side milliseconds of one page update at a given number of verify steps:
    (steps, text update = answer HTML + figures cards, plot update = three plotly figures as JSON)."""
    from playground.ui import figures, render

    engine = ReferenceEngine.load()
    request = GenerationRequest(prompt="Tell me a long story about a lighthouse keeper.", max_tokens=max(steps) + 1,
                                k=5)
    events = list(engine.generate(request))
    rows = []
    for n in steps:
        part = events[:n + 1]
        t0 = time.perf_counter()
        for _ in range(repeats):
            render.answer_html(part), render.figures_html(summarize(part))
        t1 = time.perf_counter()
        for _ in range(repeats):
            [fig.to_json() for fig in figures.all_figures({"eagle3.1": summarize(part)})]
        t2 = time.perf_counter()
        rows.append((len(part) - 1, (t1 - t0) / repeats * 1e3, (t2 - t1) / repeats * 1e3))
    return rows


@dataclass(frozen=True)
class VLLMBenchConfig:
    concurrency: tuple[int, ...] = (1, 4, 16)
    max_tokens: int = 64
    k: int = 5


def vllm_throughput(config: VLLMBenchConfig = VLLMBenchConfig()) -> list[dict]:
    """Output tokens/s of vLLM servers (EAGLE 3.1, EAGLE 3, none) at each concurrency, greedy.
    The servers run side by side; at each concurrency level they are measured one after another."""
    from concurrent.futures import ThreadPoolExecutor

    from playground.eagle.prompts import conversation
    from playground.engines.backends import vllm_backend

    reference = ReferenceEngine.load()
    engine, launched = vllm_backend(reference, [], launch=True, k=config.k, names=("eagle3.1", "eagle3", "none"),
                                    status=lambda line: print(line, file=sys.stderr))
    rows = []
    try:
        for c in config.concurrency:
            prompts = [conversation(10_000 + i, seed=1)[-1]["content"] for i in range(c)]
            for name in engine.servers:
                def one(prompt: str) -> list:
                    return list(engine.generate(GenerationRequest(prompt=prompt, drafter=name, k=config.k,
                                                                  max_tokens=config.max_tokens)))
                start = time.perf_counter()
                with ThreadPoolExecutor(c) as pool:
                    runs = list(pool.map(one, prompts))
                wall = time.perf_counter() - start
                summaries = [summarize(events) for events in runs]
                tokens = sum(s.tokens for s in summaries)
                rows.append({"concurrency": c, "drafter": name, "tokens": tokens, "seconds": wall,
                             "tokens_per_s": tokens / wall,
                             "tau": sum(s.mean_acceptance_length for s in summaries) / len(summaries)})
    finally:
        launched.stop()
    return rows
