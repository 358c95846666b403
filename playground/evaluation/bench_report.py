"""The prompt suite's report as records: what `bench`'s results.json holds, field by field. `to_json` writes
the file's shape and `from_json` reads it back, files written before a field existed included (the field
reads as its default), so the page's claim, `--k auto` and the report's tables all read one typed value.
A chain-vs-tree row is the same record here and in `bench trees`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from playground.engines.stats import Pooled
from playground.engines.tree import TreeShape
from playground.evaluation.ceiling import Ceiling
from playground.evaluation.drift_signals import SignalRow
from playground.evaluation.tables import read_record

# the suite's report shipped with the app: what the page's claim, its explainer and `--k auto` read
STORED = Path(__file__).resolve().parents[2] / "assets" / "benchmark" / "reference" / "results.json"


@dataclass(frozen=True)
class MethodRow:
    """One method over one category's prompts, against no speculation and transformers' generate."""
    category: str
    method: str
    pooled: Pooled
    speedup_vs_none: float
    vs_generate: float | None            # None where generate did not run (the vLLM backend)
    generate_tokens_per_s: float | None
    decode_speedup_vs_none: float | None = None
    chain_ks: dict[str, int] = field(default_factory=dict)   # k -> the prompts whose chain ran at it (0: plain)

    def to_json(self) -> dict:
        return {"category": self.category, "method": self.method, **self.pooled.to_json(), "chain_ks": self.chain_ks,
                "speedup_vs_none": self.speedup_vs_none, "decode_speedup_vs_none": self.decode_speedup_vs_none,
                "vs_generate": self.vs_generate, "generate_tokens_per_s": self.generate_tokens_per_s}

    @classmethod
    def from_json(cls, row: dict) -> MethodRow:
        return read_record(cls, row, pooled=Pooled.from_json(row))


@dataclass(frozen=True)
class SweepRow:
    """One k of the sweep's drafter, pooled over the swept categories."""
    k: int
    drafter: str
    pooled: Pooled
    speedup_vs_none: float
    vs_generate: float | None

    def to_json(self) -> dict:
        return {"k": self.k, "drafter": self.drafter, **self.pooled.to_json(), "speedup_vs_none": self.speedup_vs_none,
                "vs_generate": self.vs_generate}

    @classmethod
    def from_json(cls, row: dict) -> SweepRow:
        return read_record(cls, row, pooled=Pooled.from_json(row))


@dataclass(frozen=True)
class ChainVsTree:
    """One method's runs (`tree` None: a chain) against its drafter's chain on the same prompts, and against
    no speculation where that was measured. The file repeats `category` as `kind` and tau as `tau`, the names
    `bench trees` results carry."""
    category: str
    drafter: str
    method: str
    tree: TreeShape | None
    pooled: Pooled
    speedup_vs_chain: float
    speedup_vs_none: float | None
    chain_tau: float
    chain_tokens_per_s: float
    chain_verify_ms: float
    chain_draft_ms: float

    @classmethod
    def of(cls, category: str, drafter: str, method: str, tree: TreeShape | None, pooled: Pooled, chain: Pooled,
           none: Pooled | None = None) -> ChainVsTree:
        return cls(category, drafter, method, tree, pooled, pooled.tokens_per_s / chain.tokens_per_s,
                   pooled.tokens_per_s / none.tokens_per_s if none is not None else None,
                   chain.mean_acceptance_length, chain.tokens_per_s, chain.verify_ms, chain.draft_ms)

    def to_json(self) -> dict:
        row = asdict(self)
        row.pop("pooled")
        head = {name: row.pop(name) for name in ("drafter", "method", "tree")}
        return {"category": row.pop("category"), "kind": self.category, **head, **self.pooled.to_json(),
                "tau": self.pooled.mean_acceptance_length, **row}

    @classmethod
    def from_json(cls, row: dict) -> ChainVsTree:
        return read_record(cls, row, pooled=Pooled.from_json(row),
                           tree=TreeShape(**row["tree"]) if row["tree"] else None)


@dataclass(frozen=True)
class Mismatch:
    """A method whose tokens differed from the reference answer's, and where."""
    category: str
    prompt: str
    method: str
    first_differing_token: int


@dataclass(frozen=True)
class BenchReport:
    config: dict                         # the BenchConfig, as asdict writes it
    machine: dict
    rows: list[MethodRow]
    sweep: list[SweepRow]
    trees: list[ChainVsTree]
    signals: list[SignalRow]
    ceiling: Ceiling | None              # the embedded engine's roofline
    lossless: bool
    mismatches: list[Mismatch]
    weights: str | None = None           # the target's weights on the embedded engine (float32 before it was written)
    concurrency: list[dict] | None = None   # vLLM under load (vllm_load.throughput's rows)
    signal_units: int | None = None      # what the signals' intervals resampled (runner.by_unit); prompts before

    @property
    def categories(self) -> list[str]:
        return list(dict.fromkeys(r.category for r in self.rows))

    @property
    def prompts(self) -> int:
        return self.config["per_category"] * len(self.categories)

    def row(self, category: str, method: str) -> MethodRow:
        return next(r for r in self.rows if (r.category, r.method) == (category, method))

    def of_method(self, method: str) -> list[MethodRow]:
        return [r for r in self.rows if r.method == method]

    def to_json(self) -> dict:
        out = {"config": self.config, "machine": self.machine, "rows": [r.to_json() for r in self.rows],
               "sweep": [s.to_json() for s in self.sweep], "trees": [t.to_json() for t in self.trees],
               "signals": [asdict(s) for s in self.signals],
               "ceiling": self.ceiling.to_json() if self.ceiling is not None else None,
               "lossless": self.lossless, "mismatches": [asdict(m) for m in self.mismatches]}
        extra = {"weights": self.weights, "concurrency": self.concurrency, "signal_units": self.signal_units}
        return out | {name: value for name, value in extra.items() if value is not None}

    @classmethod
    def from_json(cls, res: dict) -> BenchReport:
        return cls(res["config"], res["machine"], [MethodRow.from_json(r) for r in res["rows"]],
                   [SweepRow.from_json(s) for s in res["sweep"]], [ChainVsTree.from_json(t) for t in res.get("trees", [])],
                   [SignalRow.from_json(s) for s in res.get("signals", [])],
                   Ceiling.from_json(res["ceiling"]) if res.get("ceiling") else None, res["lossless"],
                   [Mismatch(**m) for m in res["mismatches"]], res.get("weights"), res.get("concurrency"),
                   res.get("signal_units"))
