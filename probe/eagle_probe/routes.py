"""The API-server side: `POST /v1/eagle_probe/records` (a JSON body `{"key": ..., "request": ..., "final":
false}`: keys stay out of URLs, and so out of access and proxy logs) and `GET /v1/eagle_probe/status`.

The routes live under `/v1`, so vLLM's own `--api-key` / `VLLM_API_KEY` middleware guards them exactly
as it guards `/v1/completions` (vllm/entrypoints/serve/middleware/authenticate.py ~11, ~59). Recording
does not rest on that middleware: a request is recorded only under a key made with the API key (keys.py),
whichever route it came through. Before the server listens, `init_state` hands the workers the secrets
keys are proven against and the token every call of this process carries (vllm/entrypoints/launchers/
api_server/entry.py ~138, then serve_http ~142); a caller of vLLM's development `/collective_rpc` has
neither, so it reads no record, key or status through the probe.

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
import logging
import time

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from eagle_probe import PLUGIN, VLLM_VERSION, __version__
from eagle_probe.attention import across_ranks
from eagle_probe.keys import KEY_FORM, digest, proven, rpc_token, secret_of
from eagle_probe.settings import Settings

log = logging.getLogger("eagle_probe")

PREFIX = "/v1/eagle_probe"
RPC_TIMEOUT_S = 25.0   # the engine answers between steps (a long prefill's take seconds on a CPU); clients wait 30 s
STATUS_EVERY_S = 1.0
FETCH_EVERY_S = 0.1
HELD_EVERY_S = 1.0     # how stale the API process's list of the keys the workers hold may get
MAX_WAITERS_PER_KEY = 4
MAX_REQUEST_ID_CHARS = 256


class ProbeRoutes:
    """The `vllm.endpoint_plugins` entry point."""
    name = PLUGIN
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter(prefix=PREFIX)

        @router.post("/records")
        async def records(request: Request):
            """The records made since the last fetch of the request `request` (the id its stream carries),
            recorded under `key`; `final: true` (after its stream ended) also releases it from the probe."""
            try:
                body = await request.json()
            except ValueError:
                body = None
            body = body if isinstance(body, dict) else {}
            key, stream, final = body.get("key"), body.get("request"), body.get("final", False)
            if not isinstance(key, str) or not KEY_FORM.fullmatch(key) or not isinstance(final, bool) \
                    or not isinstance(stream, str) or not 0 < len(stream) <= MAX_REQUEST_ID_CHARS:
                return JSONResponse(error_body(
                    "the body is {\"key\": the request's probe key (64 lowercase hex characters, eagle_probe/keys.py), "
                    "\"request\": the id its stream carries, \"final\": true or false}", 400), 400)
            probe = _state(request)
            try:
                found = await probe.fetches.fetch(key, stream, final) if proven(key, probe.secrets) else None
            except Busy as e:   # answered, not raised: vLLM logs every raised error with its traceback
                return JSONResponse(error_body(str(e), 503), 503, headers={"Retry-After": "1"})
            if found is None:   # answered here, not raised: the commonest answer to a flood, at half the cost
                return JSONResponse(not_found(), status_code=404)
            return found

        @router.get("/status")
        async def status(request: Request) -> Response:
            return await _state(request).status()

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        if engine_client is None:
            state.eagle_probe = None
            return
        import vllm.envs as envs

        # the keys vLLM's middleware checks, as it reads them (vllm/entrypoints/serve/middleware/register.py ~33)
        api_keys = [key for key in (getattr(args, "api_key", None) or [envs.VLLM_API_KEY]) if key]
        state.eagle_probe = Probe(engine_client, api_keys, bool(envs.VLLM_SERVER_DEV_MODE))
        await state.eagle_probe.configure()


def error_body(message: str, code: int) -> dict:
    """An error's body, in the shape vLLM gives every HTTP error (ErrorResponse,
    vllm/entrypoints/serve/exception_handling/handlers/http.py ~24-31)."""
    kind = {400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}[code]
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def not_found() -> dict:
    return error_body(f"no request is recorded under this key: it did not set vllm_xargs {{\"{PLUGIN}\": key}} "
                      "with a key made with this server's API key, has not started, or was fetched to its end", 404)


def _state(request: Request) -> "Probe":
    probe = getattr(request.app.state, "eagle_probe", None)
    if probe is None:
        raise HTTPException(503, "this server has no engine")
    return probe


class Probe:
    """The API process's side of one server: its status copy and its fetches."""

    def __init__(self, engine, api_keys: list[str], dev_mode: bool):
        self.engine = engine
        self.api_keys, self.dev_mode = bool(api_keys), dev_mode
        self.secrets = [secret_of(key) for key in api_keys] or [secret_of(None)]
        self.token = rpc_token(api_keys)
        self.configured = ""   # "yes", or why the workers refused the secrets ("": not yet asked)
        self.fetches = Fetches(self, Settings.read().max_waiting)
        self._status: tuple[float, bytes] | None = None
        self._status_lock = asyncio.Lock()

    async def configure(self) -> None:
        """Hand the workers the secrets and the token (before the server listens; again at the first call
        where that failed)."""
        try:
            engines = await self._call("eagle_probe_configure", [s.hex() for s in self.secrets], self.token)
        except Exception as e:
            log.warning("eagle_probe: the workers did not take the probe's secrets: %r", e)
            return
        refusals = [why for ranks in engines for why in ranks if why]
        self.configured = refusals[0] if refusals else "yes"
        if refusals:
            log.warning("eagle_probe: %s; it records nothing in this server", refusals[0])

    async def ask(self, method: str, *args) -> list[list]:
        """Every worker's answer, by data-parallel engine, then by rank."""
        if not self.configured:
            await self.configure()
        try:
            return await self._call(method, self.token, *args)
        except Exception as e:   # the worker half is off (another vLLM version), or a worker failed or timed out
            log.warning("eagle_probe: %s failed in the workers: %r", method, e)
            raise HTTPException(503, f"eagle_probe {__version__} is not answering in this server's workers (it runs "
                                     f"where vLLM's methods it hooks are {VLLM_VERSION}'s; the server's log says "
                                     "why)") from None

    async def _call(self, method: str, *args) -> list[list]:
        core = getattr(self.engine, "engine_core", None)
        if hasattr(core, "call_utility_all_async"):
            call = core.call_utility_all_async("collective_rpc", method, RPC_TIMEOUT_S, args, None)
            return list(await asyncio.wait_for(call, RPC_TIMEOUT_S + 1))
        return [await self.engine.collective_rpc(method, timeout=RPC_TIMEOUT_S, args=args)]

    async def status(self) -> Response:
        """The status copy, encoded once per refresh (a flood of /status then costs about what vLLM's /v1/models
        does); a new Response each time, since middleware may add headers to the one it is given."""
        async with self._status_lock:
            if self._status is None or time.monotonic() - self._status[0] >= STATUS_EVERY_S:
                engines = await self.ask("eagle_probe_status")
                workers = [w for ranks in engines for w in ranks]
                first = dict(workers[0])
                first["recording"] = sum(ranks[0]["recording"] for ranks in engines)
                first.update(engines=len(engines), workers=workers, server_config=server_config(self.engine),
                             **self.access())
                self._status = (time.monotonic(), json.dumps(first).encode())
            return Response(self._status[1], media_type="application/json")

    def access(self) -> dict:
        """Who can record and read, as /status says it."""
        said = {"api_key": "required: vLLM's --api-key guards the probe's routes as /v1, and a request is recorded "
                           "only under a key made with it" if self.api_keys else
                           "none: whoever reaches this port can record requests and read their records",
                "workers_configured": self.configured or "no"}
        if self.dev_mode:
            said["warning"] = ("VLLM_SERVER_DEV_MODE is on: vLLM's development routes (/collective_rpc, /sleep, "
                               "/reset_prefix_cache, ...) need no API key; the probe's records stay behind its "
                               "token, but run such a server only where nobody else reaches its port")
        return said


