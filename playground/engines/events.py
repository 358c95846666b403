"""StepEvent: the one record every engine emits per verify step, and every consumer reads.

Reference and vLLM engines fill the same fields; what a backend cannot observe stays empty
(e.g. vLLM does not expose rejected draft ids or drafter attention) and `observed` says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class StepEvent:
    step: int                           # 0 = the prefill, which drafts nothing
    position: int                       # sequence position of the first committed token
    token_ids: tuple[int, ...]          # tokens committed this step, in order
    token_texts: tuple[str, ...]        # their text, incrementally detokenised (joins to the answer)
    draft_ids: tuple[int, ...] = ()     # the drafter's proposal, in the target vocabulary
    draft_texts: tuple[str, ...] = ()   # each draft token decoded alone (for display)
    drafted: int = 0                    # drafts verified this step (known even where their ids are not)
    accepted: int = 0                   # drafts accepted: token_ids[:accepted] == draft_ids[:accepted]
    draft_probs: tuple[float, ...] = ()     # drafter probability of each draft, by depth
    sink_attention: tuple[float, ...] = ()  # drafter attention mass on the sink keys, by depth
    self_attention: tuple[float, ...] = ()  # ... on keys drafted earlier in this round, by depth
    hidden_norm: tuple[float, ...] = ()     # RMS of the state fed into each draft depth
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    elapsed_s: float = 0.0              # engine time since the request started (waits excluded)
    finish_reason: str | None = None    # "eos" | "length" | "context" on the last event
    backend: str = "reference"
    observed: tuple[str, ...] = field(default=("drafts", "attention", "hidden_norm"))

    @property
    def text(self) -> str:
        return "".join(self.token_texts)

    @property
    def accept_flags(self) -> tuple[bool, ...]:
        return tuple(i < self.accepted for i in range(self.drafted))

    @property
    def rejected_ids(self) -> tuple[int, ...]:
        return self.draft_ids[self.accepted:]

    def to_json(self) -> dict:
        out = asdict(self)
        out["text"] = self.text
        out["accept_flags"] = list(self.accept_flags)
        return out
