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

Two checks of the probe in a server strangers reach follow. A flood: while unrecorded requests stream
(4 at once), 16 clients hammer the probe's routes (status and fetches of keys nobody holds in turn, each
alone, and 512 calls of both in all), round after round in both orders beside a quiet round and the same
floods of vLLM's own /v1/models (unpaced, and 512 calls), which never reaches the engine: what the
probe's routes cost the engine is the gap between the floods, what any flood of HTTP costs this 2-core
machine is the gap between /v1/models and quiet. A load: 40 requests
opting in at once with ~1,500-token prompts, half of them sending one key, after the same 40 not
opting in: every completion served, the model-running process's peak RSS with and without recording beside
the probe's limits, and how many requests the shared key recorded (at most one).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import numpy as np

from playground.engines.intervals import paired_ratio
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.vllm.backend import LaunchSpec, launch_config
from playground.engines.vllm.launch import PROBE_PLUGIN, healthy, server_command
from playground.engines.vllm.probe import FIELD, PREFIX, probe_key
from playground.evaluation.memory import rss_mib
from playground.evaluation.tables import markdown_table
from playground.evaluation.vllm_load import EVERYDAY
from playground.local_server import ServerProcess, pick_port
from playground.model.variants import EAGLE31
from playground.prompts.sets import suite

LANES = ("no probe", "probe, not recording", "probe, recording")


@dataclass(frozen=True)
class ProbeCostConfig:
    concurrency: tuple[int, ...] = (1, 4)
    max_tokens: int = 64
    rounds: int = 4
    k: int = 5
    contexts: tuple[int, ...] = (1000, 4000)   # tokens of document before the question (1k, 2k or 4k)
    flood_rounds: int = 4        # 0: no flood
    load_requests: int = 40      # 0: no load
    load_prompt_tokens: int = 1500


def run(config: ProbeCostConfig, status=print) -> list[dict]:
    engine = ReferenceEngine.load()
    launch = launch_config(engine, LaunchSpec(k=config.k), (EAGLE31,))
    env = {**os.environ, "VLLM_USE_AOT_COMPILE": "0", "VLLM_USE_V2_MODEL_RUNNER": "0",
           "VLLM_CPU_KVCACHE_SPACE": str(launch.kv_cache_gib)}
    servers = {plugins: ServerProcess(f"vllm-probe-cost{'-probe' if plugins else ''}",
                                      partial(server_command, launch, EAGLE31), Path(launch.log_dir),
                                      pick_port(launch.base_port + 10 + i),
                                      # records kept until fetched: the load fetches once all 40 have ended
                                      env={**env, "VLLM_PLUGINS": plugins, "EAGLE_PROBE_IDLE_TTL_S": "3600",
                                               "EAGLE_PROBE_STATUS_MEMORY": "1"},
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
        if config.flood_rounds:
            rows += _flood(probed, launch.served_name, prompts, config)
        if config.load_requests:
            document = engine.prompt_ids(suite(engine.tokenizer, ("long context 4k",), per_category=1)[0].request(
                EAGLE31, config.k, config.max_tokens))
            rows.append(_load(servers[PROBE_PLUGIN], document, launch.served_name, config))
        return rows
    finally:
        for server in servers.values():
            server.stop()


def _completion(url: str, record: bool, prompt_ids: list[int], model: str, max_tokens: int) -> int:
    """One greedy completion; its output tokens. A recorded one also fetches its records."""
    key = probe_key(None)
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            **({"vllm_xargs": {FIELD: key}} if record else {})}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=600).json()
    if record:
        _final_fetch(url, key, answer["id"]).raise_for_status()
    return answer["usage"]["completion_tokens"]


def _timed_completion(url: str, record: bool, prompt_ids: list[int], model: str,
                      max_tokens: int) -> tuple[float, list[float]]:
    """One streamed greedy completion: its decode time per verify step (first token to last, over
    the steps after the prefill), and for a recorded one the probe's own time in each step."""
    key = probe_key(None)
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            **({"vllm_xargs": {FIELD: key}, "cache_salt": key} if record else {})}
    first = last = None
    steps, stream_id = 0, ""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            stream_id = chunk.get("id") or stream_id
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first or last
            spec = (chunk.get("metrics") or {}).get("speculative_decoding") or {}
            steps = len(spec.get("per_step_accepted") or ()) or steps
    probe_ms = []
    if record:
        answer = _final_fetch(url, key, stream_id).json()
        probe_ms = [r["probe_ms"] for r in answer["records"] if "probe_ms" in r]
    return (last - first) * 1e3 / max(steps, 1), probe_ms


