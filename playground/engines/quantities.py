"""What the drafter measures at each draft depth, declared once: every table, plot, export, report, stop
rule and comparison of these values iterates `DEPTH_QUANTITIES` instead of naming them.

A quantity's `name` is its StepEvent field, its key in every summary (`mean_<name>` in a run's summary,
`<name>` pooled over runs) and in the exports. Names that other contracts already gave the same value
(the probe's wire record, the `diff` report, the CSV) are declared here beside it and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DepthQuantity:
    name: str             # the StepEvent field; the key in summaries, reports and exports
    label: str            # in sentences and legends
    short: str            # a column header or a plot row's title
    description: str      # what one value is (hover texts, the stop rule's help)
    unit: str             # an axis title
    digits: int           # decimals shown
    comparison: str       # how two runs' values are compared: "attention" (absolute) or "relative"
    diff_name: str        # its name in the `diff` report (--json)
    wire_name: str        # its key in the probe's step records
    observed: str         # the StepEvent.observed tag of a backend that measures it
    first_depth: int = 1  # the first depth that has a value to show (own drafts: none before depth 2)
    attends_to: str = ""  # an attention share's keys (the shares of one depth sum to 1); "": not attention

    @property
    def attention(self) -> bool:
        return bool(self.attends_to)

    def format(self, value: float) -> str:
        return f"{value:.{self.digits}f}"


FED_BACK_RMS = DepthQuantity(
    name="hidden_norm", label="fed-back RMS", short="RMS", description="RMS of the state fed back into this depth",
    unit="RMS", digits=2, comparison="relative", diff_name="fed_back_rms", wire_name="hidden_rms",
    observed="hidden_norm")
SINK_ATTENTION = DepthQuantity(
    name="sink_attention", label="sink attention", short="sink", description="drafter attention on the sink tokens",
    unit="attention mass", digits=3, comparison="attention", diff_name="sink_attention", wire_name="sink_attention",
    observed="attention", attends_to="sink tokens")
OWN_DRAFT_ATTENTION = DepthQuantity(
    name="self_attention", label="own-draft attention", short="own drafts",
    description="drafter attention on its own earlier drafts of this step", unit="attention mass", digits=3,
    comparison="attention", diff_name="own_draft_attention", wire_name="self_attention", observed="attention",
    first_depth=2, attends_to="own drafts")
REST_ATTENTION = DepthQuantity(
    name="rest_attention", label="rest-of-context attention", short="rest",
    description="drafter attention on the rest of the context: neither the sink tokens nor this step's drafts",
    unit="attention mass", digits=3, comparison="attention", diff_name="rest_attention", wire_name="rest_attention",
    observed="attention", attends_to="rest of the context")

# in the order tables and plots show them: where the drafter looks, then the state it is fed
DEPTH_QUANTITIES = (SINK_ATTENTION, OWN_DRAFT_ATTENTION, REST_ATTENTION, FED_BACK_RMS)
ATTENTION_QUANTITIES = tuple(q for q in DEPTH_QUANTITIES if q.attention)
BY_NAME = {q.name: q for q in DEPTH_QUANTITIES}


def rest_of(sink: tuple[float, ...], own: tuple[float, ...]) -> tuple[float, ...]:
    """The attention on the rest of the context by depth: a softmax sums to 1 over the sink tokens, the
    step's drafts and the rest (as the probe computes it, probe/eagle_probe/attention.py), so the rest
    is what the other two leave."""
    return tuple(max(0.0, 1.0 - s - o) for s, o in zip(sink, own))
