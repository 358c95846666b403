"""What every consumer (the page, the CLI, the benchmark) may ask of an engine, and nothing more."""

from __future__ import annotations

from typing import Iterator, Protocol

from playground.engines.drafters import DrafterInfo
from playground.engines.events import StepEvent
from playground.engines.request import GenerationRequest


class Engine(Protocol):
    name: str
    drafter_names: tuple[str, ...]   # the drafters it runs by name (variants.NAMES or a subset)

    def check(self, request: GenerationRequest) -> None:
        """Raise PlaygroundError for a request this engine would refuse (out of range, a prompt past its
        context), without running it: the page asks before it queues a run."""
        ...

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        """Validate, then stream one StepEvent per verify step (the first is the prefill)."""
        ...

    def drafter_info(self, name: str) -> DrafterInfo: ...

    def limitations(self, drafter: str) -> str:
        """What this engine cannot show of a run with `drafter`, in a sentence for the page ('' for nothing)."""
        ...
