"""The API-server side: `GET /v1/eagle_probe/records/{key}` and `GET /v1/eagle_probe/status`.

The routes live under `/v1`, so vLLM's own `--api-key` / `VLLM_API_KEY` middleware guards them exactly
as it guards `/v1/completions` (vllm/entrypoints/serve/middleware/authenticate.py ~11, ~59).

No client reaches the engine directly. Each call to a worker is a `collective_rpc`, which the engine
core serves between two steps (vllm/v1/engine/core.py ~1599), so the routes bound how often that
happens however many clients ask: `/status` answers from a copy at most STATUS_EVERY_S old, and every
fetch waiting is served by one call at most every FETCH_EVERY_S (Fetches); a fetch of a key the workers
did not hold at the last call is answered without one, and such keys alone bring a call at most every
HELD_EVERY_S, so a flood of made-up keys costs the engine one call a second. The calls go to every
data-parallel engine (`call_utility_all_async`, vllm/v1/engine/core_client.py ~1262; a plain
`collective_rpc` hears from engine 0 only, ~1699) and every worker of each.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from eagle_probe import PLUGIN, VLLM_VERSION, __version__
from eagle_probe.attention import across_ranks

PREFIX = "/v1/eagle_probe"
RPC_TIMEOUT_S = 25.0   # the engine answers between steps (a long prefill's take seconds on a CPU); clients wait 30 s
STATUS_EVERY_S = 1.0
FETCH_EVERY_S = 0.1
HELD_EVERY_S = 1.0     # how stale the API process's list of the keys the workers hold may get
MAX_WAITING = 1024     # keys waiting for the next fetch; more are told to come back
MAX_KEY_CHARS = 256


class ProbeRoutes:
    """The `vllm.endpoint_plugins` entry point."""
    name = PLUGIN
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter(prefix=PREFIX)

        @router.get("/records/{key}")
        async def records(key: str, request: Request, final: bool = False):
            """The records of request `key` made since the last fetch; `final=true` (after its stream
            ended) also drops the request from the probe."""
            found = None
            if len(key) <= MAX_KEY_CHARS:
                found = await _state(request).fetches.fetch(key, final)
            if found is None:   # answered here, not raised: the commonest answer to a flood, at half the cost
                return JSONResponse(not_found(key), status_code=404)
            return found

        @router.get("/status")
        async def status(request: Request) -> Response:
            return await _state(request).status()

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        state.eagle_probe = Probe(engine_client) if engine_client is not None else None


def not_found(key: str) -> dict:
    """A 404's body, in the shape vLLM gives every HTTP error (ErrorResponse,
    vllm/entrypoints/serve/exception_handling/handlers/http.py ~24-31)."""
    message = (f"no request {key!r} is recorded: it did not set vllm_xargs {{\"{PLUGIN}\": key}}, has not started, "
               "or was fetched to its end")
    return {"error": {"message": message, "type": "Not Found", "param": None, "code": 404}}


def _state(request: Request) -> "Probe":
    probe = getattr(request.app.state, "eagle_probe", None)
    if probe is None:
        raise HTTPException(503, "this server has no engine")
    return probe


class Probe:
    """The API process's side of one server: its status copy and its fetches."""

    def __init__(self, engine):
        self.engine = engine
        self.fetches = Fetches(self)
        self._status: tuple[float, bytes] | None = None
        self._status_lock = asyncio.Lock()

    async def ask(self, method: str, *args) -> list[list]:
        """Every worker's answer, by data-parallel engine, then by rank."""
        core = getattr(self.engine, "engine_core", None)
        try:
            if hasattr(core, "call_utility_all_async"):
                call = core.call_utility_all_async("collective_rpc", method, RPC_TIMEOUT_S, args, None)
                return list(await asyncio.wait_for(call, RPC_TIMEOUT_S + 1))
            return [await self.engine.collective_rpc(method, timeout=RPC_TIMEOUT_S, args=args)]
        except Exception as e:   # the worker half is off (another vLLM version), or a worker failed or timed out
            raise HTTPException(503, f"eagle_probe {__version__} is not running in this server's workers (it "
                                     f"runs where vLLM's methods it hooks are {VLLM_VERSION}'s): "
                                     f"{type(e).__name__}: {e}") from None

    async def status(self) -> Response:
        """The status copy, encoded once per refresh (a flood of /status then costs about what vLLM's /v1/models
        does); a new Response each time, since middleware may add headers to the one it is given."""
        async with self._status_lock:
            if self._status is None or time.monotonic() - self._status[0] >= STATUS_EVERY_S:
                engines = await self.ask("eagle_probe_status")
                workers = [w for ranks in engines for w in ranks]
                first = dict(workers[0])
                first["recording"] = sum(ranks[0]["recording"] for ranks in engines)
                first.update(engines=len(engines), workers=workers, api_key="guarded as /v1")
                self._status = (time.monotonic(), json.dumps(first).encode())
            return Response(self._status[1], media_type="application/json")