def _round_trip_ms(url: str, calls: int = 200) -> float:
    with httpx.Client() as client:
        start = time.perf_counter()
        for _ in range(calls):
            client.get(f"{url}{PREFIX}/status").raise_for_status()
        return (time.perf_counter() - start) / calls * 1e3


FLOODS = ("quiet", "flood of /v1/models", "flood of the probe's routes", "flood of /status", "flood of fetches",
          "500 calls of the probe's routes", "500 calls of /v1/models")
FLOOD_CLIENTS = 16
FLOOD_CALLS = 512   # the last two lanes' calls in all, as fast as their clients make them (32 each)


def _flood(url: str, model: str, prompts: list[list[int]], config: ProbeCostConfig) -> list[dict]:
    """Output tokens/s of 4 unrecorded streams at once, quiet and under each flood, rounds in both orders."""
    rates, calls = {lane: [] for lane in FLOODS}, {lane: [] for lane in FLOODS[1:]}
    for r in range(config.flood_rounds):
        batch = [prompts[(r * 4 + i) % len(prompts)] for i in range(4)]
        for lane in (FLOODS if r % 2 == 0 else FLOODS[::-1]):
            done, made = threading.Event(), []
            flooders = [threading.Thread(target=_hammer, args=(url, lane, done, made)) for _ in range(FLOOD_CLIENTS)
                        if lane != FLOODS[0]]
            for thread in flooders:
                thread.start()
            try:
                start = time.perf_counter()
                with ThreadPoolExecutor(4) as pool:
                    tokens = sum(pool.map(lambda ids: _completion(url, False, ids, model, config.max_tokens), batch))
                seconds = time.perf_counter() - start
            finally:
                done.set()
                for thread in flooders:
                    thread.join()
            failed = [m for m in made if isinstance(m, str)]
            if failed:
                raise RuntimeError(f"a client of the flood failed: {failed[0]}")
            rates[lane].append(tokens / seconds)
            if lane in calls:
                calls[lane].append(sum(made))
    rows = [{"flood": lane, "tokens_per_s": statistics.median(values), "rounds": [round(v, 1) for v in values],
             **({"calls": calls[lane]} if lane in calls else {}), **_change(rates, lane, FLOODS[0], "quiet"),
             **(_change(rates, lane, FLOODS[6], "models") if lane == FLOODS[5] else {})}
            for lane, values in rates.items()]
    return rows


def _change(rates: dict[str, list[float]], lane: str, against: str, name: str) -> dict:
    """The lane's mean tokens/s over the other lane's, less 1, with a 95% bootstrap interval over rounds
    paired (a round runs every lane on the same prompts, one lane after the other)."""
    if lane == against or len(rates[lane]) < 2:
        return {}
    mean = lambda values: (lambda idx: np.asarray(values)[idx].mean(-1))
    value, (low, high) = paired_ratio(mean(rates[lane]), mean(rates[against]), len(rates[lane]))
    return {f"change_vs_{name}": round(value - 1, 4), f"change_vs_{name}_ci": [round(low - 1, 4), round(high - 1, 4)]}


def _hammer(url: str, lane: str, done: threading.Event, made: list[int | str]) -> None:
    """Calls the lane's routes one after another until `done`; appends how many it made, or why it stopped."""
    count, most = 0, FLOOD_CALLS // FLOOD_CLIENTS if lane in FLOODS[5:] else float("inf")
    try:
        with httpx.Client(timeout=60) as client:
            while not done.is_set() and count < most:
                if lane in (FLOODS[1], FLOODS[6]):
                    answer, expected = client.get(f"{url}/v1/models"), 200
                elif lane == FLOODS[3] or (lane in (FLOODS[2], FLOODS[5]) and count % 2):
                    answer, expected = client.get(f"{url}{PREFIX}/status"), 200
                else:   # a key nobody holds
                    asked = {"key": probe_key(None), "request": "cmpl-made-up"}
                    answer, expected = client.post(f"{url}{PREFIX}/records", json=asked), 404
                if answer.status_code != expected:
                    raise RuntimeError(f"{answer.request.url.path} answered {answer.status_code}")
                count += 1
        made.append(count)
    except Exception as e:
        made.append(f"{type(e).__name__}: {e}")


