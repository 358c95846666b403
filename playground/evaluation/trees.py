"""Chains against draft trees on this machine: tau, tokens/s and the time of a step's draft and
verify, for both drafters, and a sweep of tree shapes for EAGLE 3.1 on held-out chat and code.

    python -m playground bench trees [--drafters ...] [--k 5] [--tree --tree-top-k 4 ...] [--prompts 6]

Every method answers the same prompts, one prompt at a time and method after method, so the
machine's drift falls on all of them alike; tokens/s is engine time (waits excluded), greedy.
A chain-vs-tree row (bench_report.ChainVsTree) and its table (`chain_vs_tree_table`) are the same here
and in the prompt suite's report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from playground.engines.reference import ReferenceEngine
from playground.engines.stats import Pooled
from playground.engines.tree import TreeShape
from playground.evaluation import runner
from playground.evaluation.bench_report import ChainVsTree
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


def chain_vs_tree_table(rows: list[ChainVsTree]) -> str:
    """The markdown table of chain-vs-tree rows: each method beside its drafter's chain (a run named
    "<drafter> · <how>" shows as its how)."""
    head = ["category", "drafter", "method (tree: top-k/depth/nodes)", "chain tau", "tau", "chain tok/s", "tok/s",
            "vs chain", "chain draft ms/step", "draft ms/step", "chain verify ms/step", "verify ms/step"]
    return markdown_table(head, ([r.category, r.drafter, r.method.partition(SEPARATOR)[2] or r.method,
                                  f"{r.chain_tau:.2f}", f"{r.pooled.mean_acceptance_length:.2f}",
                                  f"{r.chain_tokens_per_s:.1f}", f"{r.pooled.tokens_per_s:.1f}",
                                  f"{r.speedup_vs_chain:.2f}x", f"{r.chain_draft_ms:.1f}", f"{r.pooled.draft_ms:.1f}",
                                  f"{r.chain_verify_ms:.1f}", f"{r.pooled.verify_ms:.1f}"] for r in rows))


def label(shape: TreeShape | None, k: int) -> str:
    return f"chain k={k}" if shape is None else str(shape)


def run_methods(engine, drafter: str, kind: str, shapes: list[TreeShape | None], config: TreeBenchConfig
                ) -> dict[TreeShape | None, Pooled]:
    """Each shape (None: the chain) pooled over the kind's first prompts, methods interleaved."""
    methods = [Method(label(shape, config.k), drafter, config.k, shape) for shape in shapes]
    measured = [u.result for u in runner.measure(engine, kind_prompts(kind, config.prompts), methods,
                                                 config.max_tokens) if u.result]
    return {m.tree: Pooled.of([r.runs[m.name] for r in measured]) for m in methods}


@dataclass(frozen=True)
class TreeBench:
    """The chain against the tree for each drafter and kind, and the last drafter's chain against each shape."""
    compare: list[ChainVsTree]
    sweep: list[ChainVsTree]
    machine: dict | None = None

    def to_json(self) -> dict:
        rows = {"compare": [r.to_json() for r in self.compare], "sweep": [r.to_json() for r in self.sweep]}
        return rows | ({"machine": self.machine} if self.machine is not None else {})

    @classmethod
    def from_json(cls, result: dict) -> TreeBench:
        return cls([ChainVsTree.from_json(r) for r in result["compare"]],
                   [ChainVsTree.from_json(r) for r in result["sweep"]], result.get("machine"))


def measure(engine, config: TreeBenchConfig = TreeBenchConfig()) -> TreeBench:
    compare, sweep = [], []
    for kind in config.kinds:
        for drafter in config.drafters:
            pooled = run_methods(engine, drafter, kind, [None, config.tree], config)
            compare += _rows(kind, drafter, pooled, config)
        pooled = run_methods(engine, config.drafters[-1], kind, [None, *config.shapes], config)
        sweep += _rows(kind, config.drafters[-1], pooled, config)
    return TreeBench(compare, sweep)


def _rows(kind: str, drafter: str, pooled: dict[TreeShape | None, Pooled], config: TreeBenchConfig
          ) -> list[ChainVsTree]:
    return [ChainVsTree.of(kind, drafter, label(shape, config.k), shape, p, pooled[None]) for shape, p in pooled.items()]


def markdown(result: TreeBench) -> str:
    host = f"{described(result.machine)}\n\n" if result.machine is not None else ""
    return (f"{host}### Chain against tree\n\n{chain_vs_tree_table(result.compare)}\n\n"
            f"### Tree shapes\n\n{chain_vs_tree_table(result.sweep)}\n")


def run(config: TreeBenchConfig, out: Path) -> tuple[TreeBench, list[Path]]:
    """Measure on the embedded engine; write results.json and results.md to `out`."""
    result = replace(measure(ReferenceEngine.load(), config), machine=machine())
    return result, write_results(out, result.to_json(), markdown(result))
