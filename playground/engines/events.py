"""StepEvent: the one record every engine emits per verify step, and every consumer reads.

Reference and vLLM engines fill the same fields; what a backend cannot observe stays empty
(e.g. a vLLM server without the probe reports accept counts, not drafts nor the drafter's
internals) and `observed` says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Iterable

from playground.engines.quantities import REST_ATTENTION, DepthQuantity, rest_of


@dataclass(frozen=True)
class StepEvent:
    step: int                           # 0 = the prefill, which drafts nothing
    position: int                       # sequence position of the first committed token
    token_ids: tuple[int, ...]          # tokens committed this step, in order
    token_texts: tuple[str, ...]        # their text, incrementally detokenised (joins to the answer)
    draft_ids: tuple[int, ...] = ()     # the drafter's proposal, in the target vocabulary
    draft_texts: tuple[str, ...] = ()   # each draft token decoded alone (for display)
    drafted: int = 0                    # drafts verified this step (known even where their ids are not);
                                        # fewer than draft_ids when the sequence ended on an accepted draft
    accepted: int = 0                   # drafts accepted: token_ids[:accepted] == draft_ids[:accepted]
    draft_probs: tuple[float, ...] = ()     # drafter probability of each draft, by depth
    sink_attention: tuple[float, ...] = ()  # drafter attention mass on the sink keys, by depth
    self_attention: tuple[float, ...] = ()  # ... on keys drafted earlier in this round, by depth
    hidden_norm: tuple[float, ...] = ()     # RMS of the state fed into each draft depth
    rest_attention: tuple[float, ...] = ()  # ... on the rest of the context, as the backend reported it (by_depth)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    elapsed_s: float = 0.0              # engine time since the request started (waits excluded)
    finish_reason: str | None = None    # "eos" | "length" | "context" on the last event ("stopped": its reader stopped it)
    backend: str = "reference"
    observed: tuple[str, ...] = field(default=("drafts", "attention", "hidden_norm"))
    note: str = ""                      # what the backend stopped observing in this run and why (vLLM's probe
                                        # stopping mid-answer), on every event from the one where it stopped
    # Backends that learn the exact step boundaries only at the end (vLLM: chunks can merge
    # steps) put the accepted / drafted count of every verify step on the last event.
    step_accepted: tuple[int, ...] = ()
    step_drafted: tuple[int, ...] = ()
    # Tree mode (engines/tree.py): every drafted node in creation order; the fields above then
    # describe the tree's main line (tree.main_line), so chain consumers read a tree step correctly.
    tree_ids: tuple[int, ...] = ()
    tree_texts: tuple[str, ...] = ()
    tree_parents: tuple[int, ...] = ()      # index of the parent node; -1: the last committed token
    tree_depths: tuple[int, ...] = ()       # 1 for the root's children
    tree_probs: tuple[float, ...] = ()      # drafter probability given the parent
    tree_scores: tuple[float, ...] = ()     # cumulative log-probability, the rank in the tree
    tree_path: tuple[int, ...] = ()         # the accepted nodes, depth 1 first

    def by_depth(self, quantity: DepthQuantity) -> tuple[float, ...]:
        """The values of one of the drafter's quantities (quantities.DEPTH_QUANTITIES), by depth; the rest
        of the context's attention, where the backend did not report it, from the sink's and own drafts'."""
        if quantity is REST_ATTENTION and not self.rest_attention:
            return rest_of(self.sink_attention, self.self_attention)
        return getattr(self, quantity.name)

    @property
    def text(self) -> str:
        return "".join(self.token_texts)

    @property
    def rejected_texts(self) -> tuple[str, ...]:
        """The drafts the target verified and refused, as the drafter's text (empty where unreported)."""
        return self.draft_texts[self.accepted:self.drafted]

    @property
    def accept_flags(self) -> tuple[bool, ...]:
        return tuple(i < self.accepted for i in range(self.drafted))

    @property
    def draft_verdicts(self) -> tuple[str, ...]:
        """accepted | rejected | not reached, per draft depth of the chain (a tree's main line): the
        first draft after the accepted ones was verified and refused, the ones after it never verified."""
        return tuple("accepted" if d < self.accepted else "rejected" if d == self.accepted < self.drafted
                     else "not reached" for d in range(max(self.drafted, len(self.draft_ids))))

    @property
    def tree_verdicts(self) -> tuple[str, ...]:
        """accepted | rejected (verified: its parent was accepted, it was not) | unreached, per node.
        When the sequence ended on the path's last node (no target token after it), its children
        were never verified."""
        path = set(self.tree_path)
        ended = len(self.token_ids) == len(self.tree_path)
        verified_parents = {-1, *(self.tree_path[:-1] if ended else self.tree_path)}
        return tuple("accepted" if i in path else "rejected" if p in verified_parents else "unreached"
                     for i, p in enumerate(self.tree_parents))

    def to_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> dict:
        out = asdict(self)
        out["text"] = self.text
        out[REST_ATTENTION.name] = self.by_depth(REST_ATTENTION)
        out["accept_flags"] = list(self.accept_flags)
        if self.tree_ids:
            out["tree_verdicts"] = list(self.tree_verdicts)
        return out

    @classmethod
    def from_json(cls, data: dict) -> StepEvent:
        """The event `to_json` wrote (the values it derives, like `text`, are left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names})


EXACT_STEPS = "steps"   # in `observed`: the events are the verify steps themselves (the vLLM probe, or reconciled)
ESTIMATED_STEPS = "chunks"   # ... steps and counts estimated from a stream's chunks (a vLLM server without them)


def ended(events: list[StepEvent]) -> list[StepEvent]:
    """A run's events so far: its exact verify steps (reconcile) once the last event ends the stream,
    as they came before. Every consumer of a stream reads a run through this, or through collect."""
    return reconcile(events) if events and events[-1].finish_reason is not None else events


def collect(stream: Iterable[StepEvent]) -> list[StepEvent]:
    """A whole run, as its exact verify steps."""
    return ended(list(stream))


def reconcile(events: list[StepEvent]) -> list[StepEvent]:
    """The exact verify steps, where the last event reports them (`step_accepted`): the committed
    tokens re-split so that step i holds its accepted drafts plus the target's token, and marked as the
    steps (EXACT_STEPS), so that reconciling them again returns them at once. Streams without that
    report, or whose events already are the steps, are returned as they are."""
    if not events or not events[-1].step_accepted or EXACT_STEPS in events[-1].observed:
        return events
    last = events[-1]
    ids = [t for e in events for t in e.token_ids]
    texts = [t for e in events for t in e.token_texts]
    elapsed = [e.elapsed_s for e in events for _ in e.token_ids]   # when each token arrived
    drafted = last.step_drafted or (0,) * len(last.step_accepted)
    sizes = [1] + [a + 1 for a in last.step_accepted]
    steps, start, position = [], 0, events[0].position
    for i, size in enumerate(sizes):
        end = min(start + size, len(ids))
        if start >= end:
            break
        steps.append(replace(events[0], observed=last.observed + (EXACT_STEPS,), note=last.note, step=i,
                             position=position + start,
                             token_ids=tuple(ids[start:end]),
                             token_texts=tuple(texts[start:end]), drafted=drafted[i - 1] if i else 0,
                             accepted=last.step_accepted[i - 1] if i else 0, elapsed_s=elapsed[end - 1],
                             finish_reason=None, step_accepted=(), step_drafted=()))
        start = end
    if start < len(ids):   # more tokens than the counts account for: keep them, in the last step
        steps[-1] = replace(steps[-1], token_ids=steps[-1].token_ids + tuple(ids[start:]),
                            token_texts=steps[-1].token_texts + tuple(texts[start:]))
    steps[-1] = replace(steps[-1], finish_reason=last.finish_reason, step_accepted=last.step_accepted,
                        step_drafted=last.step_drafted)
    return steps
