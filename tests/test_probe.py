"""The probe's own parts (probe/eagle_probe): its store, and its refusal to run on another vLLM.
Its records against the reference engine, on real servers, are in test_vllm.py."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "probe"))

from eagle_probe.store import Store  # noqa: E402  (the probe is its own package, not installed here)

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def test_records_leave_as_they_are_fetched_and_the_request_with_its_last_fetch():
    store = Store()
    assert store.fetch("a") is None   # never recorded: the route answers 404
    assert store.open("a")
    store.add("a", {"drafts": [1, 2]})
    store.add("a", {"drafts": [3]})
    assert store.fetch("a") == {"records": [{"drafts": [1, 2], "step": 0}, {"drafts": [3], "step": 1}],
                                "finished": False, "dropped": 0}
    store.add("a", {"drafts": []})
    assert store.fetch("a") == {"records": [{"drafts": [], "step": 2}], "finished": False,
                                "dropped": 0}   # only the new ones
    assert store.fetch("a", final=True) == {"records": [], "finished": False, "dropped": 0}
    assert store.fetch("a") is None and len(store) == 0


def test_a_finished_request_leaves_with_its_last_records():
    store = Store()
    store.open("a")
    store.add("a", {"drafts": [1]})
    store.finish("a")
    assert store.fetch("a")["finished"] and store.fetch("a") is None


def test_the_store_holds_a_bounded_number_of_requests_for_a_bounded_time():
    store = Store(max_requests=2, idle_ttl_s=0.2)
    assert store.open("a") and store.open("b") and not store.open("c")
    assert "at most 2 requests" in store.fetch("c")["error"]
    time.sleep(0.3)
    assert store.open("d") and len(store) == 1   # a and b were idle past the TTL


VERSION_CHECK = """
import logging, multiprocessing, sys
import vllm
logging.basicConfig(level=logging.WARNING)
vllm.__version__ = sys.argv[1]
multiprocessing.current_process().name = "VllmWorker-0"   # a process that runs the model
from eagle_probe import hooks
hooks.install()
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
print("patched" if getattr(GPUModelRunner, "_eagle_probe", False) else "off")
"""


@pytest.mark.slow   # imports vLLM
@pytest.mark.parametrize("version, state", [("0.32.0", "patched"), ("0.33.0", "off")])
def test_the_probe_runs_only_on_the_vllm_it_was_written_for(version, state):
    if not VLLM_PYTHON.exists():
        pytest.fail("no .venv-vllm: scripts/test.sh sets it up (bash scripts/setup-vllm.sh --cpu)")
    run = subprocess.run([str(VLLM_PYTHON), "-c", VERSION_CHECK, version], capture_output=True, text=True,
                         timeout=300)
    assert run.stdout.strip().splitlines()[-1] == state, run.stderr[-2000:]
    if state == "off":
        assert "written for vLLM 0.32.0, not 0.33.0: it stays off" in run.stderr
