"""Plotly figures by draft depth; one trace group per run, in a fixed colour per drafter (and one for
a drafter's trees beside its chain)."""

from __future__ import annotations

from typing import Mapping

import plotly.graph_objects as go

from playground.engines.stats import RunSummary
from playground.model.variants import EAGLE3, EAGLE31, LABELS, NONE, SEPARATOR

COLORS = {EAGLE31: "#2563eb", EAGLE3: "#ea580c", NONE: "#6b7280"}
TREE_COLOR = "#7c3aed"       # a run that drafts trees beside the same drafter's chain
FALLBACK_COLOR = "#0d9488"


def label(name: str) -> str:
    drafter, _, how = name.partition(SEPARATOR)
    return LABELS.get(drafter, drafter) + (SEPARATOR + how if how else "")


def color(name: str) -> str:
    drafter, _, how = name.partition(SEPARATOR)
    return TREE_COLOR if how.startswith("tree") else COLORS.get(drafter, FALLBACK_COLOR)


def _layout(fig: go.Figure, title: str, y_title: str, y_range: list[float] | None = None,
            key: str = "") -> go.Figure:
    """`key` says what the line styles mean, under the title; the legend then names only drafters,
    one row for any number of them."""
    text = f"{title}<br><span style='font-size:11px'>{key}</span>" if key else title
    fig.update_layout(title=dict(text=text, font=dict(size=14)), height=300,
                      margin=dict(l=50, r=10, t=55 if key else 40, b=40),
                      legend=dict(orientation="h", yanchor="top", y=-0.3, font=dict(size=11)), template="plotly_white",
                      barmode="group")
    fig.update_xaxes(title_text="draft depth", dtick=1)
    # without a fixed range the axis still starts at 0, so that sizes compare at a glance: a line
    # from 1.6 to 2.2 does not fill the plot as if it had grown tenfold
    fig.update_yaxes(title_text=y_title, range=y_range, rangemode="tozero")
    return fig


def _depths(values: tuple[float, ...]) -> list[int]:
    return list(range(1, len(values) + 1))


def _drafter_traces(name: str, what: str) -> dict:
    """Trace options that put all of one drafter's traces under a single legend entry; the hover
    still says which trace it is."""
    return dict(legendgroup=name, name=label(name),
                hovertemplate=f"{label(name)} · {what}<br>depth %{{x}}: %{{y:.3f}}<extra></extra>")


def acceptance(runs: Mapping[str, RunSummary]) -> go.Figure:
    """Bars: the share of drafting steps that accepted at least d drafts (vLLM's per-position
    acceptance, stats.acceptance_by_depth); dashed line: conditional on d-1 accepted."""
    fig = go.Figure()
    for name, s in runs.items():
        shade = color(name)
        fig.add_bar(x=_depths(s.per_position_acceptance), y=list(s.per_position_acceptance),
                    marker_color=shade, opacity=0.8, **_drafter_traces(name, "accepted ≥ d drafts"))
        fig.add_scatter(x=_depths(s.per_position_acceptance_conditional),
                        y=list(s.per_position_acceptance_conditional), mode="lines+markers",
                        line=dict(color=shade, dash="dash"), showlegend=False,
                        **_drafter_traces(name, "given depth d-1 accepted"))
    return _layout(fig, "Acceptance by depth", "acceptance rate", [0, 1.05],
                   key="bars: drafting steps that accepted ≥ d drafts (vLLM's rule) · dashed: given d-1 accepted")


def attention(runs: Mapping[str, RunSummary]) -> go.Figure:
    """Drafter attention mass on the sink tokens (solid) and on its own drafts (dotted)."""
    fig = go.Figure()
    for name, s in runs.items():
        shade = color(name)
        fig.add_scatter(x=_depths(s.mean_sink_attention), y=list(s.mean_sink_attention), mode="lines+markers",
                        line=dict(color=shade), **_drafter_traces(name, "sink tokens"))
        fig.add_scatter(x=_depths(s.mean_self_attention), y=list(s.mean_self_attention), mode="lines+markers",
                        line=dict(color=shade, dash="dot"), showlegend=False,
                        **_drafter_traces(name, "own drafts"))
    return _layout(fig, "Drafter attention by depth", "attention mass",
                   key="solid: the sink tokens · dotted: its own drafts")


def by_depth(series: Mapping[str, tuple[float, ...]], title: str, y_title: str,
             y_range: list[float] | None = None) -> go.Figure:
    """One line per drafter of a value by draft depth."""
    fig = go.Figure()
    for name, values in series.items():
        fig.add_scatter(x=_depths(values), y=list(values), mode="lines+markers", name=label(name),
                        line=dict(color=color(name)))
    return _layout(fig, title, y_title, y_range)


def hidden_norm(runs: Mapping[str, RunSummary]) -> go.Figure:
    """RMS of the state fed into each depth; EAGLE 3's grows with depth, 3.1's stays normalised."""
    return by_depth({name: s.mean_hidden_norm for name, s in runs.items()}, "Fed-back hidden state RMS by depth", "RMS")


def all_figures(runs: Mapping[str, RunSummary]) -> tuple[go.Figure, go.Figure, go.Figure]:
    return acceptance(runs), attention(runs), hidden_norm(runs)


def html_page(figures, title: str, path, columns: int = 1) -> None:
    """Figures in one standalone HTML file (plotly.js inlined: it opens offline), `columns` to a row."""
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    grid = f"<div style='display:grid;grid-template-columns:repeat({columns},minmax(0,1fr))'>"
    path.write_text(f"<!doctype html><meta charset='utf-8'><title>{title}</title>{grid}" + "".join(parts) + "</div>")


def figures_file(runs: Mapping[str, RunSummary], path) -> None:
    html_page(all_figures(runs), "EAGLE playground run", path)