class Busy(Exception):
    """Too many fetches wait: the caller is asked to come back."""


class Fetches:
    """Fetches waiting for the next call to the workers, one call for all of them. The workers' answer also
    lists the digests of the keys they hold (`held`): a fetch of a key held then waits for the next call (at
    most FETCH_EVERY_S); any other fetch is answered "not held" at once while that list is under
    HELD_EVERY_S old (a final fetch, which may carry a refusal's reason or release a request admitted since,
    always waits for a call), and brings a call only once the list is older. Keys held always find a place;
    other keys wait `max_waiting` at most (EAGLE_PROBE_MAX_WAITING), MAX_WAITERS_PER_KEY fetches each, so
    a flood of fetches of keys nobody holds never turns a held request's fetch away."""

    def __init__(self, probe: Probe, max_waiting: int):
        self.probe, self.max_waiting = probe, max_waiting
        self.waiting: dict[tuple[str, str], tuple[bool, list[asyncio.Future]]] = {}   # (key, request id) ->
        self.pump: asyncio.Task | None = None
        self.wake = asyncio.Event()
        self.last = float("-inf")
        self.held: set[str] = set()   # digests
        self.held_at = float("-inf")
        self.unheld_waiting = 0         # keys in `waiting` that were not held when they came

    async def fetch(self, key: str, request: str, final: bool) -> dict | None:
        stale = time.monotonic() - self.held_at >= HELD_EVERY_S
        held = digest(key) in self.held
        if not final and not stale and not held:
            return None
        asked = (key, request)
        if asked in self.waiting:
            if len(self.waiting[asked][1]) >= MAX_WAITERS_PER_KEY:
                raise Busy("the probe has too many fetches of this key waiting: ask again in a moment")
        elif not held and self.unheld_waiting >= self.max_waiting:
            raise Busy("the probe has too many fetches waiting: ask again in a moment")
        else:
            self.waiting[asked] = (False, [])
            self.unheld_waiting += not held
        future = asyncio.get_running_loop().create_future()
        was_final, futures = self.waiting[asked]
        futures.append(future)
        self.waiting[asked] = (was_final or final, futures)
        if held or stale:
            self.wake.set()
        if self.pump is None or self.pump.done():
            self.pump = asyncio.create_task(self._serve())
        return await future

    def _due(self) -> float:
        """When the waiting fetches call the workers: soon for a key held, else when `held` grows old."""
        soon = self.last + FETCH_EVERY_S
        if len(self.waiting) > self.unheld_waiting:
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
            batch, self.waiting, self.unheld_waiting = self.waiting, {}, 0
            self.last = time.monotonic()
            asked = [(key, request, final) for (key, request), (final, _) in batch.items()]
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


