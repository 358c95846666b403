"""Where two runs of one prompt part ways: the first step, depth and quantity that differ.

Two runs are aligned by answer position, not by step number: once acceptance differs the steps
shift, and a step of one run is compared with the step of the other that starts at the same
answer position. Within a step the quantities are compared in the order the drafter computes
them, depth by depth: the fed-back state's size (RMS), the attention on the sinks and on the
round's own drafts, the draft's probability, the draft itself; then the accepted count and the
tokens the step committed. The first difference is the divergence; everything after it follows
from it (or is a second cause hidden behind it).

A quantity one run did not observe (a vLLM server without the probe reports no drafts) is not
compared, and `compared` says which ones were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from playground.engines.events import ESTIMATED_STEPS, StepEvent, reconcile
from playground.engines.quantities import ATTENTION_QUANTITIES, BY_NAME, FED_BACK_RMS, REST_ATTENTION


@dataclass(frozen=True)
class Tolerance:
    """How far two values of one quantity may lie apart and still count as the same."""
    relative: float        # fed-back RMS and draft probability, relative to the first run's value
    attention: float       # attention masses (in [0, 1]), absolute

    def describe(self) -> str:
        return f"RMS and probability within {self.relative:g} relative, attention within {self.attention:g}"


# float32 engines agree to about 1e-6 (docs/vllm.md); 16-bit ones round each value to 3 digits.
TOLERANCES = {"float32": Tolerance(relative=1e-3, attention=1e-3),
              "bfloat16": Tolerance(relative=3e-2, attention=3e-2)}

# by depth, in the order the drafter computes them (the state it is fed, where it looks, what it drafts):
# (name in the report, StepEvent field, kind)
DRAFT_QUANTITIES = (*((q.diff_name, q.name, q.comparison) for q in (FED_BACK_RMS, *ATTENTION_QUANTITIES)),
                    ("draft_probability", "draft_probs", "relative"),
                    ("draft", "draft_ids", "exact"))


@dataclass(frozen=True)
class Divergence:
    step: int            # the first run's step (0 = the prefill)
    second_step: int     # the step of the second run that starts at the same answer position
    position: int        # answer position (0 = the first answer token) of the token concerned
    depth: int           # draft depth (1 = the first draft of the step); 0 for the step's own counts and tokens
    quantity: str        # a DRAFT_QUANTITIES name, "accepted", "token" or "answer_end"
    first: float | int | None
    second: float | int | None

    def to_json(self) -> dict:
        return {"step": self.step, "position": self.position, "depth": self.depth, "quantity": self.quantity,
                "first": self.first, "second": self.second, "second_step": self.second_step}


@dataclass(frozen=True)
class StepDiff:
    divergence: Divergence | None
    compared: tuple[str, ...]      # the quantities both runs observed
    steps_aligned: int             # steps of the first run with a partner in the second, up to the divergence

    @property
    def agree(self) -> bool:
        return self.divergence is None


def _differs(a: float, b: float, kind: str, tolerance: Tolerance) -> bool:
    """Whether two values of one quantity differ beyond the tolerance (a NaN differs from everything)."""
    if kind == "exact":
        return a != b
    if kind == "attention":
        return not abs(a - b) <= tolerance.attention
    return not abs(a - b) <= tolerance.relative * max(abs(a), 1e-12)


def _values(event: StepEvent, field: str) -> tuple:
    """A DRAFT_QUANTITIES field of a step, by depth."""
    return event.by_depth(BY_NAME[field]) if field in BY_NAME else getattr(event, field)


def _step_at(events: Sequence[StepEvent], position: int) -> int:
    """The step of `events` that committed the token at answer `position` (its last step past the end)."""
    start = events[0].position
    return next((e.step for e in events if e.position - start + len(e.token_ids) > position), events[-1].step)


def observed_quantities(first: Sequence[StepEvent], second: Sequence[StepEvent]) -> tuple[str, ...]:
    """The per-depth quantities both runs carry somewhere."""
    def carried(events: Sequence[StepEvent], field: str) -> bool:
        return any(_values(e, field) for e in events)
    return tuple(name for name, field, _ in DRAFT_QUANTITIES if carried(first, field) and carried(second, field))


def diff_steps(first: Sequence[StepEvent], second: Sequence[StepEvent], tolerance: Tolerance) -> StepDiff:
    """The first divergence of two runs of one prompt, or None where they agree. Accepted counts are
    compared only where both runs report them exactly (not estimated from a stream's chunks)."""
    if not first or not second:
        raise ValueError("a run without events has nothing to compare")
    first, second = reconcile(list(first)), reconcile(list(second))
    exact_counts = not any(ESTIMATED_STEPS in run[-1].observed for run in (first, second))
    compared = observed_quantities(first, second)
    # the rest of the context's attention is what sink and own leave: it parts only where one of them did,
    # and by up to both their tolerances where neither did
    kinds = {name: (field, kind) for name, field, kind in DRAFT_QUANTITIES
             if name in compared and name != REST_ATTENTION.diff_name}
    partners = {e.position - second[0].position: e for e in second}   # by answer position (from the prompt's end)
    answer = [t for e in second for t in e.token_ids]
    aligned = 0
    for event in first:
        at = event.position - first[0].position
        other = partners.get(at)
        if other is not None:
            aligned += 1
            depths = max((min(len(_values(event, f)), len(_values(other, f))) for f, _ in kinds.values()), default=0)
            for depth in range(1, depths + 1):
                for name, (field, kind) in kinds.items():
                    a, b = _values(event, field), _values(other, field)
                    if depth <= min(len(a), len(b)) and _differs(a[depth - 1], b[depth - 1], kind, tolerance):
                        return StepDiff(Divergence(event.step, other.step, at + depth - 1, depth, name,
                                                   a[depth - 1], b[depth - 1]), compared, aligned)
            last = event is first[-1] or other is second[-1]   # where the token budget cuts the drafts short
            if exact_counts and not last and event.step > 0 and event.accepted != other.accepted:
                return StepDiff(Divergence(event.step, other.step, at, 0, "accepted", event.accepted, other.accepted),
                                compared, aligned)
        for offset, token in enumerate(event.token_ids):
            position = at + offset
            if position >= len(answer):
                return StepDiff(Divergence(event.step, second[-1].step, position, 0, "answer_end", token, None),
                                compared, aligned)
            if answer[position] != token:
                return StepDiff(Divergence(event.step, _step_at(second, position), position, 0, "token",
                                           token, answer[position]), compared, aligned)
    length = sum(len(e.token_ids) for e in first)
    if length < len(answer):
        return StepDiff(Divergence(first[-1].step, _step_at(second, length), length, 0, "answer_end", None,
                                   answer[length]), compared, aligned)
    return StepDiff(None, compared, aligned)


@dataclass(frozen=True)
class DepthDifferences:
    """One quantity of two runs along the answer, for the steps both runs start at one answer position:
    second minus first at each depth (relative to the first run's value for RMS and probability), at the
    answer position the depth's draft concerns (a step starting at p drafts position p + d - 1 at depth
    d, as `Divergence.position` counts)."""
    quantity: str
    relative: bool
    by_depth: tuple[tuple[tuple[int, float], ...], ...]   # depth 1 first: (answer position, difference)


def differences_by_depth(first: Sequence[StepEvent], second: Sequence[StepEvent]) -> list[DepthDifferences]:
    """Every numeric per-depth quantity both runs observed, differenced step by step along the answer
    (the steps aligned as in `diff_steps`); what `diff_steps` finds first, drawn all the way."""
    first, second = reconcile(list(first)), reconcile(list(second))
    partners = {e.position - second[0].position: e for e in second}
    compared = observed_quantities(first, second)
    found = []
    for name, field, kind in DRAFT_QUANTITIES:
        if name not in compared or kind == "exact":
            continue
        by_depth: dict[int, list[tuple[int, float]]] = {}
        for event in first:
            at = event.position - first[0].position
            if (other := partners.get(at)) is None:
                continue
            for depth, (a, b) in enumerate(zip(_values(event, field), _values(other, field))):
                change = (b - a) / max(abs(a), 1e-12) if kind == "relative" else b - a
                by_depth.setdefault(depth, []).append((at + depth, change))
        found.append(DepthDifferences(name, kind == "relative", tuple(tuple(by_depth[d]) for d in sorted(by_depth))))
    return found
