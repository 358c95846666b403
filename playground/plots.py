"""Plotly figures by draft depth; one trace group per run, in a fixed colour per drafter (and one for
a drafter's trees beside its chain). Each point by depth is a mean over some drafting steps: the hover
says how many, and a point over fewer than FEW_SAMPLES is drawn hollow."""

from __future__ import annotations

import threading
from html import escape
from typing import Iterable, Mapping, Protocol, Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from playground.engines.quantities import (ATTENTION_QUANTITIES, DEPTH_QUANTITIES, FED_BACK_RMS, SINK_ATTENTION,
                                          DepthQuantity)
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunSummary
from playground.engines.step_diff import DepthDifferences
from playground.model.variants import EAGLE3, EAGLE31, LABELS, NONE, SEPARATOR

COLORS = {EAGLE31: "#2563eb", EAGLE3: "#ea580c", NONE: "#6b7280"}
TREE_COLOR = "#7c3aed"       # a run that drafts trees beside the same drafter's chain
# other names (servers named freely) take these in the order they are first drawn, and keep their
# colour in every plot and tab from then on
PALETTE = ("#0d9488", "#db2777", "#65a30d", "#ca8a04", "#0891b2", "#9f1239", "#4d7c0f", "#1e293b")
_assigned: dict[str, str] = {}
_assigning = threading.Lock()
FEW_SAMPLES = 5              # a mean over fewer steps than this is drawn hollow: too few to trust
DEPTH_COLORS = ("#1d4ed8", "#0891b2", "#16a34a", "#ca8a04", "#dc2626", "#7c3aed", "#db2777", "#52525b")
ATTENTION_DASHES = ("solid", "dot", "dash")   # by ATTENTION_QUANTITIES
DASH_NAMES = {"solid": "solid", "dot": "dotted", "dash": "dashed"}
DIFFERENCE_TITLES = {**{q.diff_name: q.short for q in DEPTH_QUANTITIES}, "draft_probability": "probability"}


# plotly_white as far as these plots use it (its page, axes, hover, lines and bars; not its colour scales and its
# 3-D, map and polar styles, which made a plot's JSON 7.5 KB instead of 2.1 and its build 61 ms instead of 19), with
# a toolbar of three buttons (save as PNG, reset the axes, plotly's mark): the full one runs over the title of a plot
# a third of the page or a phone wide
_WHITE = pio.templates["plotly_white"].to_plotly_json()
TEMPLATE = go.layout.Template(
    layout={key: _WHITE["layout"][key] for key in ("autotypenumbers", "colorway", "font", "hovermode", "hoverlabel",
                                                   "paper_bgcolor", "plot_bgcolor", "xaxis", "yaxis", "shapedefaults",
                                                   "annotationdefaults", "title")},
    data={kind: _WHITE["data"][kind] for kind in ("scatter", "bar")})
TEMPLATE.layout.modebar.remove = ["zoom", "pan", "select", "lasso", "zoomin", "zoomout", "autoscale", "hovercompare",
                                  "hoverclosest", "togglespikelines"]


def label(name: str) -> str:
    drafter, _, how = name.partition(SEPARATOR)
    return LABELS.get(drafter, drafter) + (SEPARATOR + how if how else "")


def color(name: str) -> str:
    drafter, _, how = name.partition(SEPARATOR)
    if how.startswith("tree"):
        return TREE_COLOR
    if drafter in COLORS:
        return COLORS[drafter]
    with _assigning:
        if drafter not in _assigned:
            _assigned[drafter] = PALETTE[len(_assigned) % len(PALETTE)]
        return _assigned[drafter]


