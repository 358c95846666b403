"""The page's explainer: explainer.md with the drift that the stored benchmark measured filled in."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import NamedTuple, TypeVar
from pathlib import Path
from string import Template

from playground.engines.quantities import FED_BACK_RMS, OWN_DRAFT_ATTENTION, SINK_ATTENTION
from playground.engines.stats import RunSummary, tokens_per_pass
from playground.evaluation.bench_report import STORED as STORED_RESULTS, BenchReport
from playground.evaluation.machine import cpu_label, described
from playground.studies.draft_stop_report import DraftStopReport
from playground.studies.rejection_report import RejectionReport
from playground.model.variants import EAGLE3, EAGLE31, LABELS
from playground.ui import first_screen

STORED_REJECTION = STORED_RESULTS.parents[1] / "rejection" / "results.json"
STORED_DRAFT_STOP = STORED_RESULTS.parents[1] / "draft-stop" / "results.json"
Report = TypeVar("Report")


@functools.lru_cache(maxsize=8)
def stored(path: Path, record: type[Report]) -> Report | None:
    """A report shipped with the app, read once per process as `record` (its from_json); None where it is
    absent. Its readers do not change it."""
    return record.from_json(json.loads(path.read_text())) if path.exists() else None


def stored_bench(path: Path = STORED_RESULTS) -> BenchReport | None:
    return stored(path, BenchReport)


CATEGORY = "chat"


@dataclass(frozen=True)
class DepthProbes:
    """One drafter's probes at depth 1 and at the deepest depth the benchmark drafted."""
    depths: int
    sink_first: float
    sink_last: float
    rms_first: float
    rms_last: float


def stored_probes(results: BenchReport, category: str = CATEGORY) -> dict[str, DepthProbes]:
    """The chain rows of `category` in a benchmark's report, by drafter."""
    probes = {}
    for row in results.rows:
        sink, rms = row.pooled.mean(SINK_ATTENTION), row.pooled.mean(FED_BACK_RMS)
        if row.category == category and sink:
            probes[row.method] = DepthProbes(len(sink), sink[0], sink[-1], rms[0], rms[-1])
    return probes


def trend(first: float, last: float) -> str:
    return "falls" if last < first else "grows" if last > first else "stays"


def measured(probes: dict[str, DepthProbes], k: int, category: str = CATEGORY) -> str:
    """The drift the benchmark measured, in two sentences."""
    old, new = probes[EAGLE3], probes[EAGLE31]
    return (f"Measured here (`python -m playground bench`, {category} prompts, k={k}): EAGLE 3's attention to the "
            f"sink tokens {trend(old.sink_first, old.sink_last)} from {old.sink_first:.3f} at depth 1 to "
            f"{old.sink_last:.3f} at depth {old.depths} while the state it feeds back {trend(old.rms_first, old.rms_last)} "
            f"from RMS "
            f"{old.rms_first:.1f} to {old.rms_last:.1f}; EAGLE 3.1's sink attention {trend(new.sink_first, new.sink_last)} "
            f"from {new.sink_first:.3f} "
            f"to {new.sink_last:.3f} and its fed-back RMS from {new.rms_first:.1f} to {new.rms_last:.1f}.")


