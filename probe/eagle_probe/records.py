"""The probe's step records, the wire format both sides rely on: `POST /v1/eagle_probe/records` hands a
request's records over as JSON objects, one per verify step, in order, each with the `step` index the
store gives it (routes.py, store.py). The playground reads them in playground/engines/vllm/client.py,
the per-depth lists by the wire names of playground/engines/quantities.py. A record either describes a
step (StepRecord) or ends the request's recording and says why (`error_record`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import fmean


@dataclass(frozen=True)
class StepRecord:
    """One verify step of a recorded request. The per-depth lists run over the drafts the step verified."""
    request: str                # vLLM's internal request id
    drafts: list[int]           # the draft token ids the target verified in this step
    accepted: int               # how many of them it accepted (vLLM's spec-decode count)
    tokens: list[int]           # the tokens the step committed: the accepted drafts, then the target's own
    hidden_rms: list[float]     # the RMS of the state fed into the drafter at each depth ([]: not measured)
    draft_probs: list[float] | None = None     # the drafter's probability of each of its drafts
    probe_ms: float | None = None              # what the probe's measurements cost the call that drafted them
    note: str | None = None                    # why a measurement is missing where it would be expected
    sink_attention: list[float] | None = None  # the drafter's attention mass on the prompt's first tokens
    self_attention: list[float] | None = None  # ... on this round's own drafts
    rest_attention: list[float] | None = None  # ... on the rest of the context
    attention_by_head: list[list[list[float]]] | None = None   # by depth, then head: [sink, drafts, rest]
    attention_error: str | None = None         # why the attention could not be measured

    def to_json(self) -> dict:
        return {name: value for name, value in asdict(self).items() if value is not None}


def error_record(request: str, why: str) -> dict:
    """The last record of a request whose recording ended: the records before it stand, no more follow."""
    return {"request": request, "error": why}


def attention_fields(by_depth: list, heads: bool) -> dict:
    """A record's attention fields from each depth's Masses (or why it has none, a str), averaged over this
    worker's query heads (and per head if asked)."""
    errors = [m for m in by_depth if isinstance(m, str)]
    if errors:
        return {"attention_error": errors[0]}
    fields = {"sink_attention": [fmean(m.sink) for m in by_depth],
              "self_attention": [fmean(m.drafts) for m in by_depth],
              "rest_attention": [fmean(m.rest) for m in by_depth]}
    if heads:
        fields["attention_by_head"] = [[list(h) for h in zip(m.sink, m.drafts, m.rest)] for m in by_depth]
    return fields