# what a client reads to describe the server, which vLLM itself publishes only in development mode
# (`GET /server_info`, vllm/entrypoints/serve/dev/server_info/api_router.py): name -> the fields shown
PUBLISHED_CONFIG = {
    "speculative_config": ("method", "model", "num_speculative_tokens", "disable_padded_drafter_batch",
                           "prompt_lookup_min", "prompt_lookup_max"),
    "scheduler_config": ("max_num_scheduled_tokens", "max_num_batched_tokens"),
    "observability_config": ("per_request_spec_decode_metrics",),
}


def server_config(engine) -> dict:
    """The parts of the engine's configuration in PUBLISHED_CONFIG, in /server_info's shape (a part the
    server does not have is None)."""
    config = getattr(engine, "vllm_config", None)
    published = {}
    for name, fields in PUBLISHED_CONFIG.items():
        part = getattr(config, name, None)
        published[name] = None if part is None else {
            field: value for field in fields
            if isinstance(value := getattr(part, field, None), (str, int, float, bool)) or value is None}
    return published


def one_answer(by_engine: list[list[dict | None]]) -> dict | None:
    """One key's answer from every engine's workers: the ranks of the engine that holds it merged
    (across_ranks; workers that do not record, such as pipeline stages before the last, answer None)."""
    held = [answer for ranks in by_engine if (answer := across_ranks(ranks)) is not None]
    if len(held) > 1:
        return {"records": [], "finished": True,
                "error": "two data-parallel engines recorded requests under this key: neither is kept apart"}
    return held[0] if held else None
