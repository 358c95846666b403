"""Ready-made prompts for the page: everyday chat, code, a long document, an odd system prompt."""

from __future__ import annotations

from dataclasses import dataclass

from playground.prompts.sets import report_prompt


@dataclass(frozen=True)
class Preset:
    prompt: str
    system: str = ""
    template: str = "model"


PRESETS = {
    "Chat": Preset("What are three good habits for staying healthy while working from home?"),
    "Code": Preset("Write a Python function that checks whether a string is a palindrome, ignoring case "
                   "and punctuation, and show two examples."),
    "Long document Q&A": Preset(report_prompt(
        "Why did the Harbor Street project cost more than planned, and how was the extra cost approved?")),
    "Odd system prompt": Preset("Explain how a rainbow forms.",
                                system="You are a pirate who answers every question in pirate speech."),
    "Perturbed template": Preset("Give me a short recipe for pancakes.", template="plain"),
}
# The Comparison tab's "See attention drift": of the prompts tried for it (code being where EAGLE 3.1
# leads most in `train eval`), the one where 3.1 leads most and the drift is plainest (README)
DRIFT_EXAMPLE = PRESETS["Code"]
