"""A prompt study's report as records: what results.json holds, field by field. `to_json` writes the
file's shape and `from_json` reads it back, so a report reloaded from its file draws the same tables and
figures. Intervals are [low, high] lists, None while a report is interim (the bootstrap not yet run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from playground.engines.quantities import DEPTH_QUANTITIES, DepthQuantity
from playground.evaluation.drift_signals import SignalRow

Interval = list[float] | None


@dataclass(frozen=True)
class Speedups:
    """A method's tokens/s over no speculation's, whole runs and decode phases, paired by prompt."""
    speedup_vs_none: float
    speedup_ci: Interval
    decode_speedup_vs_none: float
    decode_speedup_ci: Interval


@dataclass(frozen=True)
class PooledMethod:
    """One method over every measured prompt. A MeasuredByDepth (plots.py): the figures read its means."""
    method: str
    prompts: int
    tokens: int
    seconds: float
    mean_acceptance_length: float
    tau_ci: Interval
    tokens_per_pass: float
    tokens_per_pass_ci: Interval
    acceptance: list[float]
    by_depth: dict[str, list[float]]     # each depth quantity's means, under its name (the file's fields)
    tokens_per_s: float
    decode_tokens_per_s: float
    speedups: Speedups | None = None     # None without a `none` run to compare with, and for `none` itself

    def mean(self, quantity: DepthQuantity) -> tuple[float, ...]:
        return tuple(self.by_depth.get(quantity.name) or ())

    def samples_of(self, quantity: DepthQuantity) -> None:
        return None

    def to_json(self) -> dict:
        """Its fields in order, each depth quantity's means where `by_depth` stands and the speed-ups last."""
        row = asdict(self)
        by_depth, speedups = row.pop("by_depth"), row.pop("speedups")
        tail = {name: row.pop(name) for name in ("tokens_per_s", "decode_tokens_per_s")}
        return row | by_depth | tail | (speedups or {})

    @classmethod
    def from_json(cls, row: dict) -> PooledMethod:
        flat = [f.name for f in fields(cls) if f.name not in ("by_depth", "speedups")]
        speedups = Speedups(**{f.name: row[f.name] for f in fields(Speedups)}) if "speedup_vs_none" in row else None
        return cls(**{name: row[name] for name in flat}, speedups=speedups,
                   by_depth={q.name: row[q.name] for q in DEPTH_QUANTITIES if q.name in row})


@dataclass(frozen=True)
class PairedRatio:
    """Method a over method b, paired by prompt: tau, and tokens per target pass."""
    a: str
    b: str
    tau_ratio: float
    ci: Interval
    per_pass_ratio: float
    per_pass_ci: Interval


@dataclass(frozen=True)
class PromptGroup:
    """The prompts of one length bin or category, each drafting method pooled over them."""
    group: str
    prompts: int
    min_prompt_tokens: int
    max_prompt_tokens: int
    tau: dict[str, float]
    tau_ci: dict[str, Interval]
    tokens_per_pass: dict[str, float]
    tokens_per_pass_ci: dict[str, Interval]


@dataclass(frozen=True)
class PromptGain:
    """One prompt under the two drafters compared: tau by drafter (the file writes each under its name)."""
    id: str
    index: int
    category: str | None
    prompt_tokens: int
    preview: str
    tau: dict[str, float]
    difference: float
    tokens_per_pass: dict[str, float]
    per_pass_difference: float

    def to_json(self) -> dict:
        row = asdict(self)
        return {**{k: row[k] for k in ("id", "index", "category", "prompt_tokens", "preview")}, **row.pop("tau"),
                **{k: row[k] for k in ("difference", "tokens_per_pass", "per_pass_difference")}}

    @classmethod
    def from_json(cls, row: dict) -> PromptGain:
        drafters = list(row["tokens_per_pass"])
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name != "tau"}, tau={d: row[d] for d in drafters})


@dataclass(frozen=True)
class Gains:
    """Where `better`'s tokens per target pass most exceed `than`'s, and where they fall most short."""
    better: str
    than: str
    most: list[PromptGain]
    least: list[PromptGain]

    def to_json(self) -> dict:
        return {"better": self.better, "than": self.than, "most": [g.to_json() for g in self.most],
                "least": [g.to_json() for g in self.least]}

    @classmethod
    def from_json(cls, row: dict) -> Gains | None:
        if not row:
            return None
        return cls(row["better"], row["than"], *([PromptGain.from_json(g) for g in row[which]]
                                                 for which in ("most", "least")))


@dataclass(frozen=True)
class MethodRun:
    """One method's run of one prompt."""
    mean_acceptance_length: float
    tokens_per_pass: float
    verify_steps: int
    tokens: int
    seconds: float
    decode_tokens: int
    decode_seconds: float
    accepted: int
    drafting_steps: int


@dataclass(frozen=True)
class PromptRow:
    index: int
    id: str
    category: str | None
    prompt_tokens: int
    preview: str
    skipped: str | None                  # why the prompt was not run; None where it was
    runs: dict[str, MethodRun]

    @classmethod
    def from_json(cls, row: dict) -> PromptRow:
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name != "runs"},
                   runs={m: MethodRun(**run) for m, run in row["runs"].items()})


@dataclass(frozen=True)
class Mismatch:
    id: str
    method: str
    first_differing_token: int


@dataclass(frozen=True)
class Source:
    file: str
    format: str
    prompts: int
    measured: int
    skipped: int
    units: int = 0      # what the intervals resample: each document the prompts name, and every other prompt


@dataclass(frozen=True)
class StudyReport:
    config: dict                         # the StudyConfig, as asdict writes it
    source: Source
    machine: dict
    pooled: list[PooledMethod]
    ratios: list[PairedRatio]
    signals: list[SignalRow]
    by_length: list[PromptGroup]
    by_category: list[PromptGroup]
    gains: Gains | None
    prompts: list[PromptRow]
    lossless: bool
    mismatches: list[Mismatch]

    def to_json(self) -> dict:
        return {"config": self.config, "source": asdict(self.source), "machine": self.machine,
                "pooled": [p.to_json() for p in self.pooled], "ratios": [asdict(r) for r in self.ratios],
                "signals": [asdict(s) for s in self.signals], "by_length": [asdict(g) for g in self.by_length],
                "by_category": [asdict(g) for g in self.by_category],
                "gains": self.gains.to_json() if self.gains else {}, "prompts": [asdict(p) for p in self.prompts],
                "lossless": self.lossless, "mismatches": [asdict(m) for m in self.mismatches]}

    @classmethod
    def from_json(cls, res: dict) -> StudyReport:
        return cls(res["config"], Source(**res["source"]), res["machine"],
                   [PooledMethod.from_json(p) for p in res["pooled"]], [PairedRatio(**r) for r in res["ratios"]],
                   [SignalRow.from_json(s) for s in res["signals"]], [PromptGroup(**g) for g in res["by_length"]],
                   [PromptGroup(**g) for g in res["by_category"]], Gains.from_json(res["gains"]),
                   [PromptRow.from_json(p) for p in res["prompts"]], res["lossless"],
                   [Mismatch(**m) for m in res["mismatches"]])