def suite_signals(results: BenchReport) -> str:
    """How EAGLE 3.1's attention and fed-back state differ from EAGLE 3's over the whole suite, depth by
    depth, where the paired 95% interval leaves out no difference (the report's `signals`)."""
    rows = [(r, r.difference(EAGLE3, EAGLE31)) for r in results.signals if r.difference(EAGLE3, EAGLE31)]
    if not rows:
        return ""

    def compared(signal: str, what: str) -> str:
        parts = []
        for way, holds in (("more", lambda ci: ci[0] > 0), ("less", lambda ci: ci[1] < 0),
                           ("about as much", lambda ci: ci[0] <= 0 <= ci[1])):
            found = [(r, d) for r, d in rows if r.signal == signal and holds(d.ci)]
            if found:
                changes = ", ".join(f"{d.difference:+.3f}" for _, d in found)
                parts.append(f"{way}{'' if parts else what} at depth{'s' * (len(found) > 1)} "
                             f"{', '.join(str(r.depth) for r, _ in found)}"
                             + ("" if way == "about as much" else f" ({changes})"))
        return ", ".join(parts)

    rms = {r.depth: r.mean for r, _ in rows if r.signal == FED_BACK_RMS.name}
    state = (f"; its fed-back state stays at RMS {min(m[EAGLE31] for m in rms.values()):.1f} to "
             f"{max(m[EAGLE31] for m in rms.values()):.1f} where EAGLE 3's grows from {rms[min(rms)][EAGLE3]:.1f} to "
             f"{rms[max(rms)][EAGLE3]:.1f}") if rms else ""
    return (f"Over the whole suite ({results.prompts} prompts, EAGLE 3.1 against EAGLE 3 where the paired 95% interval "
            f"leaves out no difference), EAGLE 3.1 puts "
            f"{compared(OWN_DRAFT_ATTENTION.name, ' of its attention on its own drafts')}; "
            f"{compared(SINK_ATTENTION.name, ' on the sink tokens')}{state}.")


@dataclass(frozen=True)
class SuiteFigures:
    """What the stored suite measured of the switches, for the page's claim and the explainer's headline."""
    prompts: int
    rms31: tuple[float, float]          # EAGLE 3.1's fed-back RMS, lowest and highest over the depths
    rms3: tuple[float, float]           # EAGLE 3's, at depth 1 and at the deepest
    per_pass: dict[str, float]          # tokens per target pass by drafter
    more_own: tuple[int, ...]           # depths where EAGLE 3.1 attends more to its own drafts (interval above 0)
    own_depths: int                     # depths with own drafts to attend to (all but the first)
    deepest: int
    own_deepest: dict[str, float]       # own-draft attention at the deepest depth, by drafter
    speedups: dict[str, tuple[float, float]]   # the range over categories of the speed-up over no speculation


def suite_figures(results: BenchReport) -> SuiteFigures | None:
    rms = {r.depth: r.mean for r in results.signals if r.signal == FED_BACK_RMS.name}
    own = {r.depth: r for r in results.signals if r.signal == OWN_DRAFT_ATTENTION.name}
    if not rms or not own:
        return None
    per_pass = {}
    for method in (EAGLE3, EAGLE31):
        drafted = [r.pooled for r in results.of_method(method)]
        per_pass[method] = tokens_per_pass(sum(p.tokens - p.runs for p in drafted), sum(p.steps for p in drafted))
    return SuiteFigures(
        prompts=results.prompts,
        rms31=(min(m[EAGLE31] for m in rms.values()), max(m[EAGLE31] for m in rms.values())),
        rms3=(rms[min(rms)][EAGLE3], rms[max(rms)][EAGLE3]), per_pass=per_pass,
        more_own=tuple(d for d, r in sorted(own.items()) if r.difference(EAGLE3, EAGLE31).ci[0] > 0),
        own_depths=len(own), deepest=max(own), own_deepest=own[max(own)].mean, speedups=speedup_ranges(results))


# how the claim names the weights a stored benchmark read (its `weights`; float32 before it had one)
WEIGHT_NAMES = {"f32": "float32 weights", "gguf": "Q4_1 GGUF weights"}


