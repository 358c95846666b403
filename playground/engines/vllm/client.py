"""The vLLM backend: StepEvents from `vllm serve` servers (one per drafter) over the OpenAI API.

Each request streams /v1/completions with `return_token_ids` and `stream_options.include_usage`;
servers run with `--per-request-spec-decode-metrics detailed`, so the final usage chunk holds
the accepted and drafted count of every verify step. While streaming, each chunk becomes one
provisional step (a chunk is one engine step unless the server merged several because the
client lagged); the last event carries the server's per-step counts, and `reconcile` re-splits
the tokens into the exact steps. vLLM does not report rejected draft tokens or drafter attention,
so those fields stay empty and `observed` says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Iterator

import httpx

from playground.engines.drafters import DrafterInfo
from playground.engines.events import StepEvent
from playground.engines.request import GenerationRequest
from playground.engines.text import IncrementalDetokenizer
from playground.errors import PlaygroundError
from playground.model.variants import NONE

OBSERVED = ("counts",)
FINISH = {"stop": "eos", "length": "length"}


@dataclass(frozen=True)
class Server:
    """One `vllm serve` process serving the target with one drafter (or none)."""
    drafter: str                 # eagle3 | eagle3.1 | none
    url: str                     # e.g. http://127.0.0.1:8101
    k: int = 5                   # num_speculative_tokens it was started with
    model: str = "smollm2"       # --served-model-name
    source: str = ""             # the drafter checkpoint folder it serves
    trained: bool = True


class VLLMEngine:
    name = "vllm"
    shows_drafter_internals = False

    def __init__(self, servers: list[Server], tokenizer, max_context: int, eos_ids: set[int],
                 max_tokens_limit: int | None = None, timeout_s: float = 120.0):
        self.servers = {s.drafter: s for s in servers}
        self.tokenizer, self.max_context, self.eos_ids = tokenizer, max_context, eos_ids
        self.max_tokens_limit, self.timeout_s = max_tokens_limit, timeout_s

    def server(self, drafter: str) -> Server:
        if drafter not in self.servers:
            raise PlaygroundError(f"no vLLM server for drafter {drafter!r}; this backend serves "
                                  f"{', '.join(self.servers)}")
        return self.servers[drafter]

    def drafter_info(self, name: str) -> DrafterInfo:
        s = self.server(name)
        return DrafterInfo(name, name, s.source, trained=s.trained)

    def limitations(self, drafter: str) -> str:
        return ("vLLM reports how many drafts each step accepted, not which tokens it rejected (shown as ✗) nor "
                f"the drafter's attention; it drafts k = {self.server(drafter).k} per step, fixed when the server "
                "starts.")

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        """Validate, then stream StepEvents from the server for `request.drafter`.

        The server's k is fixed when it starts; `request.k` does not change it."""
        request.validate(self.max_tokens_limit)
        server = self.server(request.drafter)
        prompt_ids = request.prompt_ids(self.tokenizer, self.max_context)
        max_tokens = min(request.max_tokens, self.max_context - len(prompt_ids))
        body = {"model": server.model, "prompt": prompt_ids, "max_tokens": max_tokens,
                "temperature": request.temperature, "top_p": request.top_p, "seed": request.seed,
                "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
        return self._stream(server, body, prompt_ids, context_bound=max_tokens < request.max_tokens)

    def _stream(self, server: Server, body: dict, prompt_ids: list[int], context_bound: bool) -> Iterator[StepEvent]:
        t0 = time.perf_counter()
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        k = 0 if server.drafter == NONE else server.k
        position, step, pending = len(prompt_ids), 0, None
        finish, metrics = None, None
        for chunk in self._chunks(server, body):
            if chunk.get("choices"):
                choice = chunk["choices"][0]
                ids = [int(t) for t in choice.get("token_ids") or []]
                finish = choice.get("finish_reason") or finish
                for ids_step in ([ids[:1], ids[1:]] if step == 0 and len(ids) > 1 else [ids]):
                    if not ids_step:
                        continue
                    if pending is not None:
                        yield pending
                    drafted = 0 if step == 0 else k
                    pending = StepEvent(
                        step=step, position=position, token_ids=tuple(ids_step),
                        token_texts=tuple(detok.add(t) for t in ids_step),
                        drafted=drafted, accepted=min(len(ids_step) - 1, drafted),
                        elapsed_s=time.perf_counter() - t0, backend=self.name, observed=OBSERVED)
                    position += len(ids_step)
                    step += 1
            if chunk.get("usage") is not None:
                metrics = (chunk.get("metrics") or {}).get("speculative_decoding")
        if pending is None:
            raise PlaygroundError(f"the vLLM server at {server.url} returned no tokens")
        reason = "context" if context_bound and finish == "length" else FINISH.get(finish, finish or "length")
        counts = {}
        if metrics and metrics.get("per_step_accepted") is not None:
            counts = {"step_accepted": tuple(metrics["per_step_accepted"]),
                      "step_drafted": tuple(metrics.get("per_step_drafted") or ())}
        yield StepEvent(**{**pending.to_fields(), "finish_reason": reason,
                           "elapsed_s": time.perf_counter() - t0, **counts})

    def _chunks(self, server: Server, body: dict) -> Iterator[dict]:
        """Parsed server-sent events up to [DONE]; every way the stream can fail is a PlaygroundError."""
        url = f"{server.url}/v1/completions"
        try:
            with httpx.stream("POST", url, json=body, timeout=httpx.Timeout(self.timeout_s, connect=5.0)) as r:
                if r.status_code != 200:
                    raise PlaygroundError(f"the vLLM server at {server.url} answered {r.status_code}: "
                                          f"{_error_text(r.read())}")
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        raise PlaygroundError(f"malformed stream from the vLLM server at {server.url}: "
                                              f"{data[:80]!r}") from None
                    if not isinstance(chunk, dict):
                        raise PlaygroundError(f"malformed stream from the vLLM server at {server.url}")
                    if "error" in chunk:
                        raise PlaygroundError(f"the vLLM server at {server.url} failed: {_error_text(chunk)}")
                    yield chunk
        except httpx.ConnectError:
            raise PlaygroundError(f"cannot reach the vLLM server at {server.url}: is it running?") from None
        except httpx.TimeoutException:
            raise PlaygroundError(f"the vLLM server at {server.url} did not answer within "
                                  f"{self.timeout_s:.0f} s") from None
        except (httpx.RemoteProtocolError, httpx.ReadError):
            raise PlaygroundError(f"the vLLM server at {server.url} closed the connection mid-stream") from None
        raise PlaygroundError(f"the stream from the vLLM server at {server.url} ended before it finished")


def _error_text(payload) -> str:
    try:
        data = json.loads(payload) if isinstance(payload, (bytes, str)) else payload
        error = data.get("error", data)
        return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
    except (ValueError, AttributeError):
        return str(payload)[:300]
