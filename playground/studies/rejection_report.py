"""`bench rejection`'s report as records (studies/rejection.py measures and analyses): for each drafter, an
AUC row per depth and signal and the logistic models' added value; `to_json` writes results.json's shape and
`from_json` reads it back; the table, the figure and the page's sentence read the records."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playground import plots
from playground.engines.quantities import FED_BACK_RMS, OWN_DRAFT_ATTENTION, REST_ATTENTION, SINK_ATTENTION
from playground.evaluation import drift_signals
from playground.evaluation.machine import described
from playground.evaluation.tables import markdown_table, read_record
from playground.model.variants import LABELS as DRAFTER_LABELS

SIGNALS = {"probability": "draft probability", **drift_signals.SIGNALS}
SIGNAL_COLORS = {"probability": "#1e293b", SINK_ATTENTION.name: "#0d9488", OWN_DRAFT_ATTENTION.name: "#db2777",
                 REST_ATTENTION.name: "#7c3aed", FED_BACK_RMS.name: "#ca8a04"}
DRIFT = tuple(drift_signals.SIGNALS)   # what the drift story is about
Interval = Sequence[float]


@dataclass(frozen=True)
class AucRow:
    """How well one signal at one depth separates the accepted drafts from the rejected: pooled and within
    prompts, each with its 95% interval over prompts; on the probability, the shuffled-verdict controls."""
    depth: int
    signal: str
    accepted: int
    rejected: int
    auc: float
    auc_ci: Interval
    acceptance_by_quartile: list[float | None]   # the acceptance rate in each quartile of the signal, lowest first
    within_auc: float | None = None              # None in reports written before it was measured
    within_auc_ci: Interval | None = None
    null_auc: float | None = None                # verdicts shuffled over all drafts of the depth
    null_band: Interval | None = None
    null_within_auc: float | None = None         # verdicts shuffled within each prompt
    null_within_band: Interval | None = None

    @property
    def control_band(self) -> Interval | None:
        """The no-information band: verdicts shuffled within prompts, or over the depth in older reports."""
        return self.null_within_band or self.null_band

    def to_json(self) -> dict:
        """Its fields, each only where it was measured."""
        return {name: value for name, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class AddedValue:
    """The AUC of logistic models of the probability and depth, alone and with attention and RMS added, scored
    on prompts they were not fitted on, and their paired difference."""
    probability_auc: float
    probability_auc_ci: Interval
    with_attention_auc: float
    with_attention_auc_ci: Interval
    gain: float
    gain_ci: Interval


@dataclass(frozen=True)
class DrafterVerdicts:
    drafts: int                          # the verified drafts
    by_depth: list[AucRow]
    added_value: AddedValue

    def to_json(self) -> dict:
        return {"drafts": self.drafts, "by_depth": [r.to_json() for r in self.by_depth],
                "added_value": asdict(self.added_value)}

    @classmethod
    def from_json(cls, part: dict) -> DrafterVerdicts:
        return cls(part["drafts"], [read_record(AucRow, r) for r in part["by_depth"]], AddedValue(**part["added_value"]))


@dataclass(frozen=True)
class RejectionReport:
    config: dict                         # the RejectionConfig, as asdict writes it
    prompts: int
    drafters: dict[str, DrafterVerdicts]
    machine: dict | None = None

    def to_json(self) -> dict:
        out = {"config": self.config, "prompts": self.prompts,
               "drafters": {name: part.to_json() for name, part in self.drafters.items()}}
        return out | ({"machine": self.machine} if self.machine is not None else {})

    @classmethod
    def from_json(cls, report: dict) -> RejectionReport:
        return cls(report["config"], report["prompts"],
                   {name: DrafterVerdicts.from_json(part) for name, part in report["drafters"].items()},
                   report.get("machine"))


def _ci(interval: Sequence[float]) -> str:
    return f"{interval[0]:.2f}–{interval[1]:.2f}"


def markdown(report: RejectionReport) -> str:
    config = report.config
    lines = [f"{report.prompts} prompts (the shipped sample and the held-out {', '.join(config['kinds'])}), k="
             f"{config['k']}, greedy, up to {config['max_tokens']} tokens; {described(report.machine)}", "",
             "AUC: the chance that an accepted draft's value is higher than a rejected draft's at the same depth "
             "(95% bootstrap interval over prompts); 0.5 says nothing, below 0.5 higher values go with rejection.",
             ""]
    by_depth, within = [], []
    for drafter, part in report.drafters.items():
        for depth in range(1, config["k"] + 1):
            rows = {r.signal: r for r in part.by_depth if r.depth == depth}
            if not rows:
                continue
            first, control = next(iter(rows.values())), rows.get("probability")
            head = [DRAFTER_LABELS.get(drafter, drafter), depth, f"{first.accepted} / {first.rejected}"]
            by_depth.append([*head, *(f"{rows[s].auc:.2f} ({_ci(rows[s].auc_ci)})" if s in rows else "–"
                                      for s in SIGNALS),
                             _ci(control.control_band) if control else "–"])
            within.append([*head, *(f"{rows[s].within_auc:.2f} ({_ci(rows[s].within_auc_ci)})"
                                    if s in rows and rows[s].within_auc is not None else "–" for s in SIGNALS)])
    lines.append(markdown_table(["drafter", "depth", "verified (accepted / rejected)", *SIGNALS.values(),
                                 "no information (verdicts shuffled within prompts)"], by_depth))
    if any(cell != "–" for row in within for cell in row[3:]):
        lines += ["", "Within prompts: the AUC over pairs of drafts from the same prompt only (95% bootstrap interval "
                  "over prompts):", "",
                  markdown_table(["drafter", "depth", "verified (accepted / rejected)", *SIGNALS.values()], within)]
    lines += ["", "Acceptance rate by quartile of each signal within its depth (lowest quartile first), all depths:", "",
              markdown_table(["drafter", *SIGNALS.values()],
                             ([DRAFTER_LABELS.get(drafter, drafter),
                               *(" ".join(f"{v:.2f}" for v in quartiles_pooled(part.by_depth, name)) or "–"
                                 for name in SIGNALS)] for drafter, part in report.drafters.items()))]
    added = [(DRAFTER_LABELS.get(drafter, drafter), part.added_value) for drafter, part in report.drafters.items()]
    lines += ["", "Does attention add to the probability? Logistic models scored on prompts they were not fitted on "
              "(AUC over all verified drafts, depth in both models):", "",
              markdown_table(["drafter", "probability and depth", "+ sink, own-draft attention and RMS", "gain"],
                             ([name, f"{a.probability_auc:.3f} ({_ci(a.probability_auc_ci)})",
                               f"{a.with_attention_auc:.3f} ({_ci(a.with_attention_auc_ci)})",
                               f"{a.gain:+.3f} ({a.gain_ci[0]:+.3f} to {a.gain_ci[1]:+.3f})"]
                              for name, a in added))]
    return "\n".join(lines) + "\n"


def figure(report: RejectionReport) -> go.Figure:
    """The report's AUCs by depth: a panel per drafter, a line per signal with its 95% interval, the grey
    band where the probability's AUC falls with each prompt's verdicts shuffled, and 0.5 (tells nothing) dotted."""
    drafters = list(report.drafters)
    lows = [r.auc_ci[0] for part in report.drafters.values() for r in part.by_depth]
    fig = make_subplots(rows=1, cols=len(drafters), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[plots.label(name) for name in drafters])
    for col, drafter in enumerate(drafters, start=1):
        rows = report.drafters[drafter].by_depth
        band = [(r.depth, *r.control_band) for r in rows if r.control_band is not None]
        fig.add_scatter(x=[d for d, _, _ in band] + [d for d, _, _ in reversed(band)],
                        y=[hi for _, _, hi in band] + [lo for _, lo, _ in reversed(band)], fill="toself", mode="lines",
                        fillcolor="rgba(107,114,128,0.2)", line=dict(width=0), hoverinfo="skip", row=1, col=col,
                        name="verdicts shuffled within prompts (draft probability)", legendgroup="shuffled",
                        showlegend=col == 1)
        for signal, title in SIGNALS.items():
            mine = [r for r in rows if r.signal == signal]
            fig.add_scatter(x=[r.depth for r in mine], y=[r.auc for r in mine], mode="lines+markers",
                            error_y=dict(type="data", symmetric=False, thickness=1, width=3,
                                         array=[r.auc_ci[1] - r.auc for r in mine],
                                         arrayminus=[r.auc - r.auc_ci[0] for r in mine]),
                            line=dict(color=SIGNAL_COLORS[signal], width=1.6), name=title, legendgroup=signal,
                            showlegend=col == 1, row=1, col=col,
                            customdata=[[*r.auc_ci, r.accepted, r.rejected] for r in mine],
                            hovertemplate=f"{plots.label(drafter)} · {title}<br>depth %{{x}}: AUC %{{y:.2f}} "
                                          "(%{customdata[0]:.2f}–%{customdata[1]:.2f}), %{customdata[2]} "
                                          "accepted / %{customdata[3]} rejected<extra></extra>")
        fig.add_hline(y=0.5, line=dict(color="#6b7280", dash="dot", width=1), row=1, col=col)
    plots.layout(fig, f"What predicts a rejection: AUC, {report.prompts} prompts",
                 "AUC (accepted above rejected)", [min(0.3, *lows) - 0.02, 1.0],
                 key=["bars: 95% interval · dotted 0.5, grey: no information"])
    for col in range(2, len(drafters) + 1):   # the panels share the first one's axis
        fig.update_yaxes(title_text=None, col=col)
    fig.update_layout(height=360, legend=dict(y=-0.22))
    fig.update_annotations(font=dict(size=12))
    return fig


def alone(report: RejectionReport) -> str:
    """What the drift signals tell taken one at a time: where their AUC's interval leaves out 0.5."""
    rows = [(drafter, r) for drafter, part in report.drafters.items() for r in part.by_depth if r.signal in DRIFT]
    telling = [(drafter, r) for drafter, r in rows if not r.auc_ci[0] <= 0.5 <= r.auc_ci[1]]
    if not telling:
        return "Taken alone, no drift signal's interval leaves out 0.5 at any depth."
    drafter, far = max(telling, key=lambda pair: abs(pair[1].auc - 0.5))
    return (f"Taken alone, a drift signal's interval leaves out 0.5 at {len(telling)} of {len(rows)} drafter and "
            f"depth pairs (the farthest: {DRAFTER_LABELS.get(drafter, drafter)}'s {SIGNALS[far.signal]} at depth "
            f"{far.depth}, {far.auc:.2f}), but none adds to what the probability already says.")


def quartiles_pooled(rows: list[AucRow], signal: str) -> list[float]:
    """Each depth's quartile rates averaged over depths, weighted by the depth's verified drafts."""
    parts = [(r.acceptance_by_quartile, r.accepted + r.rejected) for r in rows if r.signal == signal]
    total = sum(n for _, n in parts)
    return [sum((rates[q] or 0.0) * n for rates, n in parts) / total for q in range(4)] if total else []


