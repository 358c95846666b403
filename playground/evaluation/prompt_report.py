"""The report of a prompt study: each method pooled over your prompts with 95% bootstrap intervals, tokens
per target pass against prompt length and by category, acceptance, sink attention and fed-back RMS by depth, and the
prompts where one drafter gains most over the other; as JSON, markdown, a CSV row per prompt, and one
self-contained HTML file (plotly.js inlined, so that it opens offline wherever it is sent). `run` runs a
study (prompt_study's configuration, evaluation.runner's checkpointed runs) and writes its report.

Intervals resample prompts (with replacement): a prompt's steps are not independent of each other; prompts
that name one document are resampled together (a cluster bootstrap), since neither are they.
Ratios between methods are paired: a resample draws the same prompts for both.
Tokens per target pass (tokens after the prefill / verify steps) is the figure each table leads with;
tau (vLLM's mean acceptance length, 1 + accepted / steps that drafted) stays beside it under its own name.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from html import escape
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go

from playground import plots
from playground.engines.protocol import Engine
from playground.engines.intervals import bootstrap_interval, paired_ratio, rate_of, tau_of, value_of
from playground.engines.quantities import DEPTH_QUANTITIES, FED_BACK_RMS, SINK_ATTENTION
from playground.engines.stats import Pooled, RunTotals, pooled_tau, rate_of_runs
from playground.evaluation import drift_signals, runner
from playground.evaluation.machine import described, machine
from playground.evaluation.prompt_study import StudyConfig, study_key
from playground.evaluation.runner import PromptResult
from playground.evaluation.study_report import (Gains, Mismatch, MethodRun, PairedRatio, PooledMethod, PromptGain,
                                                PromptGroup, PromptRow, Source, Speedups, StudyReport)
from playground.evaluation.tables import markdown_table, with_interval
from playground.model.variants import NONE
from playground.plots import label
from playground.prompts.files import PromptFile, UserPrompt

LENGTH_EDGES = (0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
GAINS_SHOWN = 5
PREVIEW_CHARS = 80


def results(config: StudyConfig, prompts: PromptFile, source: str, measured: Sequence[PromptResult],
            intervals: bool = True) -> StudyReport:
    """The report of the measured prompts. Without `intervals` (a report while prompts still run, for
    the page) every interval is None: the bootstrap is the one costly part."""
    interval = bootstrap_interval if intervals else lambda statistic, units: None
    ratio = paired_ratio if intervals else lambda a, b, units: (value_of(lambda idx: a(idx) / b(idx), units), None)
    measured = sorted(measured, key=lambda r: r.index)
    ran = [r for r in measured if r.skipped is None]
    units = runner.by_unit(ran)
    how = config.methods()
    methods = [m.name for m in how]
    drafting = [m.name for m in how if m.drafter != NONE]
    chains = [m.name for m in how if m.drafter != NONE and m.tree is None]
    text = prompts.prompts
    return StudyReport(
        config=asdict(config),
        source=Source(source, prompts.format, len(prompts.prompts), len(ran), len(measured) - len(ran), len(units)),
        machine=machine(),
        pooled=[_pooled(m, ran, units, NONE if NONE in methods and m != NONE else None, interval, ratio)
                for m in methods] if ran else [],
        ratios=_ratios(units, chains, config, ratio) if ran else [],
        signals=drift_signals.by_depth(units, chains, interval) if ran else [],
        by_length=sorted(_groups(ran, drafting, _length_bin, interval), key=lambda g: g.min_prompt_tokens),
        by_category=_groups(ran, drafting, lambda r: r.category, interval) if any(r.category for r in ran) else [],
        gains=_gains(ran, chains, text),
        prompts=[_prompt_row(r, text[r.index]) for r in measured],
        lossless=not any(r.mismatches for r in ran),
        mismatches=[Mismatch(r.id, m, d) for r in ran for m, d in r.mismatches],
    )


def _pooled(method: str, ran: list[PromptResult], units: list[PromptResult], baseline: str | None, interval,
            ratio) -> PooledMethod:
    """One method pooled over the prompts `ran`, its intervals over their `units` (runner.by_unit)."""
    runs, unit_runs, n = [r.runs[method] for r in ran], [u.runs[method] for u in units], len(units)
    pooled = Pooled.of(runs)
    speedups = None
    if baseline is not None:
        value, ci = ratio(_rate(units, method), _rate(units, baseline), n)
        decode, decode_ci = ratio(_rate(units, method, decode=True), _rate(units, baseline, decode=True), n)
        speedups = Speedups(value, drift_signals.listed(ci), decode, drift_signals.listed(decode_ci))
    return PooledMethod(
        method, len(runs), pooled.tokens, pooled.seconds, pooled.mean_acceptance_length,
        drift_signals.listed(interval(tau_of([run.counts for run in unit_runs]), n)), pooled.tokens_per_pass,
        drift_signals.listed(interval(per_pass_of(unit_runs), n)), list(pooled.acceptance),
        {q.name: list(pooled.mean(q)) for q in DEPTH_QUANTITIES}, value_of(_rate(ran, method), len(ran)),
        value_of(_rate(ran, method, decode=True), len(ran)), speedups)


def _rate(ran: list[PromptResult], method: str, decode: bool = False):
    """Tokens per second of `method` pooled over the prompts at the given indices; with `decode`, after
    each prompt's prefill step (long prompts' prefill otherwise dominates every method's time alike)."""
    return rate_of_runs([r.runs[method] for r in ran], decode)


