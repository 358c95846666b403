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
    rss = [float(r) for _, r, _ in rows]
    for _, resident, peak in rows:
        # MiB: the target (the GGUF's blocks, 96 MB, or float32, 540 MB, by --weights) and both drafters beside
        # torch and gradio; docs/performance.md measured 808 before the first run and 905 after 200 on the blocks
        assert 400 < float(resident) <= float(peak) < 2_500
    assert rss[2] - rss[1] < 100   # a second run adds no second copy of anything
