"""Reading vLLM's /metrics and the live window over it (tests/test_vllm.py checks it against real
servers under load; these check the arithmetic and every failure, served over real HTTP)."""

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client.exceptions import AppError

from playground.app_process import api_client
from playground.cli import main
from playground.engines.vllm.metrics import MetricsError, parse_metrics
from playground.engines.vllm.watch import (BAD_METRICS, LIVE, MAX_NOTE, NO_SPECULATION, RESTARTED, UNREACHABLE,
                                           RecentReadings, ServerWindow, Watch, parse_servers, text_table)
from playground.errors import PlaygroundError
from playground.ui.servers_tab import EVERY_S, PLOTS
from tests.metrics_server import MetricsServer, metrics_page


def test_counters_are_summed_over_engines_and_kept_by_position():
    counters = parse_metrics(metrics_page(drafts=10, accepted_by_position=(8, 5, 2), generated=40, running=3,
                                          waiting=1, engines=2))
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 30, 15)
    assert counters.accepted_per_position == (8, 5, 2)
    assert (counters.generation_tokens, counters.running, counters.waiting, counters.started) == (40, 3, 1, 1.7e9)
    plain = parse_metrics(metrics_page(generated=7, speculative=False))
    assert not plain.speculative and plain.accepted_per_position == () and plain.generation_tokens == 7


@pytest.mark.parametrize("text, message", [
    ("<html>Not found</html>", "/metrics does not parse as Prometheus text (invalid metric name:<html>"),
    ("# HELP up a page of other metrics\nup 1\n",
     "/metrics has no vllm:generation_tokens_total: not a vLLM server's metrics"),
    (metrics_page() + "vllm:generation_tokens_total{engine=\"1\"} lots\n",
     "/metrics does not parse as Prometheus text (could not convert string to float: 'lots')"),
    (metrics_page() + "vllm:generation_tokens_total{engine=\"1\"} NaN\n",
     "/metrics: vllm:generation_tokens_total is not a number"),
    (metrics_page() + "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"1\"} 3\n",
     "/metrics: vllm:spec_decode_num_accepted_tokens_per_pos_total without a position"),
])
def test_a_page_that_is_not_vllms_metrics_is_one_line(text, message):
    with pytest.raises(MetricsError, match="^" + re.escape(message)) as error:
        parse_metrics(text)
    assert "\n" not in str(error.value)


def test_the_window_takes_counter_deltas_and_starts_again_when_the_server_restarts():
    window = ServerWindow("canary", "http://x:8000/", window=10)
    window.add(100, parse_metrics(metrics_page(drafts=100, accepted_by_position=(80, 50, 20), generated=900)))
    first = window.view()
    assert first.state == LIVE and first.seconds == 0 and first.tau is None and first.generation_per_s is None
    window.add(105, parse_metrics(metrics_page(drafts=110, accepted_by_position=(88, 55, 21), generated=1000,
                                               running=2)))
    view = window.view()
    assert view.state == LIVE and view.seconds == 5 and view.drafts == 10
    assert view.tau == pytest.approx(1 + 14 / 10) and view.acceptance == pytest.approx((0.8, 0.5, 0.1))
    assert (view.drafted_per_s, view.accepted_per_s, view.generation_per_s) == pytest.approx((6, 2.8, 20))
    assert view.running == 2
    window.add(112, parse_metrics(metrics_page(drafts=130, accepted_by_position=(100, 60, 30), generated=1100)))
    assert window.view().seconds == 12   # the last reading at or before the window's start stays
    window.add(116, parse_metrics(metrics_page(drafts=131, accepted_by_position=(100, 60, 30), generated=1102)))
    assert window.view().seconds == 11 and window.view().drafts == 21
    window.add(120, parse_metrics(metrics_page(drafts=5, accepted_by_position=(4, 2, 1), generated=30)))
    restarted = window.view()
    assert restarted.state == RESTARTED and "counters reset" in restarted.note
    assert restarted.seconds == 0 and restarted.generation_per_s is None   # never a negative rate
    window.add(124, parse_metrics(metrics_page(drafts=9, accepted_by_position=(7, 4, 1), generated=50)))
    assert window.view().state == RESTARTED and window.view().tau == pytest.approx(1 + 5 / 4)
    window.add(131, parse_metrics(metrics_page(drafts=9, accepted_by_position=(7, 4, 1), generated=50)))
    assert window.view().state == LIVE, "the mark goes once the reset has left the window"