def _counts(ran: list[PromptResult], method: str) -> list[tuple[int, int]]:
    return [r.runs[method].counts for r in ran]


def per_pass_of(runs: Sequence[RunTotals]):
    """Tokens per target pass pooled over the runs at the given indices."""
    return rate_of([r.decode_tokens for r in runs], [r.verify_steps for r in runs])


def _per_pass(ran: list[PromptResult], method: str):
    return per_pass_of([r.runs[method] for r in ran])


def _ratios(units: list[PromptResult], chains: list[str], config: StudyConfig, ratio) -> list[PairedRatio]:
    """Each later drafter's tokens per target pass (and tau) over the first one's; each drafter's tree over
    its chain; paired over the units (runner.by_unit)."""
    pairs = [(other, chains[0]) for other in chains[1:]]
    pairs += [(m.name, m.drafter) for m in config.methods() if m.tree is not None]
    rows = []
    for a, b in pairs:
        value, ci = ratio(tau_of(_counts(units, a)), tau_of(_counts(units, b)), len(units))
        per_pass, per_pass_ci = ratio(_per_pass(units, a), _per_pass(units, b), len(units))
        rows.append(PairedRatio(a, b, value, drift_signals.listed(ci), per_pass, drift_signals.listed(per_pass_ci)))
    return rows


def _length_bin(r: PromptResult) -> str:
    low = max(e for e in LENGTH_EDGES if e <= r.prompt_tokens)
    high = min((e for e in LENGTH_EDGES if e > r.prompt_tokens), default=None)
    return f"{low}-{high - 1}" if high else f"{low}+"


def _groups(ran: list[PromptResult], methods: list[str], key, interval) -> list[PromptGroup]:
    """Pooled tokens per target pass and tau per group of prompts (a length bin, a category), each with
    its bootstrap interval over the group's units (none has width where the group is one unit)."""
    groups: dict[str, list[PromptResult]] = {}
    for r in ran:   # groups in the order the file first has them
        groups.setdefault(key(r) or "–", []).append(r)
    rows = []
    for name, members in groups.items():
        members = sorted(members, key=lambda r: r.prompt_tokens)
        units = runner.by_unit(members)
        rows.append(PromptGroup(
            name, len(members), members[0].prompt_tokens, members[-1].prompt_tokens,
            tau={m: pooled_tau(_counts(members, m)) for m in methods},
            tau_ci={m: drift_signals.listed(interval(tau_of(_counts(units, m)), len(units))) for m in methods},
            tokens_per_pass={m: Pooled.of([r.runs[m] for r in members]).tokens_per_pass for m in methods},
            tokens_per_pass_ci={m: drift_signals.listed(interval(_per_pass(units, m), len(units)))
                                for m in methods}))
    return rows


