"""The real app under many visitors and hostile prompt files, its memory read from /proc: each file is refused
within the limits, in the study's own queue, at little cost to the process that serves everyone else."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import handle_file

from playground.app_process import AppServer, api_client
from playground.evaluation.memory import rss_mib

pytestmark = pytest.mark.slow


def study(client, path) -> str:
    """The message the app refuses the file at `path` with."""
    with pytest.raises(Exception) as e:
        client.predict(handle_file(str(path)), "", "reference", ["eagle3"], 5, "chain", 8, 0, api_name="/study")
    return str(e.value)


def test_three_19_MiB_files_of_tiny_prompts_at_once_cost_the_app_little(tmp_path):
    """6.6 million blank-line-separated prompts each: reading stops at the 201st."""
    path = tmp_path / "tiny.txt"
    path.write_bytes(b"x\n\n" * (19 * 2**20 // 3))
    server = AppServer("--max-tokens", "64")
    try:
        clients = [api_client(server.url) for _ in range(3)]
        clients[0].predict(None, "Hi", "reference", ["eagle3"], 5, "chain", 2, 0, api_name="/study")   # warm
        before = rss_mib(server.pid)[0]
        samples, done = [before], threading.Event()

        def watch() -> None:
            while not done.is_set():
                samples.append(rss_mib(server.pid)[0])
                time.sleep(0.02)

        messages, seconds = [""] * len(clients), [0.0] * (len(clients) + 1)
        visitor = api_client(server.url)

        def upload(i: int) -> None:
            start = time.monotonic()
            messages[i] = study(clients[i], path)
            seconds[i] = time.monotonic() - start

        def run() -> None:   # a visitor of the Playground tab meanwhile
            start = time.monotonic()
            visitor.predict("Say hi.", "", "model", "eagle3.1", 5, 0.0, 1.0, 8, "reference", api_name="/run")
            seconds[-1] = time.monotonic() - start

        watcher = threading.Thread(target=watch)
        calls = [threading.Thread(target=upload, args=(i,)) for i in range(len(clients))]
        calls.append(threading.Thread(target=run))
        for thread in (watcher, *calls):
            thread.start()
        for thread in calls:
            thread.join()
        done.set()
        watcher.join()
    finally:
        server.stop()
    grown = max(samples) - before
    print(f"three uploads: {seconds[:-1]} s, a run meanwhile {seconds[-1]:.1f} s, RSS {before:.0f} MiB + "
          f"{grown:.0f} MiB at most")
    assert all("the file has more than 200 prompts; the limit is 200" in m for m in messages), messages
    assert grown < 600 and max(seconds) < 10, (grown, seconds)


def test_twenty_visitors_at_once_are_all_served_and_the_app_returns_to_its_memory():
    """15 Playground runs and 5 studies at once, twice: every one answers, and freed memory is reused, not
    kept per thread: the second wave fits in the memory the first left (its peak within 50 MiB of the
    first's, its idle RSS within 150), and neither wave holds more than 300 MiB over the warm app. Measured on
    a 2-CPU EPYC: peaks warm 868, then 1,047 -> 1,062 -> 1,075 MiB over three waves, 1,059 -> 1,059 -> 1,059
    -> 1,066 over four; idle 1,001 -> 1,027 -> 995 and 807 -> 858 -> 915 -> 854 (warm 770): the idle RSS at
    one instant moves by tens of MiB from wave to wave, the peak far less."""
    server = AppServer("--max-tokens", "64")
    try:
        warm = api_client(server.url)
        warm.predict("Say hi.", "", "model", "eagle3.1", 5, 0.0, 1.0, 8, "reference", api_name="/run")
        warm.predict(None, "Name a colour.\n\nName a fruit.", "reference", ["eagle3", "eagle3.1"], 5, "chain", 8, 0,
                     api_name="/study")
        rss = [rss_mib(server.pid)]
        clients = [api_client(server.url) for _ in range(20)]

        def visit(i: int) -> str:
            if i < 15:
                out = clients[i].predict(f"Count to {i + 3}.", "", "model", "eagle3.1", 5, 0.0, 1.0, 16, "reference",
                                         api_name="/run")
                return "run" if out else ""
            out = clients[i].predict(None, f"Name {i} colours.\n\nName a fruit.\n\nWhat is {i} + {i}?", "reference",
                                     ["eagle3", "eagle3.1"], 5, "chain", 8, 0, api_name="/study")
            return "study" if "finished" in out[0] else ""

        served, seconds = [], []
        for _ in range(2):
            started = time.monotonic()
            with ThreadPoolExecutor(20) as pool:
                served.append([future.result(timeout=600) for future in [pool.submit(visit, i) for i in range(20)]])
            seconds.append(time.monotonic() - started)
            time.sleep(2)
            rss.append(rss_mib(server.pid))
    finally:
        server.stop()
    (warm, warm_peak), (first_idle, first_peak), (idle, peak) = rss
    print(f"20 visitors twice: {seconds[0]:.1f} and {seconds[1]:.1f} s, RSS (now, peak) "
          + " -> ".join(f"({now:.0f}, {high:.0f})" for now, high in rss) + " MiB")
    assert served == [["run"] * 15 + ["study"] * 5] * 2
    assert peak - first_peak < 50 and idle - first_idle < 150
    assert peak - warm_peak < 300 and idle - warm < 300
