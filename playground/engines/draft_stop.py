"""A rule that ends a chain early: `--draft-stop "probability<0.3"`, `"self_attention>0.4"`, or several
joined by commas (the chain stops at the first draft for which any of them holds).

Each rule reads one thing the drafter measured while drafting that depth: its probability of the draft,
its attention on the sink tokens, on this round's earlier drafts and on the rest of the context, and the
RMS of the state fed into the depth (quantities.DEPTH_QUANTITIES). The draft that meets a rule is dropped and drafting ends, so the chain holds the drafts
before it (none, if the first met it: that step decodes one token). k stays the longest chain.

It stays lossless: whether a draft is kept depends on the drafter alone, never on the target. At
temperature 0 verification then accepts exactly what it would of that shorter chain: the target's
greedy tokens. Sampling needs one more step, since a probability rule reads the draft just drawn: a
kept draft was drawn from the drafter's distribution restricted to the tokens the rule keeps, so it is
verified against that (`restricted`), and a dropped one leaves the target to sample the position
itself; together the position follows the target's distribution. The other signals are measured
before the draft is drawn and keep or drop every token alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from playground.engines.quantities import DEPTH_QUANTITIES
from playground.errors import PlaygroundError

SIGNALS = {"probability": "the drafter's probability of the draft", **{q.name: q.description for q in DEPTH_QUANTITIES}}
_RULE = re.compile(r"^\s*([a-z_]+)\s*([<>])\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Rule:
    signal: str
    below: bool          # stop when the signal is below the threshold (else above it)
    threshold: float

    def holds(self, value):
        """Whether the rule holds at `value` (a float, or a tensor elementwise)."""
        return value < self.threshold if self.below else value > self.threshold

    def __str__(self) -> str:
        return f"{self.signal}{'<' if self.below else '>'}{self.threshold!r}"


@dataclass(frozen=True)
class DraftStop:
    rules: tuple[Rule, ...]

    @classmethod
    def parse(cls, text: str) -> "DraftStop":
        """"probability<0.3,self_attention>0.4" -> its rules; a PlaygroundError naming what is wrong."""
        rules = []
        for part in text.split(","):
            match = _RULE.match(part)
            if match is None:
                raise PlaygroundError(f"a draft stop rule reads SIGNAL<VALUE or SIGNAL>VALUE (e.g. probability<0.3), "
                                      f"got {part.strip()!r}", "draft_stop")
            signal, sign, value = match.groups()
            if signal not in SIGNALS:
                raise PlaygroundError(f"unknown signal {signal!r} in a draft stop rule; choose from "
                                      f"{', '.join(SIGNALS)}", "draft_stop")
            try:
                threshold = float(value)
            except ValueError:
                threshold = math.nan
            if not math.isfinite(threshold):
                raise PlaygroundError(f"the threshold of {part.strip()!r} is not a number", "draft_stop")
            rules.append(Rule(signal, sign == "<", threshold))
        return cls(tuple(rules))

    def stops(self, **measured: float) -> bool:
        """Whether a draft with these measurements (by SIGNALS name) ends the chain."""
        return any(r.holds(measured[r.signal]) for r in self.rules)

    def restricted(self, q: torch.Tensor) -> torch.Tensor:
        """The draft distribution `q` [V] restricted to the tokens the probability rules keep, renormalised:
        what a kept draft was drawn from (the chain did not stop at it, so no other rule held there)."""
        keep = torch.ones_like(q, dtype=torch.bool)
        for r in (r for r in self.rules if r.signal == "probability"):
            keep &= ~r.holds(q)
        kept = q * keep
        return kept / kept.sum()

    def __str__(self) -> str:
        return ",".join(map(str, self.rules))
