"""Two drafting columns of the Comparison tab compared step by step: only where the comparison means
something (one drafter, greedy, one k, on two backends or settings), with what first differs, its
outline on the answers and the differences along the answer depth by depth (engines/step_diff.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from playground import plots
from playground.engines.protocol import Engine
from playground.engines.quantities import DEPTH_QUANTITIES
from playground.engines.step_diff import (TOLERANCES, Divergence, StepDiff, Tolerance, differences_by_depth,
                                          diff_steps)
from playground.ui.runs import RunLog

QUANTITY_NAMES = {**{q.diff_name: f"the {q.label}" for q in DEPTH_QUANTITIES},
                  "draft_probability": "the draft's probability", "draft": "the draft", "accepted": "the accepted count",
                  "token": "the token", "answer_end": "the answer's end"}


@dataclass(frozen=True)
class ColumnsDiff:
    """Two drafting columns, by name, and where they first differ step by step."""
    first: str
    second: str
    diff: StepDiff
    tolerance: Tolerance


def step_tolerance(engine: Engine) -> Tolerance:
    """How far two runs' values may differ by rounding alone: bfloat16's where the engine computes in
    bfloat16, else float32's (the vLLM servers the playground starts run float32; `python -m playground
    diff --dtype` compares others)."""
    return TOLERANCES[engine.capabilities.dtype]


def step_diff(logs: Mapping[str, RunLog], tolerance: Tolerance = TOLERANCES["float32"]) -> ColumnsDiff | None:
    """Where the two drafting columns first differ, step by step (engines/step_diff.py, what `python -m
    playground diff` reports), for two greedy chain runs of one drafter and one k (two settings or two
    backends of it); None otherwise: two different drafters differ from their first draft on, which
    says nothing (the plots compare them depth by depth)."""
    drafting = [(name, log) for name, log in logs.items()
                if any(e.drafted for e in log.events) and not any(e.tree_ids for e in log.events)]
    if len(drafting) != 2 or {(log.request.drafter, log.request.temperature, log.request.k) for _, log in drafting} != {
            (drafting[0][1].request.drafter, 0.0, drafting[0][1].request.k)}:
        return None
    (first, a), (second, b) = drafting
    return ColumnsDiff(first, second, diff_steps(a.steps, b.steps, tolerance), tolerance)


def divergence_text(d: Divergence) -> str:
    where = f"depth {d.depth}" if d.depth else "its own counts"
    values = " against ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in (d.first, d.second))
    return f"step {d.step} ({where}): {QUANTITY_NAMES[d.quantity]}, {values}"


def step_note(steps: ColumnsDiff | None) -> str:
    if steps is None:
        return ""
    if steps.diff.agree:
        return f"Step by step, {steps.first} and {steps.second} agree at every step ({steps.tolerance.describe()}). "
    return (f"Step by step, {steps.first} and {steps.second} first differ at "
            f"{divergence_text(steps.diff.divergence)} (outlined). ")


def step_figure(logs: Mapping[str, RunLog], steps: ColumnsDiff | None):
    """The two drafting columns' quantities differenced along the answer, depth by depth (None where
    there is no step diff: the page hides the empty plot)."""
    if steps is None:
        return None
    divergence = steps.diff.divergence
    return plots.step_differences(differences_by_depth(logs[steps.first].steps, logs[steps.second].steps),
                                  steps.first, steps.second, divergence.position if divergence else None)


def divergence_marks(steps: ColumnsDiff | None) -> dict[str, tuple[int, str]]:
    """Per drafting column, the step to outline as the first difference from the other, and why."""
    if steps is None or steps.diff.agree:
        return {}
    divergence = steps.diff.divergence
    why = f"first difference from the run beside it: {divergence_text(divergence)}"
    return {steps.first: (divergence.step, why), steps.second: (divergence.second_step, why)}
