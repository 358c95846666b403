"""Incremental detokenisation: each token's share of the text, exactly.

Decoding one token alone breaks multi-byte characters and drops the leading space some
tokenizers attach to the previous token; decoding a short window (vLLM's prefix/read offsets)
gives each token the text it adds, so the pieces join to the full decode.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids or [])[-6:]  # a little context for spacing
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append a token; return the text it completes (may be '' mid-character)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix:self.read])
        full_text = self._decode(self.ids[self.prefix:])
        if full_text.endswith(REPLACEMENT) or len(full_text) <= len(prefix_text):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return full_text[len(prefix_text):]


def token_text(tokenizer, token_id: int) -> str:
    """One token decoded alone, for display (special tokens shown by name)."""
    return tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