def _gains(ran: list[PromptResult], chains: list[str], text: Sequence[UserPrompt]) -> Gains | None:
    """The prompts where the last drafter's tokens per target pass most exceed the first's, and where they
    fall most short (`difference` is their tau's)."""
    if len(chains) < 2:
        return None
    a, b = chains[0], chains[-1]
    rows = sorted((PromptGain(r.id, r.index, r.category, r.prompt_tokens, preview(text[r.index].prompt),
                              {m: r.runs[m].tau for m in (a, b)}, r.runs[b].tau - r.runs[a].tau,
                              {m: r.runs[m].tokens_per_pass for m in (a, b)},
                              r.runs[b].tokens_per_pass - r.runs[a].tokens_per_pass) for r in ran),
                  key=lambda row: -row.per_pass_difference)
    shown = min(GAINS_SHOWN, len(rows) // 2 or 1)
    return Gains(b, a, rows[:shown], rows[::-1][:shown])


def preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[:PREVIEW_CHARS - 1] + "…"


def _prompt_row(r: PromptResult, prompt) -> PromptRow:
    return PromptRow(r.index, r.id, r.category, r.prompt_tokens, preview(prompt.prompt), r.skipped,
                     {m: MethodRun(run.tau, run.tokens_per_pass, run.verify_steps, run.tokens, run.seconds,
                                   run.decode_tokens, run.decode_seconds, run.accepted, run.drafting_steps)
                      for m, run in r.runs.items()})


# -- markdown -----------------------------------------------------------------------------------------

def _interval(ci) -> str:
    return "…" if ci is None else "{:.2f}–{:.2f}".format(*ci)


def _depths(xs, show="{:.2f}".format) -> str:
    return " ".join(map(show, xs)) or "–"


def tables(res: StudyReport) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table of the report, for markdown and HTML alike."""
    out = []
    pooled = res.pooled
    if pooled:
        head = ["method", "prompts", "tokens per target pass (95% CI)", "tau (95% CI)", "acceptance by depth",
                "tok/s", "vs none (95% CI)",
                "decode tok/s", "decode vs none (95% CI)", *(f"{q.label} by depth" for q in DEPTH_QUANTITIES)]
        speedup = lambda value, ci: f"{value:.2f}x ({_interval(ci)})"
        rows = [[label(p.method), str(p.prompts), with_interval(p.tokens_per_pass, p.tokens_per_pass_ci),
                 with_interval(p.mean_acceptance_length, p.tau_ci), _depths(p.acceptance), f"{p.tokens_per_s:.1f}",
                 speedup(p.speedups.speedup_vs_none, p.speedups.speedup_ci) if p.speedups else "–",
                 f"{p.decode_tokens_per_s:.1f}",
                 speedup(p.speedups.decode_speedup_vs_none, p.speedups.decode_speedup_ci) if p.speedups else "–",
                 *(_depths(p.mean(q), q.format) for q in DEPTH_QUANTITIES)] for p in pooled]
        out.append(("Pooled over the prompts", head, rows))
    if res.ratios:
        out.append(("Paired ratios", ["ratio", "tokens per target pass (95% CI)", "tau (95% CI)"],
                    [[f"{label(r.a)} / {label(r.b)}", with_interval(r.per_pass_ratio, r.per_pass_ci, 3),
                      with_interval(r.tau_ratio, r.ci, 3)] for r in res.ratios]))
    if res.signals:
        out.append(drift_signals.table(res.signals, _resampled(res.source)))
    for groups, title, first in ((res.by_length, "tokens per target pass by prompt length (tokens)", "prompt tokens"),
                                 (res.by_category, "tokens per target pass by category", "category")):
        if groups:
            methods = list(groups[0].tau)
            out.append((title, [first, "prompts", *(f"{label(m)} (95% CI)" for m in methods)],
                        [[g.group, str(g.prompts),
                          *(with_interval(g.tokens_per_pass[m], g.tokens_per_pass_ci[m]) for m in methods)]
                         for g in groups]))
    gains = res.gains
    if gains:
        a, b = gains.than, gains.better
        for rows, title in ((gains.most, f"where {label(b)}'s gain over {label(a)} is largest"),
                            (gains.least, f"where {label(b)}'s gain over {label(a)} is smallest")):
            out.append((title, ["id", "prompt tokens", f"{label(a)} tokens per pass", f"{label(b)} tokens per pass",
                                "difference", "prompt"],
                        [[row.id, str(row.prompt_tokens), f"{row.tokens_per_pass[a]:.2f}",
                          f"{row.tokens_per_pass[b]:.2f}", f"{row.per_pass_difference:+.2f}", row.preview]
                         for row in rows]))
    skipped = [p for p in res.prompts if p.skipped]
    if skipped:
        out.append(("Skipped prompts", ["id", "reason"], [[p.id, p.skipped] for p in skipped]))
    if res.mismatches:
        out.append(("Answers that differ from the first method's", ["id", "method", "first differing token"],
                    [[m.id, label(m.method), str(m.first_differing_token)] for m in res.mismatches]))
    return out


def _resampled(source: Source) -> str:
    """What the intervals resample: prompts, or documents and prompts where prompts name their document."""
    return drift_signals.resampled(source.units, source.measured)


def summary_line(res: StudyReport) -> str:
    c, s = res.config, res.source
    skipped = f", {s.skipped} skipped" if s.skipped else ""
    resampled = _resampled(s)
    clustered = f" (intervals over {resampled})" if resampled != "prompts" else ""
    tree = f", trees {c['tree']['top_k']}/{c['tree']['depth']}/{c['tree']['nodes']}" if c["tree"] else ""
    return (f"{s.file} ({s.format}): {s.measured} of {s.prompts} prompts measured{skipped}{clustered}; "
            f"k={c['k']}{tree}, greedy, up to {c['max_tokens']} new tokens, backend {c['backend']}"
            + (f"; {described(res.machine)}" if "cpu" in res.machine else ""))


def markdown(res: StudyReport) -> str:
    lines = [summary_line(res)]
    for title, head, rows in tables(res):
        lines += ["", f"{title}:", "", markdown_table(head, rows)]
    return "\n".join(lines)


def html_tables(res: StudyReport) -> str:
    parts = [f"<p>{escape(summary_line(res))}</p>"]
    for title, head, rows in tables(res):
        parts.append(f"<h3>{escape(title)}</h3><table><tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr>"
                     + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
                     + "</table>")
    return "".join(parts)


# -- figures ------------------------------------------------------------------------------------------

def _error_bars(values: list[float], intervals: list[list[float] | None]) -> dict | None:
    if any(ci is None for ci in intervals):
        return None
    return dict(type="data", symmetric=False, array=[hi - v for v, (_, hi) in zip(values, intervals)],
                arrayminus=[v - lo for v, (lo, _) in zip(values, intervals)])


def _grouped(groups: list[PromptGroup], title: str, x_title: str) -> go.Figure:
    """Pooled tokens per target pass per group (length bin, category) for each drafter, with 95% intervals."""
    fig = go.Figure()
    for m in (groups[0].tokens_per_pass if groups else {}):
        values = [g.tokens_per_pass[m] for g in groups]
        fig.add_scatter(x=[g.group for g in groups], y=values, mode="lines+markers", name=label(m),
                        line=dict(color=plots.color(m)),
                        error_y=_error_bars(values, [g.tokens_per_pass_ci[m] for g in groups]),
                        customdata=[g.prompts for g in groups],
                        hovertemplate=f"{label(m)}<br>%{{x}}: %{{y:.2f}} tokens per target pass "
                                      "(%{customdata} prompts)<extra></extra>",
                        offsetgroup=m)
    # each drafter's points a little apart in their group, so that equal values do not hide one another
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=320, template=plots.TEMPLATE,
                      margin=dict(l=50, r=10, t=40, b=40), legend=dict(orientation="h", y=-0.3),
                      scattermode="group", scattergap=0.5)
    fig.update_xaxes(title_text=x_title, type="category")
    fig.update_yaxes(title_text="tokens per target pass", rangemode="tozero")
    return fig


def figure_set(res: StudyReport) -> dict[str, go.Figure]:
    """The report's figures by name (tau: tokens per target pass by method; length, category, per_prompt,
    acceptance, sink, rms), those with data."""
    pooled = [p for p in res.pooled if p.method != NONE]
    acceptance = {p.method: tuple(p.acceptance) for p in pooled if p.acceptance}
    by_depth = lambda quantity: {p.method: p.mean(quantity) for p in pooled if p.mean(quantity)}
    figs = {}
    if pooled:
        per_pass = [p.tokens_per_pass for p in pooled]
        bars = go.Figure(go.Bar(x=[label(p.method) for p in pooled], y=per_pass,
                                marker_color=[plots.color(p.method) for p in pooled],
                                error_y=_error_bars(per_pass, [p.tokens_per_pass_ci for p in pooled])))
        bars.update_layout(title=dict(text="tokens per target pass (95% bootstrap interval)", font=dict(size=14)),
                           height=320, template=plots.TEMPLATE, margin=dict(l=50, r=10, t=40, b=40))
        figs["tau"] = bars
        figs["length"] = _grouped(res.by_length, "tokens per target pass against prompt length", "prompt tokens")
    if res.by_category:
        figs["category"] = _grouped(res.by_category, "tokens per target pass by category", "category")
    if res.gains:
        figs["per_prompt"] = _per_prompt(res)
    if acceptance:
        figs["acceptance"] = plots.by_depth(acceptance, "Acceptance by depth (unconditional)", "acceptance rate",
                                            [0, 1.05])
    if by_depth(SINK_ATTENTION):
        figs["sink"] = plots.attention({p.method: p for p in pooled})
    if by_depth(FED_BACK_RMS):
        figs["rms"] = plots.by_depth(by_depth(FED_BACK_RMS), "Fed-back hidden state RMS", "RMS")
    return figs


def _per_prompt(res: StudyReport) -> go.Figure:
    """Each prompt's tokens per target pass under both drafters; points above the diagonal are prompts the
    second does better on."""
    a, b = res.gains.than, res.gains.better
    rows = [p for p in res.prompts if not p.skipped]
    xs = [p.runs[a].tokens_per_pass for p in rows]
    ys = [p.runs[b].tokens_per_pass for p in rows]
    top = max(xs + ys + [1.0]) * 1.05
    fig = go.Figure()
    fig.add_scatter(x=[1, top], y=[1, top], mode="lines", line=dict(color="#9ca3af", dash="dot"), hoverinfo="skip",
                    showlegend=False)
    fig.add_scatter(x=xs, y=ys, mode="markers", marker=dict(color=plots.color(b), size=7, opacity=0.7),
                    customdata=[[p.id, p.prompt_tokens] for p in rows], showlegend=False,
                    hovertemplate="%{customdata[0]} (%{customdata[1]} tokens)<br>" + f"{label(a)} %{{x:.2f}} · "
                                  f"{label(b)} %{{y:.2f}}<extra></extra>")
    fig.update_layout(title=dict(text=f"tokens per target pass by prompt: {label(b)} against {label(a)}",
                                 font=dict(size=14)), height=320, template=plots.TEMPLATE,
                      margin=dict(l=50, r=10, t=40, b=40))
    fig.update_xaxes(title_text=label(a), range=[1, top])
    fig.update_yaxes(title_text=label(b), range=[1, top])
    return fig


# -- files --------------------------------------------------------------------------------------------

def csv_rows(res: StudyReport) -> tuple[list[str], list[list]]:
    methods = [p.method for p in res.pooled] or sorted({m for p in res.prompts for m in p.runs})
    head = ["index", "id", "category", "prompt_tokens", "skipped"]
    for m in methods:
        head += [f"{m} tau", f"{m} tokens", f"{m} seconds", f"{m} decode_tokens", f"{m} decode_seconds",
                 f"{m} accepted", f"{m} drafting_steps", f"{m} verify_steps"]
    rows = []
    for p in res.prompts:
        row = [p.index, p.id, p.category or "", p.prompt_tokens, p.skipped or ""]
        for m in methods:
            run = p.runs.get(m)
            row += ([round(run.mean_acceptance_length, 4), run.tokens, round(run.seconds, 3), run.decode_tokens,
                     round(run.decode_seconds, 3), run.accepted, run.drafting_steps, run.verify_steps]
                    if run else [""] * 8)
        rows.append(row)
    return head, rows


def write(res: StudyReport, out: Path, figures: dict[str, go.Figure] | None = None) -> list[Path]:
    """results.json, results.md, prompts.csv and charts.html (self-contained, of `figures`: figure_set's
    when not given) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md", out / "prompts.csv", out / "charts.html"]
    paths[0].write_text(json.dumps(res.to_json(), indent=1))
    paths[1].write_text(markdown(res) + "\n")
    with open(paths[2], "w", newline="") as f:
        head, rows = csv_rows(res)
        writer = csv.writer(f)
        writer.writerow(head)
        writer.writerows(rows)
    plots.html_page(list((figures or figure_set(res)).values()), "Drafters on your prompts", paths[3],
                    columns=2,
                    header=f"<style>{plots.HEADER_CSS}</style><h2>Your prompts</h2>{html_tables(res)}")
    return paths


def run(engine: Engine, config: StudyConfig, prompts: PromptFile, source: str,
        out: Path) -> tuple[StudyReport, list[Path]]:
    """The study on `engine` with a progress bar; the report written to `out`. Measured prompts are saved
    to out/progress.pkl as they finish, so that the same call goes on after an interruption."""
    config = config.runnable_on(engine)
    progress = out / "progress.pkl"
    done = runner.run(engine, prompts.prompts, config.methods(), config.max_tokens, progress,
                      study_key(config, prompts), "prompts", config.concurrency)
    res = results(config, prompts, source, done)
    paths = write(res, out)
    progress.unlink(missing_ok=True)
    return res, paths