def layout(fig: go.Figure, title: str, y_title: str, y_range: list[float] | None = None,
           key: Sequence[str] = (), x_title: str = "draft depth", x_step: int | None = 1) -> go.Figure:
    """The playground's plot style. `key` says what the line styles mean, a line each under the title
    (empty lines are left out); the legend then names only drafters, one row for any number of them."""
    lines = [line for line in key if line]
    text = title + "".join(f"<br><span style='font-size:11px'>{line}</span>" for line in lines)
    # the title and its key lines hang from the top, and each line of the key makes the figure taller
    # rather than the plot smaller
    fig.update_layout(title=dict(text=text, font=dict(size=14), y=1, yref="container", yanchor="top",
                                 pad=dict(t=10)),
                      height=300 + 17 * max(0, len(lines) - 1),
                      margin=dict(l=50, r=10, t=44 + 17 * len(lines), b=40),
                      legend=dict(orientation="h", yanchor="top", y=-0.3, font=dict(size=11)), template=TEMPLATE,
                      barmode="group")
    fig.update_xaxes(title_text=x_title, dtick=x_step)
    # without a fixed range the axis still starts at 0, so that sizes compare at a glance: a line
    # from 1.6 to 2.2 does not fill the plot as if it had grown tenfold
    fig.update_yaxes(title_text=y_title, range=y_range, rangemode="tozero")
    return fig


def placeholder(text: str) -> go.Figure:
    """A plot with nothing to draw yet: `text` where it will be, no axes."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=13, color="#52525b"))
    fig.update_layout(height=300, template=TEMPLATE, margin=dict(l=10, r=10, t=10, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    return fig


def _depths(values: tuple[float, ...]) -> list[int]:
    return list(range(1, len(values) + 1))


def _defined(values: Sequence[float], samples: Sequence[int] | None) -> list[float | None]:
    """The values to draw: a mean over no samples is undefined, and left out (a gap), not drawn as 0."""
    if samples is None:
        return list(values)
    return [v if i < len(samples) and samples[i] > 0 else None for i, v in enumerate(values)]


def _drafter_traces(name: str, what: str, samples: Sequence[int] | None = None) -> dict:
    """Trace options that put all of one drafter's traces under a single legend entry; the hover
    still says which trace it is, and over how many steps each point is a mean."""
    n = " (n = %{customdata})" if samples is not None else ""
    return dict(legendgroup=name, name=label(name), customdata=None if samples is None else list(samples),
                hovertemplate=f"{label(name)} · {what}<br>depth %{{x}}: %{{y:.3f}}{n}<extra></extra>")


def _markers(shade: str, samples: Sequence[int] | None) -> dict:
    """Line markers: filled, or hollow where the mean is over fewer than FEW_SAMPLES steps (all
    filled where the samples are not known)."""
    if samples is None:
        return dict(color=shade)
    return dict(color=shade, size=8, symbol=["circle-open" if n < FEW_SAMPLES else "circle" for n in samples])


def _few_samples_key(samples: Iterable[int]) -> str:
    """The key's line on hollow points, when the figure has any."""
    return f"hollow: fewer than {FEW_SAMPLES} samples" if any(n < FEW_SAMPLES for n in samples) else ""


def acceptance(runs: Mapping[str, RunSummary]) -> go.Figure:
    """Bars: the share of drafting steps that accepted at least d drafts (vLLM's per-position
    acceptance, stats.acceptance_by_depth); dashed line: conditional on d-1 accepted."""
    fig = go.Figure()
    for name, s in runs.items():
        shade = color(name)
        bar_samples = [s.drafting_steps] * len(s.per_position_acceptance)
        fill = shade if s.drafting_steps >= FEW_SAMPLES else "rgba(0,0,0,0)"
        fig.add_bar(x=_depths(s.per_position_acceptance), y=list(s.per_position_acceptance),
                    marker=dict(color=fill, line=dict(color=shade, width=1.5)), opacity=0.8,
                    **_drafter_traces(name, "accepted ≥ d drafts", bar_samples))
        fig.add_scatter(x=_depths(s.per_position_acceptance_conditional),
                        y=_defined(s.per_position_acceptance_conditional, s.conditional_acceptance_steps),
                        mode="lines+markers",
                        line=dict(color=shade, dash="dash"), marker=_markers(shade, s.conditional_acceptance_steps),
                        showlegend=False,
                        **_drafter_traces(name, "given depth d-1 accepted", s.conditional_acceptance_steps))
    samples = [n for s in runs.values() for n in (s.drafting_steps, *s.conditional_acceptance_steps)]
    return layout(fig, "Acceptance by depth", "acceptance rate", [0, 1.05],
                   key=("bars: steps that accepted ≥ d drafts (vLLM's rule)", "dashed: given d-1 accepted",
                        _few_samples_key(samples)))


