"""`bench memory` end to end: the real app, runs through its API, its memory read from /proc."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_memory_reports_the_apps_memory_over_two_runs():
    out = subprocess.run([sys.executable, "-m", "playground", "bench", "memory", "--runs", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=420)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.strip("|").split("|") for line in out.stdout.splitlines()[2:]]
    assert [int(done) for done, _, _ in rows] == [0, 1, 2]
    for _, rss, peak in rows:
        assert 100 < float(rss) <= float(peak) < 16_000   # MiB: a loaded model, and below the machine's memory