def _load(server: ServerProcess, document: list[int], model: str, config: ProbeCostConfig) -> dict:
    """`config.load_requests` completions at once, first not opting in, then opting in (half with one key)."""
    runner_pid = _runner_process(server.process.pid)
    n, size = config.load_requests, config.load_prompt_tokens
    # prompts of `size` tokens that differ from their first token: no prefix cached for another
    prompts = [[100 + i] + document[:size - 1] for i in range(n)]
    shared = probe_key(None)
    keys = [shared if i % 2 else probe_key(None) for i in range(n)]
    row = {"load": n, "prompt_tokens": size,
           "limits": httpx.get(f"{server.url}{PREFIX}/status", timeout=60).json()["limits"]}
    for lane, record in (("not recording", False), ("recording", True)):
        peak = _PeakRSS(runner_pid, server.url)
        with peak, ThreadPoolExecutor(n) as pool:
            served = list(pool.map(lambda i: _load_completion(server.url, model, prompts[i], keys[i] if record else
                                                               None, config.max_tokens), range(n)))
        row[lane] = {"served": sum(1 for s in served if s), "peak_rss_mib": peak.peak >> 20,
                     "start_rss_mib": peak.start >> 20, "probe_key_copy_mib": round(peak.key_copy_bytes / 2**20, 1),
                     "probe_recording_at_once": peak.recording, "status_failures": peak.status_failures}
    recorded = {}
    # fetched once all have ended, so no key is free again before the last asks for it; a key's records are
    # given only to the request that holds it, so each request that sent the key asks
    for key, stream_id in zip(keys, served):
        answer = _final_fetch(server.url, key, stream_id) if stream_id else None
        if answer is not None and answer.status_code == 200 and answer.json()["records"]:
            recorded.setdefault(key, set()).update(r["request"] for r in answer.json()["records"])
    row["shared_key_requests_recorded"] = len(recorded.get(shared, ()))
    row["requests_recorded"] = sum(len(requests) for requests in recorded.values())
    row["healthy_after"] = healthy(server.url)
    return row


def _final_fetch(url: str, key: str, stream_id: str) -> httpx.Response:
    return httpx.post(f"{url}{PREFIX}/records", json={"key": key, "request": stream_id, "final": True}, timeout=60)


