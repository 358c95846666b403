"""`python -m playground bench memory`: the app's resident memory over many consecutive runs, or over
one study of many prompts (`--study N`: the Your prompts tab's /study).

Starts the real app (both drafters loaded), sends runs through its API one after another with
gradio_client, and reads the server's VmRSS / VmHWM from /proc ten times along the way.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from playground.app_process import AppServer, api_client
from playground.model.variants import EAGLE3, EAGLE31, NONE

PROMPTS = ("Tell me about the Moon.", "Write a Python function that adds two numbers.",
           "Give me three tips for a job interview.", "What is a rainbow?")


def rss_mib(pid: int) -> tuple[float, float]:
    """(RSS, peak RSS) of process `pid` in MiB, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak_rss(pid: int) -> None:
    """Start process `pid`'s peak RSS afresh from its present RSS (Linux's clear_refs), so that the next
    `rss_mib` peak is that of what ran since."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def rss_over_runs(runs: int = 200, max_tokens: int = 24) -> list[tuple[int, float, float]]:
    """(runs done, RSS MiB, peak RSS MiB) of the app process, sampled ten times over the runs."""
    every = max(1, runs // 10)
    app = AppServer()
    try:
        client = api_client(app.url)
        pid = app.pid
        samples = [(0, *rss_mib(pid))]
        for i in range(runs):
            drafter = (EAGLE31, EAGLE3, NONE)[i % 3]
            client.predict(PROMPTS[i % len(PROMPTS)], "", "model", drafter, 5, 0.0, 1.0, max_tokens, "reference",
                           api_name="/run")
            if (i + 1) % every == 0:
                samples.append((i + 1, *rss_mib(pid)))
        return samples
    finally:
        app.stop()


def rss_over_study(prompts: int = 200, max_tokens: int = 16) -> list[tuple[int, float, float]]:
    """(prompts done, RSS MiB, peak RSS MiB) of the app process while one study of `prompts` prompts (both
    drafters) streams its progress and report; sampled as the progress passes each tenth of the prompts."""
    from gradio_client import handle_file

    every = max(1, prompts // 10)
    app = AppServer("--study-prompts", str(prompts))
    try:
        client = api_client(app.url)
        samples = [(0, *rss_mib(app.pid))]
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "prompts.txt"
            path.write_text("\n\n".join(f"{PROMPTS[i % len(PROMPTS)]} ({i + 1})" for i in range(prompts)))
            job = client.submit(handle_file(str(path)), "", "reference", [EAGLE3, EAGLE31], 5, "chain", max_tokens, 0,
                                api_name="/study")
            for output in job:
                done = int(re.search(r"aria-valuenow='(\d+)'", output[0]).group(1))
                if done >= samples[-1][0] + every:
                    samples.append((done, *rss_mib(app.pid)))
            job.result()
        return samples
    finally:
        app.stop()