class MeasuredByDepth(Protocol):
    """What a figure by depth reads of a run, or of runs pooled: each quantity's means, and the steps
    behind each (None where not known)."""
    def mean(self, quantity: DepthQuantity) -> tuple[float, ...]: ...
    def samples_of(self, quantity: DepthQuantity) -> tuple[int, ...] | None: ...


def attention(runs: Mapping[str, MeasuredByDepth]) -> go.Figure:
    """Drafter attention mass by depth, a line style per part of what it attends to (the sink tokens, its
    own drafts, the rest of the context: they sum to 1); a run that measured none (no drafter model, or a
    server without the probe) has no line."""
    fig = go.Figure()
    for name, s in runs.items():
        if not s.mean(SINK_ATTENTION):
            continue
        shade = color(name)
        for quantity, dash in zip(ATTENTION_QUANTITIES, ATTENTION_DASHES):
            values, samples = s.mean(quantity), s.samples_of(quantity)
            fig.add_scatter(x=_depths(values), y=_defined(values, samples), mode="lines+markers",
                            line=dict(color=shade, dash=dash), marker=_markers(shade, samples),
                            showlegend=quantity is SINK_ATTENTION, **_drafter_traces(name, quantity.attends_to, samples))
    return layout(fig, "Drafter attention by depth", SINK_ATTENTION.unit,
                  key=(" · ".join(f"{DASH_NAMES[dash]}: {q.attends_to}"
                                  for q, dash in zip(ATTENTION_QUANTITIES, ATTENTION_DASHES)),
                       _few_samples_key(n for s in runs.values() for n in s.samples_of(SINK_ATTENTION) or ())))


def by_depth(series: Mapping[str, tuple[float, ...]], title: str, y_title: str,
             y_range: list[float] | None = None, samples: Mapping[str, tuple[int, ...]] | None = None) -> go.Figure:
    """One line per drafter of a value by draft depth; with `samples` (the steps behind each value, by
    drafter), the hover says n and thin points are hollow."""
    fig, samples = go.Figure(), samples or {}
    for name, values in series.items():
        if not values:   # nothing measured: no empty entry in the legend
            continue
        shade, counts = color(name), samples.get(name)
        fig.add_scatter(x=_depths(values), y=_defined(values, counts), mode="lines+markers", line=dict(color=shade),
                        marker=_markers(shade, counts), **_drafter_traces(name, y_title, counts))
    return layout(fig, title, y_title, y_range, key=(_few_samples_key(n for c in samples.values() for n in c),))


def hidden_norm(runs: Mapping[str, RunSummary]) -> go.Figure:
    """RMS of the state fed into each depth; EAGLE 3's grows with depth, 3.1's stays normalised."""
    return by_depth({name: s.mean(FED_BACK_RMS) for name, s in runs.items()}, "Fed-back hidden state RMS by depth",
                    FED_BACK_RMS.unit, samples={name: s.samples_of(FED_BACK_RMS) for name, s in runs.items()})


