"""Prompt formats: the model's own chat template and perturbed variants.

Perturbed formats are how EAGLE 3.1's robustness claim is tested: the drafter was trained on
the model's own template only, so plain "User:/Assistant:" text or markdown headings shift
the target's hidden states away from what the drafter has seen.
"""

from __future__ import annotations

from typing import Sequence

DEFAULT_TEMPLATE = "model"
PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


def _plain(messages: Sequence[dict]) -> str:
    lines = [f"{PLAIN_ROLES[m['role']]}: {m['content']}" for m in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"


def _markdown(messages: Sequence[dict]) -> str:
    parts = [f"### {PLAIN_ROLES[m['role']]}\n{m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\n### Assistant\n"


TEMPLATES = {
    "model": "the model's own chat template (ChatML for SmolLM2)",
    "plain": "plain text: 'User: ...' / 'Assistant:'",
    "markdown": "markdown headings: '### User' / '### Assistant'",
}


def build_messages(prompt: str, system: str | None = None, history: Sequence[dict] = ()) -> list[dict]:
    messages = [{"role": "system", "content": system}] if system else []
    return messages + list(history) + [{"role": "user", "content": prompt}]


def render(tokenizer, messages: Sequence[dict], template: str = DEFAULT_TEMPLATE) -> str:
    """The prompt text. With the model's template and no system message, the model's default
    system prompt is used (SmolLM2's template inserts one)."""
    if template == "model":
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    if template == "plain":
        return _plain(messages)
    if template == "markdown":
        return _markdown(messages)
    raise KeyError(template)


def user_turn_prefix(tokenizer, system: str | None = None) -> str:
    """The model's template up to the start of a user message's text (after the system turn):
    what the model continues when it writes a user prompt itself."""
    sentinel = "\x00USER\x00"
    rendered = tokenizer.apply_chat_template(build_messages(sentinel, system), tokenize=False)
    return rendered[:rendered.index(sentinel)]


def encode(tokenizer, messages: Sequence[dict], template: str = DEFAULT_TEMPLATE) -> list[int]:
    return tokenizer(render(tokenizer, messages, template), add_special_tokens=False).input_ids
