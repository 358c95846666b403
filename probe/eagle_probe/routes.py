"""The API-server side: `GET /eagle_probe/v1/records/{id}` and `GET /eagle_probe/v1/status`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, HTTPException, Request

from eagle_probe import PLUGIN, VLLM_VERSION, __version__
from eagle_probe.attention import across_ranks

RPC_TIMEOUT_S = 5.0


class ProbeRoutes:
    """The `vllm.endpoint_plugins` entry point."""
    name = PLUGIN
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter(prefix="/eagle_probe/v1")

        @router.get("/records/{key}")
        async def records(key: str, request: Request, final: bool = False) -> dict:
            """The records of request `key` made since the last fetch; `final=true` (after its stream
            ended) also drops the request from the probe."""
            found = across_ranks(await _ask(request, "eagle_probe_fetch", key, final))
            if found is None:
                raise HTTPException(404, f"no request {key!r} is recorded: it did not set vllm_xargs "
                                         f"{{\"{PLUGIN}\": id}}, has not started, or was fetched to its end")
            return found

        @router.get("/status")
        async def status(request: Request) -> dict:
            return (await _ask(request, "eagle_probe_status"))[0]

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        state.eagle_probe_engine = engine_client


async def _ask(request: Request, method: str, *args) -> list:
    """Every worker's answer, in rank order."""
    engine = getattr(request.app.state, "eagle_probe_engine", None)
    if engine is None:
        raise HTTPException(503, "this server has no engine")
    try:
        answers = await engine.collective_rpc(method, timeout=RPC_TIMEOUT_S, args=args)
    except Exception as e:   # the worker half is off (another vLLM version), or the worker failed or timed out
        raise HTTPException(503, f"eagle_probe {__version__} is not running in this server's workers "
                                 f"(it runs on vLLM {VLLM_VERSION}): {type(e).__name__}: {e}") from None
    return answers