def step_differences(differences: Sequence[DepthDifferences], first: str, second: str,
                     divergence: int | None = None) -> go.Figure:
    """Per quantity a row, per depth a line: the second run's value minus the first's along the answer
    (step_diff.DepthDifferences; relative for RMS and probability); a dotted line at the answer position
    where they first part (`divergence`)."""
    rows = [d for d in differences if d.by_depth]
    if not rows:
        return placeholder("no quantity by depth that both runs measured")
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for row, found in enumerate(rows, start=1):
        for depth, points in enumerate(found.by_depth):
            shade = DEPTH_COLORS[depth % len(DEPTH_COLORS)]
            fig.add_scatter(x=[p for p, _ in points], y=[v for _, v in points], mode="lines", row=row, col=1,
                            line=dict(color=shade, width=1.2), name=f"depth {depth + 1}", legendgroup=str(depth),
                            showlegend=row == 1,
                            hovertemplate=f"depth {depth + 1} · {DIFFERENCE_TITLES[found.quantity]}"
                                          "<br>position %{x}: %{y:.3g}<extra></extra>")
        unit = " (rel.)" if found.relative else ""
        fig.update_yaxes(title_text=DIFFERENCE_TITLES[found.quantity] + unit, row=row, col=1, title_font=dict(size=11))
        if divergence is not None:
            fig.add_vline(x=divergence, line=dict(color="#ea580c", dash="dot", width=1), row=row, col=1)
    fig.update_layout(title=dict(text=f"Step by step: {label(second)} minus {label(first)}, by depth"
                                      "<br><span style='font-size:11px'>relative for RMS and probability; dotted: "
                                      "where they first part</span>", font=dict(size=14), y=1, yref="container",
                                 yanchor="top", pad=dict(t=10)),
                      height=140 + 110 * len(rows), margin=dict(l=60, r=10, t=60, b=40), template=TEMPLATE,
                      legend=dict(orientation="h", yanchor="top", y=-0.08, font=dict(size=11)))
    fig.update_xaxes(title_text="answer position", row=len(rows), col=1)
    return fig


def all_figures(runs: Mapping[str, RunSummary]) -> tuple[go.Figure, go.Figure, go.Figure]:
    return acceptance(runs), attention(runs), hidden_norm(runs)


def html_page(figures, title: str, path, columns: int = 1, header: str = "",
              plotlyjs: bool | str = True) -> None:
    """Figures in one standalone HTML file after an HTML `header`, `columns` to a row. plotly.js is
    inlined by default, so that the file opens offline; plotlyjs="cdn" loads it from the CDN instead."""
    parts = [fig.to_html(full_html=False, include_plotlyjs=plotlyjs if i == 0 else False)
             for i, fig in enumerate(figures)]
    grid = f"<div style='display:grid;grid-template-columns:repeat({columns},minmax(0,1fr))'>"
    path.write_text(f"<!doctype html><meta charset='utf-8'><title>{title}</title>{header}{grid}"
                    + "".join(parts) + "</div>")


def figures_file(figures: Sequence[go.Figure], requests: Mapping[str, GenerationRequest], path) -> None:
    """A run's plots under its prompt and settings. plotly.js comes from the CDN, which keeps the file
    small; the JSON and CSV exports are the offline record."""
    html_page(figures, "EAGLE playground run", path, header=requests_header(requests), plotlyjs="cdn")


HEADER_CSS = ("body { font-family: system-ui, sans-serif; margin: 16px; } pre { white-space: pre-wrap; "
              "background: #f6f6f6; padding: 8px; } td, th { padding: 2px 10px; text-align: left; }")


def requests_header(requests: Mapping[str, GenerationRequest]) -> str:
    """The prompt, the system prompt if any, and a row of settings per run. The runs of one export
    share their prompt (the page sends one prompt to every run), so it is the first run's."""
    first = next(iter(requests.values()))
    system = f"<h3>System prompt</h3><pre>{escape(first.system)}</pre>" if first.system else ""
    head = ("run", "drafter", "drafts", "temperature", "top-p", "max tokens", "seed")
    rows = [(label(name), r.drafter, r.drafting, f"{r.temperature:g}", f"{r.top_p:g}", r.max_tokens, r.seed)
            for name, r in requests.items()]
    table = "".join("<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return (f"<style>{HEADER_CSS}</style><h3>Prompt</h3><pre>{escape(first.prompt)}</pre>{system}"
            f"<h3>Settings</h3><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{table}</table>")
