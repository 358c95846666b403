"""The probe's own parts (probe/eagle_probe): its store, its copy of the drafter's keys, and its
refusal to run on another vLLM. Its records against the reference engine, on real servers, are in
test_vllm.py."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "probe"))

from eagle_probe.attention import KeyCopy, Unavailable, across_ranks  # noqa: E402  (the probe is its own package,
from eagle_probe.store import Store  # noqa: E402                        not installed here)

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


HEADS, KV_HEADS, HEAD_DIM, LENGTH = 6, 2, 16, 40
SCALE = HEAD_DIM ** -0.5


def sequence(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(LENGTH, KV_HEADS, HEAD_DIM, generator=generator),
            torch.randn(LENGTH, KV_HEADS, HEAD_DIM, generator=generator),
            torch.randn(HEADS, HEAD_DIM, generator=generator))


def backend_output(query, keys, values, length: int) -> torch.Tensor:
    """A causal query's attention output as an attention backend computes it (torch's SDPA)."""
    out = F.scaled_dot_product_attention(query[None, :, None], keys[:length].transpose(0, 1)[None],
                                         values[:length].transpose(0, 1)[None], scale=SCALE, enable_gqa=True)
    return out[0, :, 0]


def written(keys, values, chunks) -> KeyCopy:
    """A copy filled chunk by chunk (positions), as prefill chunks and draft depths write it."""
    copy = KeyCopy(keys[:1], values.shape[-1])
    for positions in chunks:
        index = torch.tensor(positions)
        copy.write(index, keys[index], values[index])
    return copy


def test_the_key_copy_measures_the_attention_the_backend_computed():
    keys, values, query = sequence()
    position, round_start = 35, 33   # the query of depth 3: drafts at 33, 34, 35
    copy = written(keys, values, [range(0, 20), range(20, 34), [34, 35, 36]])
    masses = copy.masses(query, position, round_start, SCALE, backend_output(query, keys, values, position + 1))
    grouped = query.reshape(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    probs = (torch.einsum("kgd,lkd->kgl", grouped, keys[:position + 1]) * SCALE).softmax(-1).reshape(HEADS, -1)
    assert masses.sink == pytest.approx(probs[:, :4].sum(-1).tolist(), abs=1e-6)
    assert masses.drafts == pytest.approx(probs[:, 33:].sum(-1).tolist(), abs=1e-6)
    assert [s + d + r for s, d, r in zip(masses.sink, masses.drafts, masses.rest)] == pytest.approx([1.0] * HEADS,
                                                                                                   abs=1e-6)


def test_a_key_the_probe_never_saw_makes_attention_unavailable():
    keys, values, query = sequence()
    copy = written(keys, values, [range(8, 30)])   # positions 0..7 came from a cached prefix
    with pytest.raises(Unavailable, match="position 0 was not computed"):
        copy.masses(query, 29, 30, SCALE, backend_output(query, keys, values, 30))


@pytest.mark.parametrize("attended", ["shifted", "windowed"])
def test_a_backend_that_attends_otherwise_makes_attention_unavailable(attended):
    keys, values, query = sequence()
    copy = written(keys, values, [range(LENGTH)])
    if attended == "shifted":   # the query's row taken one position off
        output = backend_output(query, keys, values, 30)
    else:                       # a sliding window of 16 keys
        output = backend_output(query, keys[15:], values[15:], 16)
    with pytest.raises(Unavailable, match="does not reproduce the backend's attention output"):
        copy.masses(query, 30, 31, SCALE, output)


def test_tensor_parallel_ranks_give_the_mean_over_all_heads():
    """Two ranks of three heads each: a rank's record holds the mean over its own heads."""
    heads = [[[0.5, 0.1, 0.4], [0.3, 0.3, 0.4], [0.1, 0.2, 0.7]], [[0.6, 0.0, 0.4], [0.2, 0.2, 0.6], [0.4, 0.1, 0.5]]]
    ranks = []
    for by_head in heads:
        mean = [sum(h[i] for h in by_head) / 3 for i in range(3)]
        ranks.append({"records": [{"drafts": [7], "sink_attention": [mean[0]], "self_attention": [mean[1]],
                                   "rest_attention": [mean[2]], "attention_by_head": [by_head]}],
                      "finished": False, "dropped": 0})
    record = across_ranks(ranks)["records"][0]
    every_head = heads[0] + heads[1]
    assert record["sink_attention"] == pytest.approx([sum(h[0] for h in every_head) / 6])
    assert record["self_attention"] == pytest.approx([sum(h[1] for h in every_head) / 6])
    assert record["attention_by_head"] == [every_head]
    ranks[1]["records"][0] = {"drafts": [7], "attention_error": "no keys"}   # one rank could not measure
    assert across_ranks(ranks)["records"][0] == {"drafts": [7], "attention_error": "no keys"}


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
