"""Chains against draft trees on this machine: tau, tokens/s and the time of a step's draft and
verify, for both drafters, and a sweep of tree shapes for EAGLE 3.1 on held-out chat and code.

    python -m playground bench trees [--drafters ...] [--k 5] [--tree --tree-top-k 4 ...] [--prompts 6]

Every method answers the same prompts, one prompt at a time and method after method, so the
machine's drift falls on all of them alike; tokens/s is engine time (waits excluded), greedy.
A chain-vs-tree row (`chain_vs_tree_row`) and its table (`chain_vs_tree_table`) are the same here
and in the prompt suite's report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from playground.engines.reference import ReferenceEngine
from playground.engines.stats import Pooled
from playground.engines.tree import TreeShape
from playground.evaluation import runner
from playground.evaluation.heldout import kind_prompts
from playground.evaluation.machine import described, machine
from playground.evaluation.runner import Method
from playground.evaluation.tables import markdown_table, write_results
from playground.model.variants import EAGLE3, EAGLE31, SEPARATOR
from playground.prompts.sets import EVAL_KINDS

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


def chain_vs_tree_row(category: str, drafter: str, method: str, tree: TreeShape | None, pooled: Pooled,
                      chain: Pooled, none: Pooled | None = None) -> dict:
    """One method's runs (`tree` None: a chain) against its drafter's chain on the same prompts,
    and against no speculation where `none` was measured. `kind` and `tau` repeat `category` and
    `mean_acceptance_length` under the names that `bench trees` results carry."""
    return {"category": category, "kind": category, "drafter": drafter, "method": method,
            "tree": asdict(tree) if tree is not None else None, **pooled.to_json(),
            "tau": pooled.mean_acceptance_length,
            "speedup_vs_chain": pooled.tokens_per_s / chain.tokens_per_s,
            "speedup_vs_none": pooled.tokens_per_s / none.tokens_per_s if none is not None else None,
            "chain_tau": chain.mean_acceptance_length, "chain_tokens_per_s": chain.tokens_per_s,
            "chain_verify_ms": chain.verify_ms, "chain_draft_ms": chain.draft_ms}


def chain_vs_tree_table(rows: list[dict]) -> str:
    """The markdown table of chain_vs_tree_row rows: each method beside its drafter's chain (a run
    named "<drafter> · <how>" shows as its how)."""
    head = ["category", "drafter", "method (tree: top-k/depth/nodes)", "chain tau", "tau", "chain tok/s", "tok/s",
            "vs chain", "chain draft ms/step", "draft ms/step", "chain verify ms/step", "verify ms/step"]
    return markdown_table(head, ([r["category"], r["drafter"], r["method"].partition(SEPARATOR)[2] or r["method"],
                                  f"{r['chain_tau']:.2f}", f"{r['mean_acceptance_length']:.2f}",
                                  f"{r['chain_tokens_per_s']:.1f}", f"{r['tokens_per_s']:.1f}",
                                  f"{r['speedup_vs_chain']:.2f}x", f"{r['chain_draft_ms']:.1f}", f"{r['draft_ms']:.1f}",
                                  f"{r['chain_verify_ms']:.1f}", f"{r['verify_ms']:.1f}"] for r in rows))


def label(shape: TreeShape | None, k: int) -> str:
    return f"chain k={k}" if shape is None else str(shape)


def run_methods(engine, drafter: str, kind: str, shapes: list[TreeShape | None], config: TreeBenchConfig
                ) -> dict[TreeShape | None, Pooled]:
    """Each shape (None: the chain) pooled over the kind's first prompts, methods interleaved."""
    methods = [Method(label(shape, config.k), drafter, config.k, shape) for shape in shapes]
    measured = [u.result for u in runner.measure(engine, kind_prompts(kind, config.prompts), methods,
                                                 config.max_tokens) if u.result]
    return {m.tree: Pooled.of([r.runs[m.name] for r in measured]) for m in methods}


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


def _rows(kind: str, drafter: str, pooled: dict[TreeShape | None, Pooled], config: TreeBenchConfig) -> list[dict]:
    return [chain_vs_tree_row(kind, drafter, label(shape, config.k), shape, p, pooled[None])
            for shape, p in pooled.items()]


def markdown(result: dict) -> str:
    host = f"{described(result['machine'])}\n\n" if "machine" in result else ""
    return (f"{host}### Chain against tree\n\n{chain_vs_tree_table(result['compare'])}\n\n"
            f"### Tree shapes\n\n{chain_vs_tree_table(result['sweep'])}\n")


def run(config: TreeBenchConfig, out: Path) -> tuple[dict, list[Path]]:
    """Measure on the embedded engine; write results.json and results.md to `out`."""
    result = {**measure(ReferenceEngine.load(), config), "machine": machine()}
    return result, write_results(out, result, markdown(result))