def claim(results: BenchReport) -> str:
    """The page's one-line claim under its title: what the switches change and what they do not, with the
    speed over no speculation, all from the stored suite ("" without one)."""
    f = suite_figures(results)
    if f is None:
        return ""
    not_less = " They do not make it attend less to its own drafts." if f.more_own else ""
    lo, hi = f.speedups[EAGLE31]
    fastest = fastest_k(results)
    at_fastest = (f", {fastest.speedup_vs_none:.2f}x at k={fastest.k}, the fastest on {' and '.join(fastest.categories)}"
                  if fastest and fastest.k != results.config["k"] else "")
    return (f"EAGLE 3.1 is EAGLE 3 with two switches. On SmolLM2-135M, over {f.prompts} stored prompts, they hold "
            f"the drafter's fed-back state at one scale (RMS {f.rms31[0]:.1f}-{f.rms31[1]:.1f}; EAGLE 3's grows "
            f"{f.rms3[0]:.1f} → {f.rms3[1]:.1f}) and give {f.per_pass[EAGLE31]:.2f} tokens per target pass to EAGLE 3's "
            f"{f.per_pass[EAGLE3]:.2f}: {lo:.2f}x to {hi:.2f}x the speed of no speculation at k={results.config['k']}"
            f"{at_fastest} ({cpu_label(results.machine)}, {results.machine['threads']} threads, "
            f"{WEIGHT_NAMES[results.weights or 'f32']}).{not_less}")


class FastestK(NamedTuple):
    k: int
    speedup_vs_none: float
    categories: tuple[str, ...]


def fastest_k(results: BenchReport) -> FastestK | None:
    """EAGLE 3.1's fastest k in the stored benchmark's k sweep, and its speed-up over no speculation there."""
    sweep = [row for row in results.sweep if row.drafter == EAGLE31 and row.speedup_vs_none]
    if not sweep:
        return None
    best = max(sweep, key=lambda row: row.pooled.tokens_per_s)
    return FastestK(best.k, best.speedup_vs_none, tuple(results.config["sweep_categories"]))


def headline(results: BenchReport) -> str:
    """What EAGLE 3.1's switches change on the shipped drafters, and what they do not, over the stored suite:
    the fed-back state's scale, tokens per target pass, and attention to their own drafts."""
    f = suite_figures(results)
    if f is None:
        return ""
    where = "at every depth it drafts after the first" if len(f.more_own) == f.own_depths else \
        f"at depth{'s' * (len(f.more_own) > 1)} {', '.join(map(str, f.more_own))}"
    change = (f"Measured over {f.prompts} stored prompts: EAGLE 3.1's fed-back state stays at RMS {f.rms31[0]:.1f} to "
              f"{f.rms31[1]:.1f} at every depth, where EAGLE 3's grows from {f.rms3[0]:.1f} to {f.rms3[1]:.1f}, and it "
              f"makes {f.per_pass[EAGLE31]:.2f} tokens per target pass to EAGLE 3's {f.per_pass[EAGLE3]:.2f}.")
    if not f.more_own:
        return change
    return (f"{change} It does not attend less to its own drafts: *more* than EAGLE 3, {where} "
            f"({f.own_deepest[EAGLE31]:.2f} against {f.own_deepest[EAGLE3]:.2f} at depth {f.deepest}, the dotted lines).")


def speedup_ranges(results: BenchReport) -> dict[str, tuple[float, float]]:
    """By drafter, the lowest and highest speed-up over no speculation the stored benchmark measured over
    its categories."""
    by_method: dict[str, list[float]] = {}
    for row in results.rows:
        if row.method in (EAGLE3, EAGLE31) and row.speedup_vs_none:
            by_method.setdefault(row.method, []).append(row.speedup_vs_none)
    return {method: (min(v), max(v)) for method, v in sorted(by_method.items())}


def stored_speedups(results: BenchReport) -> str:
    """The range of speedups over no speculation the stored benchmark measured, by drafter, in a sentence."""
    ranges = ", ".join(f"{LABELS[m]} {lo:.2f}x to {hi:.2f}x" for m, (lo, hi) in speedup_ranges(results).items())
    return (f"The stored benchmark measured, over its {len(results.categories)} prompt categories, the speed without "
            f"speculation times {ranges} ({described(results.machine)}).") if ranges else ""