def test_a_server_without_speculation_has_rates_and_no_acceptance():
    window = ServerWindow("baseline", "http://x:8000", window=60)
    window.add(0, parse_metrics(metrics_page(generated=10, speculative=False)))
    window.add(4, parse_metrics(metrics_page(generated=50, speculative=False)))
    view = window.view()
    assert view.state == NO_SPECULATION and view.generation_per_s == 10
    assert view.tau is view.acceptance is view.drafted_per_s is view.drafts is None


def test_a_restart_with_more_traffic_than_before_is_seen_by_its_start_time():
    window = ServerWindow("prod", "http://x:8000", window=60)
    window.add(0, parse_metrics(metrics_page(drafts=10, accepted_by_position=(5, 2, 1), generated=50)))
    window.add(5, parse_metrics(metrics_page(drafts=20, accepted_by_position=(9, 4, 1), generated=90,
                                             started=1.7e9 + 3)))
    assert window.view().state == RESTARTED and window.view().seconds == 0


@pytest.fixture
def metrics_server():
    server = MetricsServer()
    yield server
    server.close()


def test_each_failure_is_a_mark_and_the_window_survives_it(metrics_server, dead_port):
    now = [0.0]
    closed = f"http://127.0.0.1:{dead_port}"
    watch = Watch({"canary": metrics_server.url, "gone": closed}, window=60, clock=lambda: now[0])

    def read():
        now[0] += 5
        return watch.read()

    try:
        canary, gone = read()
        assert canary.state == LIVE and gone.state == UNREACHABLE and "cannot reach" in gone.note
        metrics_server.text = metrics_page(drafts=4, accepted_by_position=(3, 1, 0), generated=20)
        assert read()[0].tau == pytest.approx(2.0)
        metrics_server.text = "<html>maintenance</html>"
        bad = read()[0]
        assert bad.state == BAD_METRICS and bad.note.startswith(f"{metrics_server.url}/metrics does not parse")
        assert bad.tau is bad.generation_per_s is None, "no figures that are not this reading's"
        metrics_server.status, metrics_server.text = 503, "down for\nmaintenance " * 100
        down = read()[0]
        assert down.state == UNREACHABLE and "503: down for maintenance" in down.note
        assert "\n" not in down.note and len(down.note) == MAX_NOTE
        metrics_server.status, metrics_server.text = 200, metrics_page(drafts=8, accepted_by_position=(5, 2, 1),
                                                                       generated=30)
        back = read()[0]
        assert back.state == LIVE and back.tau == pytest.approx(2.0) and back.seconds == 20, "earlier readings stay"
        metrics_server.text = metrics_page(generated=30, speculative=False)
        assert read()[0].state == RESTARTED   # its speculation counters went away: a restart
        table = text_table(read(), 0)
        assert "canary  restarted" in table and "gone: cannot reach" in table
    finally:
        watch.close()


def test_watch_on_the_command_line_prints_tables_and_json(metrics_server, capsys):
    metrics_server.text = metrics_page(drafts=3, accepted_by_position=(2, 1, 0), generated=9)
    assert main(["watch", "--vllm-url", f"canary={metrics_server.url}", "--vllm-url", metrics_server.url + "/",
                 "--every", "0.2", "--count", "2", "--json"]) == 0
    readings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(readings) == 2 and [s["name"] for s in readings[1]["servers"]] == [
        "canary", metrics_server.url.split("://")[1]]
    assert readings[1]["servers"][0]["state"] == LIVE and readings[1]["servers"][0]["seconds"] > 0
    assert main(["watch", "--vllm-url", f"canary={metrics_server.url}", "--count", "1"]) == 0
    out = capsys.readouterr().out
    assert "server" in out and "pos 2" in out and "canary" in out
    assert main(["watch", "--vllm-url", "canary=localhost:8000", "--count", "1"]) == 2
    assert "error: bad --vllm-url 'canary=localhost:8000'" in capsys.readouterr().err
    assert main(["watch", "--vllm-url", metrics_server.url, "--every", "0"]) == 2


