"""Readable, coloured rendering of StepEvents in a terminal (the CLI without --json)."""

from __future__ import annotations

import sys
from typing import TextIO

from playground.engines.events import StepEvent
from playground.engines.stats import RunSummary

GREEN, BLUE, RED, RESET, STRIKE = "\033[32m", "\033[34m", "\033[31m", "\033[0m", "\033[9m"


def legend(color: bool) -> str:
    if not color:
        return "accepted draft | target token | [-rejected draft-]"
    return f"{GREEN}accepted draft{RESET}  {BLUE}target token{RESET}  {RED}{STRIKE}rejected draft{RESET}"


def render_step(event: StepEvent, color: bool) -> str:
    parts = []
    for i, text in enumerate(event.token_texts):
        is_draft = i < event.accepted and event.step > 0
        parts.append(f"{GREEN if is_draft else BLUE}{text}{RESET}" if color else text)
    rejected = "".join(event.rejected_texts)
    if rejected:
        # shown after the accepted drafts; the target's own token follows it in the text
        shown = rejected.replace("\n", "\\n")
        tag = f"{RED}{STRIKE}{shown}{RESET}" if color else f"[-{shown}-]"
        parts.insert(event.accepted, tag)
    return "".join(parts)


def render_summary(s: RunSummary) -> str:
    acc = " ".join(f"{a:.2f}" for a in s.per_position_acceptance)
    return (f"{s.tokens} tokens in {s.elapsed_s:.2f}s ({s.tokens_per_s:.1f} tok/s), {s.steps} verify steps, "
            f"{s.tokens_per_pass:.2f} tokens per target pass (tau {s.mean_acceptance_length:.2f} over the steps "
            f"that drafted), acceptance by depth [{acc}], finish: {s.finish_reason}")


def stream(events, out: TextIO = sys.stdout, color: bool | None = None) -> list[StepEvent]:
    color = out.isatty() if color is None else color
    seen = []
    for event in events:
        out.write(render_step(event, color))
        out.flush()
        seen.append(event)
    out.write("\n")
    return seen


def to_stderr(line: str) -> None:
    """A status line (servers starting, files written) where it does not mix with the answer."""
    print(line, file=sys.stderr)