def _load_completion(url: str, model: str, prompt: list[int], key: str | None, max_tokens: int) -> str:
    """One greedy completion, opting in under `key` if given; its id where it was served, else ""."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **({"vllm_xargs": {FIELD: key}, "cache_salt": uuid.uuid4().hex} if key else {})}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=900)
    served = answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    return answer.json()["id"] if served else ""


def _runner_process(server_pid: int) -> int:
    """The pid of the process that runs the model and the probe: the server's worker, or its engine
    core where the model runs in the engine core itself (the kernel keeps 15 characters of a name)."""
    children = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        children.setdefault(int(fields.get("PPid", "0")), []).append((int(fields["Pid"]), fields["Name"].strip()))
    found, queue = [], [server_pid]
    while queue:
        for pid, name in children.get(queue.pop(), []):
            found.append((pid, name))
            queue.append(pid)
    runners = [pid for pid, name in found if "Worker" in name] or [pid for pid, name in found if "EngineCor" in name]
    if not runners:
        raise RuntimeError(f"no vLLM worker or engine core process under the server (pid {server_pid}): {found}")
    return runners[0]


class _PeakRSS:
    """While the block runs: the largest RSS of one process (sampled every 0.1 s) and, from the probe's
    status (every second), the most key-copy bytes and recorded requests it held at once."""

    def __init__(self, pid: int, url: str):
        self.pid, self.url = pid, url
        self.start = self.peak = self.key_copy_bytes = self.recording = 0
        self.status_failures: list[str] = []
        self._done = threading.Event()

    def __enter__(self) -> "_PeakRSS":
        self.start = self.peak = self._rss()
        self._thread = threading.Thread(target=self._watch)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        try:
            self._sample()
        except Exception as e:
            self.status_failures.append(f"the watch stopped: {type(e).__name__}: {e}")

    def _sample(self) -> None:
        samples = 0
        while not self._done.wait(0.1):
            self.peak = max(self.peak, self._rss())
            samples += 1
            if samples % 10 == 0:
                answer = httpx.get(f"{self.url}{PREFIX}/status", timeout=120)
                if answer.status_code != 200:
                    self.status_failures.append(f"{answer.status_code}: {answer.text[:200]}")
                    continue
                status = answer.json()
                self.key_copy_bytes = max(self.key_copy_bytes, status["key_copy_bytes"])
                self.recording = max(self.recording, status["recording"])

    def _rss(self) -> int:
        return int(rss_mib(self.pid)[0] * 2**20)


def markdown(rows: list[dict]) -> str:
    rounds = lambda r, key="rounds": ", ".join(map(str, r.get(key, [])))
    lines = [markdown_table(["concurrency", "server", "output tokens/s (median)", "rounds"],
                            ([r["concurrency"], r["lane"], f"{r['tokens_per_s']:.1f}", rounds(r)]
                             for r in rows if "concurrency" in r))]
    lines += ["", markdown_table(["prompt tokens", "server", "decode ms per verify step (median)", "rounds",
                                  "the probe's own ms per recorded step (median)"],
                                 ([r["context"], r["lane"], f"{r['ms_per_step']:.1f}", rounds(r),
                                   f"{r['probe_ms']:.1f}" if "probe_ms" in r else ""] for r in rows if "context" in r))]
    trip = next(r["status_round_trip_ms"] for r in rows if "status_round_trip_ms" in r)
    lines += ["", f"probe status route round trip, idle server: {trip:.2f} ms"]
    floods = [r for r in rows if "flood" in r]
    if floods:
        quiet = floods[0]["tokens_per_s"]
        change = lambda r, name: (f"{r[f'change_vs_{name}']:+.1%} ({r[f'change_vs_{name}_ci'][0]:+.1%} to "
                                  f"{r[f'change_vs_{name}_ci'][1]:+.1%})" if f"change_vs_{name}" in r else "")
        lines += ["", markdown_table([f"4 unrecorded streams, {FLOOD_CLIENTS} clients calling",
                                      "output tokens/s (median)", "vs quiet (median)",
                                      "vs quiet, paired mean (95% CI over rounds)",
                                      "vs 500 calls of /v1/models, paired mean", "rounds", "calls made per round"],
                                     ([r["flood"], f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / quiet - 1:+.1%}",
                                       change(r, "quiet"), change(r, "models"), rounds(r), rounds(r, "calls")]
                                      for r in floods))]
    lanes = ("not recording", "recording")
    for r in (r for r in rows if "load" in r):
        lines += ["", f"{r['load']} requests at once, {r['prompt_tokens']} prompt tokens each; probe limits "
                      f"{json.dumps(r['limits'])}", "",
                  markdown_table(["requests", "served", "worker RSS at start, MiB", "peak, MiB",
                                  "probe key copies at most, MiB", "recorded at once at most"],
                                 ([lane, r[lane]["served"], r[lane]["start_rss_mib"], r[lane]["peak_rss_mib"],
                                   r[lane]["probe_key_copy_mib"], r[lane]["probe_recording_at_once"]] for lane in lanes))]
        failures = [f for lane in lanes for f in r[lane]["status_failures"]]
        lines += [f"\nthe probe's status failed {len(failures)} times meanwhile: {failures[0]}"] if failures else []
        lines += ["", f"requests recorded: {r['requests_recorded']}, of them under the key that half of the requests "
                      f"sent: {r['shared_key_requests_recorded']}; server healthy after: {r['healthy_after']}"]
    return "\n".join(lines)
