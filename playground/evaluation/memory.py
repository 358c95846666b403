"""`python -m playground bench memory`: the app's resident memory over many consecutive runs.

Starts the real app (both drafters loaded), sends runs through its API one after another with
gradio_client, and reads the server's VmRSS / VmHWM from /proc ten times along the way.
"""

from __future__ import annotations

from pathlib import Path

from playground.app_process import AppServer, api_client
from playground.model.variants import EAGLE3, EAGLE31, NONE

PROMPTS = ("Tell me about the Moon.", "Write a Python function that adds two numbers.",
           "Give me three tips for a job interview.", "What is a rainbow?")


def _rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def rss_over_runs(runs: int = 200, max_tokens: int = 24) -> list[tuple[int, float, float]]:
    """(runs done, RSS MiB, peak RSS MiB) of the app process, sampled ten times over the runs."""
    every = max(1, runs // 10)
    app = AppServer()
    try:
        client = api_client(app.url)
        pid = app.pid
        samples = [(0, *_rss_mib(pid))]
        for i in range(runs):
            drafter = (EAGLE31, EAGLE3, NONE)[i % 3]
            client.predict(PROMPTS[i % len(PROMPTS)], "", "model", drafter, 5, 0.0, 1.0, max_tokens, "reference",
                           api_name="/run")
            if (i + 1) % every == 0:
                samples.append((i + 1, *_rss_mib(pid)))
        return samples
    finally:
        app.stop()
