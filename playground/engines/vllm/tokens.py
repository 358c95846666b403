"""Prompts templated and tokenised by the vLLM server itself, and token texts decoded by it, so the
playground needs nothing of the served model: its tokenizer and chat template stay on the server.

The model's own template goes through `/tokenize` with the messages (the server applies the
model's chat template); the perturbed formats are rendered here as text and tokenised there.
Each streamed chunk's text is the server's own decode; it is split over the chunk's tokens by
decoding each token alone (`/detokenize`, cached per id).
"""

from __future__ import annotations

import httpx

from playground.engines import chat
from playground.engines.request import GenerationRequest, fitting
from playground.engines.vllm.api import call_json


class ServerTokenizer:
    def __init__(self, url: str, model: str, client: httpx.Client):
        self.url, self.model, self.client = url, model, client
        self._pieces: dict[int, str] = {}

    def prompt_ids(self, request: GenerationRequest, max_context: int) -> list[int]:
        if request.template == chat.DEFAULT_TEMPLATE:
            body = {"model": self.model, "messages": request.messages, "add_generation_prompt": True}
        else:
            body = {"model": self.model, "prompt": chat.render(None, request.messages, request.template),
                    "add_special_tokens": False}
        return fitting(list(self._post("/tokenize", body)["tokens"]), max_context)

    def texts(self, ids: list[int], text: str) -> tuple[str, ...]:
        """Each token's share of `text`, the server's decode of `ids` as it streamed them: its own
        decode where that is the next part of `text`, else nothing (a special token, part of a
        character); what is left over goes to the last token."""
        shares, at = [], 0
        for token_id in ids:
            piece = self.piece(token_id)
            matches = bool(piece) and text.startswith(piece, at)
            shares.append(piece if matches else "")
            at += len(piece) if matches else 0
        if shares and at < len(text):
            shares[-1] += text[at:]
        return tuple(shares)

    def piece(self, token_id: int) -> str:
        if token_id not in self._pieces:
            self._pieces[token_id] = self._post("/detokenize", {"model": self.model, "tokens": [token_id]})["prompt"]
        return self._pieces[token_id]

    def _post(self, path: str, body: dict) -> dict:
        return call_json(self.client, "POST", self.url, path, json=body)
