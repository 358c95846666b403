"""`python -m playground bench probe`: what the eagle_probe plugin (probe/) costs a vLLM server.

    python -m playground bench probe [--concurrency 1 4] [--max-tokens 64] [--rounds 4] [--contexts 1000 4000]

Two EAGLE 3.1 servers of the embedded target run side by side, one without the probe and one with
it. Round after round, the same requests go to three lanes: the server without the probe, the
probed server with requests it does not record, and the probed server recording every request
(its records fetched after each one). One run measures all three, so the machine's noise falls on
each alike; the table gives each lane's median output tokens/s. Then, after documents of about 1k
and 4k tokens, one request at a time, what a recorded verify step costs: the decode time per step
of the probed server recording and not recording, and the time the probe's own measurements took
in a recorded step (its records' `probe_ms`: fed-back RMS, attention with its self-check, draft
probabilities). Last, the round trip of the probe's status route: the path a fetch of records
takes (HTTP, then collective_rpc to the worker).
"""

from __future__ import annotations

import json
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
from playground.evaluation.prompt_sets import suite
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
    contexts: tuple[int, ...] = (1000, 4000)   # tokens of document before the question (1k, 2k or 4k)


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
        for context in config.contexts:
            prompt = suite(engine.tokenizer, (f"long context {context // 1000}k",), per_category=1)[0]
            ids = engine.prompt_ids(prompt.request(EAGLE31, config.k, config.max_tokens))
            steps = {lane: [] for lane in LANES[1:]}
            spent: list[float] = []
            for _ in range(config.rounds):
                for lane in LANES[1:]:
                    ms, probe_ms = _timed_completion(*lanes[lane], ids, launch.served_name, config.max_tokens)
                    steps[lane].append(ms)
                    spent += probe_ms
            rows += [{"context": len(ids), "lane": lane, "ms_per_step": statistics.median(values),
                      "rounds": [round(v, 1) for v in values],
                      **({"probe_ms": statistics.median(spent)} if lane == LANES[2] else {})}
                     for lane, values in steps.items()]
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


def _timed_completion(url: str, record: bool, prompt_ids: list[int], model: str,
                      max_tokens: int) -> tuple[float, list[float]]:
    """One streamed greedy completion: its decode time per verify step (first token to last, over
    the steps after the prefill), and for a recorded one the probe's own time in each step."""
    key = uuid.uuid4().hex
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            **({"vllm_xargs": {FIELD: key}, "cache_salt": key} if record else {})}
    first = last = None
    steps = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first or last
            spec = (chunk.get("metrics") or {}).get("speculative_decoding") or {}
            steps = len(spec.get("per_step_accepted") or ()) or steps
    probe_ms = []
    if record:
        answer = httpx.get(f"{url}{PREFIX}/records/{key}", params={"final": "true"}, timeout=60).json()
        probe_ms = [r["probe_ms"] for r in answer["records"] if "probe_ms" in r]
    return (last - first) * 1e3 / max(steps, 1), probe_ms


def _round_trip_ms(url: str, calls: int = 200) -> float:
    with httpx.Client() as client:
        start = time.perf_counter()
        for _ in range(calls):
            client.get(f"{url}{PREFIX}/status").raise_for_status()
        return (time.perf_counter() - start) / calls * 1e3


def markdown(rows: list[dict]) -> str:
    lines = ["| concurrency | server | output tokens/s (median) | rounds |", "|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['lane']} | {r['tokens_per_s']:.1f} | {', '.join(map(str, r['rounds']))} |"
              for r in rows if "concurrency" in r]
    lines += ["", "| prompt tokens | server | decode ms per verify step (median) | rounds | the probe's own ms per "
                  "recorded step (median) |", "|---|---|---|---|---|"]
    for r in (r for r in rows if "context" in r):
        probe_ms = f"{r['probe_ms']:.1f}" if "probe_ms" in r else ""
        lines.append(f"| {r['context']} | {r['lane']} | {r['ms_per_step']:.1f} | {', '.join(map(str, r['rounds']))} | "
                     f"{probe_ms} |")
    trip = next(r["status_round_trip_ms"] for r in rows if "status_round_trip_ms" in r)
    return "\n".join(lines) + f"\n\nprobe status route round trip (HTTP + collective_rpc), idle server: {trip:.2f} ms"
