"""The drift signals by draft depth over many prompts (quantities.DEPTH_QUANTITIES: each drafter's attention
on the sink tokens, on its own drafts and on the rest of the context, and its fed-back RMS), with 95%
bootstrap intervals over prompts, and each later drafter's paired difference from the first (a resample
draws the same prompts for both drafters, so what the prompts share cancels out). The prompt study and
the suite report them alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from playground.engines.intervals import Statistic, value_of
from playground.engines.quantities import BY_NAME, DEPTH_QUANTITIES
from playground.engines.stats import depth_mean_of
from playground.evaluation.runner import PromptResult
from playground.plots import label

SIGNALS = {q.name: q.label for q in DEPTH_QUANTITIES}
Interval = Callable[[Statistic, int], "tuple[float, float] | None"]   # None: a report without intervals


@dataclass(frozen=True)
class Difference:
    """Drafter b's mean less drafter a's, with its paired interval."""
    a: str
    b: str
    difference: float
    ci: list[float] | None


@dataclass(frozen=True)
class SignalRow:
    """One signal at one draft depth over the prompts: each drafter's mean and interval (a drafter that
    measured the signal at no step of the depth has none), and each later drafter against the first."""
    signal: str
    depth: int
    mean: dict[str, float]
    ci: dict[str, list[float] | None]
    differences: list[Difference]

    def difference(self, a: str, b: str) -> Difference | None:
        return next((d for d in self.differences if (d.a, d.b) == (a, b)), None)

    @classmethod
    def from_json(cls, row: dict) -> SignalRow:
        return cls(row["signal"], row["depth"], row["mean"], row["ci"], [Difference(**d) for d in row["differences"]])


def by_depth(ran: Sequence[PromptResult], drafters: Sequence[str], interval: Interval) -> list[SignalRow]:
    """A row per signal and depth; own-draft attention has no row at depth 1 (there are no drafts before it)."""
    units, rows, first = len(ran), [], drafters[0]
    for quantity in DEPTH_QUANTITIES:
        signal = quantity.name
        parts = {m: [r.runs[m].depths[signal] for r in ran] for m in drafters}
        depths = max((len(p.counts) for ps in parts.values() for p in ps), default=0)
        for depth in range(quantity.first_depth, depths + 1):
            means = {m: depth_mean_of(ps, depth) for m, ps in parts.items()
                     if any(len(p.counts) >= depth and p.counts[depth - 1] for p in ps)}
            if not means:
                continue
            mean = {m: value_of(f, units) for m, f in means.items()}
            differences = [Difference(first, other, mean[other] - mean[first],
                                      listed(interval(lambda idx, a=means[first], b=means[other]: b(idx) - a(idx),
                                                      units)))
                           for other in drafters[1:] if other in means and first in means]
            rows.append(SignalRow(signal, depth, mean, {m: listed(interval(f, units)) for m, f in means.items()},
                                  differences))
    return rows


def resampled(units: int, measured: int) -> str:
    """What intervals over `units` (runner.by_unit) of `measured` prompts resampled."""
    if not 0 < units < measured:
        return "prompts"
    return f"{units} units: each document's prompts together, every other prompt alone"


def table(rows: list[SignalRow], over: str = "prompts") -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows) of the signals: a row per signal and depth, a column per drafter and pair; `over`
    says what the intervals resampled."""
    drafters = list(dict.fromkeys(m for row in rows for m in row.mean))
    pairs = list(dict.fromkeys((d.a, d.b) for row in rows for d in row.differences))
    cells = []
    for row in rows:
        digits = BY_NAME[row.signal].digits
        found = {(d.a, d.b): d for d in row.differences}
        cells.append([SIGNALS[row.signal], str(row.depth),
                      *(_value(row.mean[m], row.ci[m], digits, False) if m in row.mean else "–" for m in drafters),
                      *(_value(found[p].difference, found[p].ci, digits, True) if p in found else "–"
                        for p in pairs)])
    return (f"Drift signals by depth (95% CI over {over})",
            ["signal", "depth", *map(label, drafters), *(f"{label(b)} − {label(a)}" for a, b in pairs)], cells)


def _value(value: float, ci: list[float] | None, digits: int, signed: bool) -> str:
    shown = lambda x: f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
    between = " to " if signed else "–"   # a dash between two signed numbers reads as a minus
    return f"{shown(value)} (" + ("…" if ci is None else f"{shown(ci[0])}{between}{shown(ci[1])}") + ")"


def listed(interval: tuple[float, float] | None) -> list[float] | None:
    """An interval as a report's JSON holds it (None: a report without intervals)."""
    return None if interval is None else list(interval)
