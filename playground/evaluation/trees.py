"""Chains against draft trees on this machine: tau, tokens/s and the time of a step's draft and
verify, for both drafters, and a sweep of tree shapes for EAGLE 3.1 on held-out chat and code.

Every method answers the same prompts, one prompt at a time and method after method, so the
machine's drift falls on all of them alike; tokens/s is engine time (waits excluded), greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from playground.engines.stats import Pooled, pool
from playground.engines.tree import TreeShape
from playground.evaluation.heldout import eval_requests
from playground.evaluation.prompt_sets import EVAL_KINDS
from playground.model.variants import EAGLE3, EAGLE31

SHAPES = (TreeShape(2, 4, 8), TreeShape(3, 5, 12), TreeShape(4, 5, 16), TreeShape(4, 6, 24), TreeShape(6, 6, 32),
          TreeShape(8, 6, 48))


@dataclass(frozen=True)
class TreeBenchConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)
    kinds: tuple[str, ...] = (EVAL_KINDS["chat"], EVAL_KINDS["code"])
    k: int = 5                                 # the chain's drafts per step
    tree: TreeShape = TreeShape()              # the tree set against the chain
    shapes: tuple[TreeShape, ...] = SHAPES     # swept for the last drafter
    prompts: int = 6                           # per kind
    max_tokens: int = 96


def label(shape: TreeShape | None, k: int) -> str:
    return f"chain k={k}" if shape is None else str(shape)


def run_methods(engine, drafter: str, kind: str, methods: list[TreeShape | None], config: TreeBenchConfig
                ) -> dict[str, Pooled]:
    """Each method (None: the chain) pooled over the kind's first prompts, methods interleaved."""
    runs: dict[str, list] = {label(m, config.k): [] for m in methods}
    for request in eval_requests(kind, drafter, config.k, config.max_tokens)[:config.prompts]:
        for method in methods:
            runs[label(method, config.k)].append(list(engine.generate(replace(request, tree=method))))
    return {name: pool(r) for name, r in runs.items()}


def measure(engine, config: TreeBenchConfig = TreeBenchConfig()) -> dict:
    """{"compare": rows for chain vs the tree per drafter and kind, "sweep": rows per shape}."""
    compare, sweep = [], []
    for kind in config.kinds:
        for drafter in config.drafters:
            pooled = run_methods(engine, drafter, kind, [None, config.tree], config)
            compare += _rows(kind, drafter, pooled, config)
        pooled = run_methods(engine, config.drafters[-1], kind, [None, *config.shapes], config)
        sweep += _rows(kind, config.drafters[-1], pooled, config)
    return {"compare": compare, "sweep": sweep}


def _rows(kind: str, drafter: str, pooled: dict[str, Pooled], config: TreeBenchConfig) -> list[dict]:
    chain = pooled[label(None, config.k)]
    return [{"kind": kind, "drafter": drafter, "method": name, "tau": p.mean_acceptance_length,
             "tokens_per_s": p.tokens_per_s, "speedup_vs_chain": p.tokens_per_s / chain.tokens_per_s,
             "draft_ms": p.draft_ms, "verify_ms": p.verify_ms, "steps": p.steps, "tokens": p.tokens}
            for name, p in pooled.items()]


def markdown(result: dict) -> str:
    head = ("| kind | drafter | method (top-k/depth/nodes) | tau | tok/s | vs chain | draft ms/step | verify ms/step |\n"
            "|---|---|---|---:|---:|---:|---:|---:|")
    table = lambda rows: "\n".join([head] + [
        f"| {r['kind']} | {r['drafter']} | {r['method']} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | "
        f"{r['speedup_vs_chain']:.2f}x | {r['draft_ms']:.1f} | {r['verify_ms']:.1f} |" for r in rows])
    return (f"### Chain against tree\n\n{table(result['compare'])}\n\n"
            f"### Tree shapes\n\n{table(result['sweep'])}\n")