def own_drafts(runs: dict[str, RunSummary]) -> str:
    """What the Playground's first screen shows of the drafters' attention to their own drafts."""
    deepest = {name: s.mean(OWN_DRAFT_ATTENTION)[-1] for name, s in runs.items() if s.mean(OWN_DRAFT_ATTENTION)}
    if set(deepest) != {EAGLE3, EAGLE31}:
        return ""
    more = EAGLE31 if deepest[EAGLE31] > deepest[EAGLE3] else EAGLE3
    less = EAGLE3 if more == EAGLE31 else EAGLE31
    depth = len(runs[more].mean(OWN_DRAFT_ATTENTION))
    lead = "Not all of it holds on our drafters:" if more == EAGLE31 else "As the paper says,"
    return (f"{lead} on the Playground's coding example {LABELS[more]} attends more to its own drafts than "
            f"{LABELS[less]} ({deepest[more]:.2f} against {deepest[less]:.2f} of its attention at depth {depth}, the "
            "dotted lines).")


def rejection(report: RejectionReport) -> str:
    """What predicts a rejected draft, from `python -m playground bench rejection`'s report."""
    probability = [r.auc for part in report.drafters.values() for r in part.by_depth if r.signal == "probability"]
    gains = " and ".join(f"{signed(part.added_value.gain)} for {LABELS[name]}" for name, part in report.drafters.items())
    return (f"Draft by draft (`python -m playground bench rejection`, {report.prompts} prompts), the drafter's "
            f"own probability tells which drafts the target rejects (AUC {min(probability):.2f} to "
            f"{max(probability):.2f} by depth), while sink attention, own-draft attention and fed-back RMS add nothing "
            f"to it (added to a model of probability and depth, they change its AUC by {gains}): here drift shows in "
            "the averages by depth, not as a warning on one draft.")


def draft_stop(result: DraftStopReport) -> str:
    """What a chain that stops at a probability rule gained, from `python -m playground bench draft-stop`'s
    report: EAGLE 3.1 on the chat sample, against fixed k=5 and the fastest fixed k."""
    rows = [r for r in result.evaluation if r.prompt_set == "chat sample" and r.drafter == EAGLE31]
    ruled = next((r for r in rows if (r.rule or "").startswith("probability<")), None)
    fixed = [r for r in rows if r.rule is None and r.method == f"k={r.k}"]
    if ruled is None or not fixed:
        return ""
    best = max(fixed, key=lambda r: r.speedup_vs_k5)
    beside = (f"fixed {best.method} runs faster still ({best.speedup_vs_k5:.2f}x)"
              if best.speedup_vs_k5 > ruled.speedup_vs_k5 else
              f"faster than every fixed k (the fastest, {best.method}, {best.speedup_vs_k5:.2f}x)")
    return (f"Acting on it, a chain that stops before a draft of probability below "
            f"{ruled.rule.partition('<')[2]} (chosen on held-out prompts: `python -m playground bench draft-stop`) "
            f"runs {LABELS[EAGLE31]} at {ruled.speedup_vs_k5:.2f}x fixed k=5's tokens/s on the chat sample; "
            f"{beside} ({described(result.machine)}).")


def signed(value: float) -> str:
    text = f"{value:+.3f}"
    return "0.000" if text in ("+0.000", "-0.000") else text


def explainer_markdown(results_path: Path = STORED_RESULTS, rejection_path: Path = STORED_REJECTION,
                       draft_stop_path: Path = STORED_DRAFT_STOP) -> str:
    text = Template(Path(__file__).with_name("explainer.md").read_text())
    first = first_screen.load()
    stops = stored(draft_stop_path, DraftStopReport)
    acting = draft_stop(stops) if stops else ""
    verdicts = stored(rejection_path, RejectionReport)
    parts = {"own_drafts": own_drafts({name: run.summary for name, run in first[0].items()}) if first else "",
             "rejection": f"{rejection(verdicts)} {acting}".strip() if verdicts else ""}
    results = stored_bench(results_path)
    if results is None:
        return text.substitute(measured="Run `python -m playground bench` to measure it on this machine.",
                               headline="What the switches change on this machine's drafters, "
                                        "`python -m playground bench` measures.", **parts)
    return text.substitute(measured=measured(stored_probes(results), results.config["k"]) + " "
                           + suite_signals(results), headline=headline(results), **parts)