class Fetches:
    """Fetches waiting for the next call to the workers, one call for all of them. The workers' answer also
    lists the keys they hold (`held`): a fetch of a key held then waits for the next call (at most
    FETCH_EVERY_S); any other fetch is answered "not held" at once while that list is under HELD_EVERY_S old
    (a final fetch, which may carry a refusal's reason or release a request admitted since, always waits for
    a call), and brings a call only once the list is older."""

    def __init__(self, probe: Probe):
        self.probe = probe
        self.waiting: dict[str, tuple[bool, list[asyncio.Future]]] = {}
        self.pump: asyncio.Task | None = None
        self.wake = asyncio.Event()
        self.last = float("-inf")
        self.held: set[str] = set()
        self.held_at = float("-inf")

    async def fetch(self, key: str, final: bool) -> dict | None:
        stale = time.monotonic() - self.held_at >= HELD_EVERY_S
        if not final and not stale and key not in self.held:
            return None
        if key not in self.waiting and len(self.waiting) >= MAX_WAITING:
            raise HTTPException(503, "the probe has too many fetches waiting: ask again in a moment")
        future = asyncio.get_running_loop().create_future()
        was_final, futures = self.waiting.get(key, (False, []))
        self.waiting[key] = (was_final or final, [*futures, future])
        if key in self.held or stale:
            self.wake.set()
        if self.pump is None or self.pump.done():
            self.pump = asyncio.create_task(self._serve())
        return await future

    def _due(self) -> float:
        """When the waiting fetches call the workers: soon for a key held, else when `held` grows old."""
        soon = self.last + FETCH_EVERY_S
        if any(key in self.held for key in self.waiting):
            return soon
        return max(soon, self.held_at + HELD_EVERY_S)

    async def _serve(self) -> None:
        while self.waiting:
            wait = self._due() - time.monotonic()
            if wait > 0:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass
                continue
            batch, self.waiting = self.waiting, {}
            self.last = time.monotonic()
            asked = [(key, final) for key, (final, _) in batch.items()]
            try:
                engines = await self.probe.ask("eagle_probe_fetch", asked)
                answers = [one_answer([[worker["answers"][i] for worker in workers] for workers in engines])
                           for i in range(len(asked))]
                self.held = {key for workers in engines for worker in workers for key in worker["held"]}
                self.held_at = self.last
            except HTTPException as e:
                for _, futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(HTTPException(e.status_code, e.detail))
                continue
            for (_, futures), answer in zip(batch.values(), answers):
                for n, future in enumerate(futures):   # the records go to the first; a repeat of a key gets none
                    if not future.done():
                        future.set_result(answer if n == 0 or answer is None else {**answer, "records": []})


def one_answer(by_engine: list[list[dict | None]]) -> dict | None:
    """One key's answer from every engine's workers: the ranks of the engine that holds it merged
    (across_ranks; workers that do not record, such as pipeline stages before the last, answer None)."""
    held = [answer for ranks in by_engine if (answer := across_ranks(ranks)) is not None]
    if len(held) > 1:
        return {"records": [], "finished": True,
                "error": "two data-parallel engines recorded requests under this key: neither is kept apart"}
    return held[0] if held else None
