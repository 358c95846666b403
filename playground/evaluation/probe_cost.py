"""`python -m playground bench probe`: what the eagle_probe plugin (probe/) costs a vLLM server.

    python -m playground bench probe [--concurrency 1 4] [--max-tokens 64] [--rounds 4]

Two EAGLE 3.1 servers of the embedded target run side by side, one without the probe and one with
it. Round after round, the same requests go to three lanes: the server without the probe, the
probed server with requests it does not record, and the probed server recording every request
(its records fetched after each one). One run measures all three, so the machine's noise falls on
each alike; the table gives each lane's median output tokens/s. Last, the round trip of the probe's
status route: the path a fetch of records takes (HTTP, then collective_rpc to the worker).
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.vllm.backend import LaunchSpec, launch_config
from playground.engines.vllm.launch import PROBE_PLUGIN, healthy, server_command
from playground.engines.vllm.probe import FIELD, PREFIX
from playground.evaluation.vllm_load import EVERYDAY
from playground.local_server import ServerProcess, pick_port
from playground.model.variants import EAGLE31

LANES = ("no probe", "probe, not recording", "probe, recording")


@dataclass(frozen=True)
class ProbeCostConfig:
    concurrency: tuple[int, ...] = (1, 4)
    max_tokens: int = 64
    rounds: int = 4
    k: int = 5


def run(config: ProbeCostConfig, status=print) -> list[dict]:
    engine = ReferenceEngine.load()
    launch = launch_config(engine, LaunchSpec(k=config.k), (EAGLE31,))
    env = {**os.environ, "VLLM_USE_AOT_COMPILE": "0", "VLLM_USE_V2_MODEL_RUNNER": "0",
           "VLLM_CPU_KVCACHE_SPACE": str(launch.kv_cache_gib)}
    servers = {plugins: ServerProcess(f"vllm-probe-cost{'-probe' if plugins else ''}",
                                      partial(server_command, launch, EAGLE31), Path(launch.log_dir),
                                      pick_port(launch.base_port + 10 + i), env={**env, "VLLM_PLUGINS": plugins},
                                      status=status, new_session=True)
               for i, plugins in enumerate(("", PROBE_PLUGIN))}
    try:
        for server in servers.values():
            server.wait_until(healthy, timeout_s=900, interval_s=2)
        plain, probed = servers[""].url, servers[PROBE_PLUGIN].url
        prompts = [engine.prompt_ids(GenerationRequest(prompt=p)) for p in EVERYDAY]
        lanes = dict(zip(LANES, ((plain, False), (probed, False), (probed, True))))
        ask = lambda lane, ids: _completion(*lanes[lane], ids, launch.served_name, config.max_tokens)
        for lane in LANES:   # warm-up
            ask(lane, prompts[0])
        rows = []
        for concurrency in config.concurrency:
            rates = {lane: [] for lane in LANES}
            for r in range(config.rounds):
                batch = [prompts[(r * concurrency + i) % len(prompts)] for i in range(concurrency)]
                for lane in LANES:
                    start = time.perf_counter()
                    with ThreadPoolExecutor(concurrency) as pool:
                        tokens = sum(pool.map(partial(ask, lane), batch))
                    rates[lane].append(tokens / (time.perf_counter() - start))
            rows += [{"concurrency": concurrency, "lane": lane, "tokens_per_s": statistics.median(values),
                      "rounds": [round(v, 1) for v in values]} for lane, values in rates.items()]
        rows.append({"status_round_trip_ms": _round_trip_ms(probed)})
        return rows
    finally:
        for server in servers.values():
            server.stop()


def _completion(url: str, record: bool, prompt_ids: list[int], model: str, max_tokens: int) -> int:
    """One greedy completion; its output tokens. A recorded one also fetches its records."""
    key = uuid.uuid4().hex
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            **({"vllm_xargs": {FIELD: key}} if record else {})}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=600).json()
    if record:
        httpx.get(f"{url}{PREFIX}/records/{key}", params={"final": "true"}, timeout=60).raise_for_status()
    return answer["usage"]["completion_tokens"]


def _round_trip_ms(url: str, calls: int = 200) -> float:
    with httpx.Client() as client:
        start = time.perf_counter()
        for _ in range(calls):
            client.get(f"{url}{PREFIX}/status").raise_for_status()
        return (time.perf_counter() - start) / calls * 1e3


def markdown(rows: list[dict]) -> str:
    lines = ["| concurrency | server | output tokens/s (median) | rounds |", "|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['lane']} | {r['tokens_per_s']:.1f} | {', '.join(map(str, r['rounds']))} |"
              for r in rows if "lane" in r]
    trip = next(r["status_round_trip_ms"] for r in rows if "status_round_trip_ms" in r)
    return "\n".join(lines) + f"\n\nprobe status route round trip (HTTP + collective_rpc), idle server: {trip:.2f} ms"
