"""A generation request and its validation, shared by the CLI, the UI and the benchmark."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from playground.engines import chat
from playground.engines.chat import DEFAULT_TEMPLATE, TEMPLATES
from playground.engines.draft_stop import DraftStop
from playground.engines.sampling import SamplingParams
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.model.variants import EAGLE31, NONE

K_RANGE = (1, 10)
MAX_TEMPERATURE = 5.0
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    system: str | None = None
    template: str = DEFAULT_TEMPLATE
    drafter: str = EAGLE31             # a name of variants.NAMES, or a checkpoint folder
    k: int = 5
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int = 0
    history: tuple[dict, ...] = field(default=())  # earlier turns, {"role", "content"}
    tree: TreeShape | None = None      # draft trees instead of chains (the reference engine; k is unused)
    draft_stop: DraftStop | None = None   # ends a chain early (the reference engine; k is then the longest)

    def to_json(self) -> dict:
        """The request as the exports write it: every field, the stop rule as its text."""
        return {**asdict(self), "draft_stop": str(self.draft_stop) if self.draft_stop else None}

    @classmethod
    def from_json(cls, data: dict) -> "GenerationRequest":
        tree = TreeShape(**data["tree"]) if data.get("tree") else None
        stop = DraftStop.parse(data["draft_stop"]) if data.get("draft_stop") else None
        return cls(**{**data, "history": tuple(data["history"]), "tree": tree, "draft_stop": stop})

    @property
    def messages(self) -> list[dict]:
        return chat.build_messages(self.prompt, self.system, self.history)

    def prompt_ids(self, tokenizer, max_context: int) -> list[int]:
        """The conversation in its template, as token ids; refused if it leaves no room to answer.
        Every engine holding the tokenizer encodes prompts here, so all of them see the same tokens."""
        return fitting(chat.encode(tokenizer, self.messages, self.template), max_context)

    @property
    def drafting(self) -> str:
        """How it drafts, in a few words: "chain k=5", "tree 2/4/8", or "–" without a drafter."""
        if self.drafter == NONE:
            return "–"
        if self.tree:
            return str(self.tree)
        return f"chain k<={self.k} until {self.draft_stop}" if self.draft_stop else f"chain k={self.k}"

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p)

    def validate(self, max_tokens_limit: int | None = None) -> "GenerationRequest":
        """Raise PlaygroundError with a one-line reason for anything out of range."""
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise PlaygroundError("the prompt is empty", "prompt")
        if self.template not in TEMPLATES:
            raise PlaygroundError(f"unknown template {self.template!r}; choose from {', '.join(TEMPLATES)}", "template")
        check_k(self.k)
        if not math.isfinite(self.temperature) or not (0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise PlaygroundError(f"temperature must be between 0 and {MAX_TEMPERATURE:g}, got {self.temperature}", "temperature")
        if not math.isfinite(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise PlaygroundError(f"top-p must be in (0, 1], got {self.top_p}", "top_p")
        check_max_tokens(self.max_tokens, max_tokens_limit)
        if self.tree is not None:
            self.tree.validate()
            if self.draft_stop is not None:
                raise PlaygroundError("a draft stop rule ends chains: choose chains, or no rule", "draft_stop")
        return self


def check_k(k: int) -> int:
    """Drafts per step: a PlaygroundError outside K_RANGE."""
    if not (K_RANGE[0] <= k <= K_RANGE[1]):
        raise PlaygroundError(f"k must be between {K_RANGE[0]} and {K_RANGE[1]}, got {k}", "k")
    return k


def check_max_tokens(max_tokens: int, limit: int | None = None) -> int:
    """New tokens asked for: at least 1, and at most `limit` where there is one."""
    if max_tokens < 1:
        raise PlaygroundError(f"max tokens must be at least 1, got {max_tokens}", "max_tokens")
    if limit is not None and max_tokens > limit:
        raise PlaygroundError(f"max tokens is limited to {limit}, got {max_tokens}", "max_tokens")
    return max_tokens


def fitting(prompt_ids: list[int], max_context: int) -> list[int]:
    """The prompt's ids, or a PlaygroundError if they leave no room to answer."""
    if len(prompt_ids) >= max_context:
        raise PlaygroundError(f"the prompt is {len(prompt_ids)} tokens; the context holds {max_context}")
    return prompt_ids