def test_servers_take_any_name_once():
    assert parse_servers(["prod=http://a:1/", "http://b:2/v1", "k=3 draft=https://c"]) == {
        "prod": "http://a:1", "b:2": "http://b:2/v1", "k=3 draft": "https://c"}
    with pytest.raises(PlaygroundError, match="--watch-url names prod twice"):
        parse_servers(["prod=http://a:1", "prod=http://b:1"], "--watch-url")
    for bad in ("prod=http://host:abc", "x=http://[::1", "x=http://", "ftp://a"):
        with pytest.raises(PlaygroundError, match="^bad --vllm-url"):
            parse_servers([bad])


def test_a_reading_after_a_gap_longer_than_the_window_starts_it_again():
    window = ServerWindow("prod", "http://x:8000", window=30)
    window.add(0, parse_metrics(metrics_page(drafts=10, accepted_by_position=(5, 2, 1), generated=50)))
    window.add(100, parse_metrics(metrics_page(drafts=90, accepted_by_position=(9, 4, 1), generated=900)))
    assert window.view().state == LIVE and window.view().seconds == 0


def test_pages_watching_one_server_share_its_readings(metrics_server):
    shared = RecentReadings(fresh_s=60)
    watches = [Watch({name: metrics_server.url}, shared=shared) for name in ("a", "b")]
    try:
        for _ in range(3):
            assert [w.read()[0].state for w in watches] == [LIVE, LIVE]
        assert metrics_server.requests == 1
    finally:
        for w in watches:
            w.close()


def test_pages_reading_one_server_at_the_same_moment_make_one_request(metrics_server):
    metrics_server.delay_s = 0.3   # the other readers arrive while the first reading is under way
    shared = RecentReadings(fresh_s=60)
    watches = [Watch({f"page{i}": metrics_server.url}, shared=shared) for i in range(8)]
    together = threading.Barrier(len(watches))

    def read(watch: Watch) -> str:
        together.wait(timeout=10)
        return watch.read()[0].state

    try:
        with ThreadPoolExecutor(len(watches)) as pool:
            assert list(pool.map(read, watches)) == [LIVE] * len(watches)
        assert metrics_server.requests == 1
    finally:
        for w in watches:
            w.close()


def test_the_page_watches_the_servers_a_visitor_names(app_url, metrics_server, dead_port):
    client = api_client(app_url)
    servers = f"canary={metrics_server.url}\ngone=http://127.0.0.1:{dead_port}"
    metrics_server.text = metrics_page(drafts=10, accepted_by_position=(8, 4, 1), generated=40)
    _, _, *first = client.predict(servers, 60, api_name="/watch")
    for plot in map(lambda p: json.loads(p["plot"]), first):   # one reading is no window: each plot says so
        assert plot["data"] == [] and "the window starts with the next" in plot["layout"]["annotations"][0]["text"]
    time.sleep(EVERY_S / 2)   # readings younger than that are shared, not taken again
    metrics_server.text = metrics_page(drafts=20, accepted_by_position=(15, 9, 3), generated=90)
    shown, status, *plots = client.predict(servers, 60, api_name="/watch")   # the same page: its second reading
    assert "<td>canary</td>" in status and ">live</span></td><td>2.40</td>" in status
    assert "<td>gone</td>" in status and ">unreachable<" in status and "cannot reach" in status
    assert len(plots) == len(PLOTS) and all(plot["type"] == "plotly" for plot in plots)
    acceptance = json.loads(plots[0]["plot"])["data"]
    assert [trace["name"] for trace in acceptance] == ["canary"]
    assert acceptance[0]["y"] == pytest.approx([0.7, 0.5, 0.2])
    for servers, window, message in [("canary=localhost:1", 60, "bad server"), ("", 60, "name a server"),
                                     ("\n".join(f"s{i}=http://a:{i}" for i in range(9)), 60, "at most 8 servers"),
                                     (f"canary={metrics_server.url}", 7, "window must be one of")]:
        with pytest.raises(AppError, match=message):
            client.predict(servers, window, api_name="/watch")
