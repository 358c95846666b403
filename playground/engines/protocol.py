"""What every consumer (the page, the CLI, the benchmark) may ask of an engine, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

from playground.engines.drafters import DrafterInfo
from playground.engines.events import StepEvent
from playground.engines.request import GenerationRequest


@dataclass(frozen=True)
class Capabilities:
    """What an engine can run and how it computes: what callers ask instead of its name or type."""
    trees: bool = False                   # draft trees (GenerationRequest.tree), besides chains
    draft_stops: bool = False             # a draft stop rule (GenerationRequest.draft_stop)
    concurrent: bool = False              # requests run in parallel (else they take turns, step by step)
    dtype: str = "float32"                # the coarsest precision it computes in: how far two runs' values
                                          # may differ by rounding (step_diff.TOLERANCES)
    in_process: bool = False              # computes in this process, as the page's stored runs were recorded
    remote: bool = False                  # runs on servers: describe() says what each one serves
    servers: tuple[tuple[str, str], ...] = ()   # (drafter, URL) of each server behind it, once they are up


class Engine(Protocol):
    name: str
    drafter_names: tuple[str, ...]   # the drafters it runs by name (variants.NAMES or a subset)
    capabilities: Capabilities

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

    def describe(self) -> list[tuple[str, str, str]]:
        """(drafter, URL, what its server serves or why it cannot be used) for each server behind it."""
        ...
