"""The worker side: wraps of vLLM 0.32's V1 model runner and speculative proposer that record the
steps of requests that opted in, and the worker methods the HTTP routes call.

Where each figure comes from (vllm/v1/worker/gpu_model_runner.py, vllm/v1/spec_decode/llm_base_proposer.py):
- drafts verified in a step: `scheduler_output.scheduled_spec_decode_tokens[req]`, what the
  scheduler sent the target (the drafts of the step before, trimmed as it decided);
- accepted: the rejection sampler's committed tokens of the step minus its one target token
  (`ModelRunnerOutput.sampled_token_ids`), the count vLLM's own spec-decode metrics use;
- fed-back RMS by depth, for EAGLE-3 drafters: the `hidden_states` the drafter model is called
  with. Call 0 of `propose` gets the fused target features of the whole batch (the request's row is
  `token_indices_to_sample`); call d >= 1 gets the state fed back from depth d, one row per request.
- the drafter's probability of each draft, for EAGLE-family drafters: the softmax of the drafter's
  logits for the probed rows of `_sample_draft_tokens` (one row per request at every depth), at
  the draft it chose;
- attention by depth, for EAGLE-3 drafters: the query of that same row in the drafter's (first)
  attention layer, whose backend `forward` is wrapped on the instance; its keys are the probe's own
  copy of the request's keys (attention.py), checked against the backend's output on every query.
Nothing is computed for a step in which no request opted in.

No hook raises into vLLM: the probe's part of every hook runs guarded, and a failure ends the
recording of the requests in that step with a record that says where and why. vLLM's own calls are
never inside the guard, so its exceptions reach it as they would without the probe.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Callable

import torch

from eagle_probe import CHECKED_VERSIONS, HEADS_FIELD, REQUEST_FIELD, VLLM_VERSION, __version__
from eagle_probe.attention import SINK_TOKENS, Budget, KeyCopy, Unavailable
from eagle_probe.capabilities import measures
from eagle_probe.settings import Settings
from eagle_probe.store import Store

log = logging.getLogger("eagle_probe")
# processes that run the model: the engine core (a single in-process worker) and multiprocess workers
RUNNER_PROCESSES = ("EngineCore", "VllmWorker")
# a file whose text names the hooks that raise (tests: every failure of the probe must leave vLLM serving)
FAULT_FILE = "EAGLE_PROBE_FAULT_FILE"
FAULTS = os.environ.get(FAULT_FILE)


SETTINGS = Settings.read()
STORE = Store(SETTINGS)
BUDGET = Budget(SETTINGS.max_key_bytes, SETTINGS.max_positions)


# the methods the probe wraps, with their parameters in vLLM 0.32.0: (module, class, method) -> parameters
HOOKED = {
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states"): ("self", "scheduler_output"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"): ("self", "grammar_output"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"): (
        "self", "scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states",
        "sample_hidden_states", "aux_hidden_states", "spec_decode_metadata", "common_attn_metadata", "slot_mappings"),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "set_inputs_first_pass"): (
        "self", "target_token_ids", "next_token_ids", "target_positions", "target_hidden_states",
        "token_indices_to_sample", "cad", "num_rejected_tokens_gpu"),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "_sample_draft_tokens"): (
        "self", "hidden_states", "sampling_metadata"),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "load_model"): ("self", "target_model"),
}


# what the hooks read of vLLM's objects besides the methods they wrap: (module, class) -> attributes. Where
# a value is taken by position it is named here too: set_inputs_first_pass returns token_indices_to_sample
# second. tests/test_probe_fits_releases.py checks HOOKED, READS and that position in each release's source.
READS = {
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"): (
        "requests", "input_batch", "execute_model_state", "speculative_config"),
    ("vllm.v1.worker.gpu_model_runner", "ExecuteModelState"): ("scheduler_output",),
    ("vllm.v1.worker.gpu_input_batch", "InputBatch"): ("req_ids",),
    ("vllm.v1.worker.gpu_input_batch", "CachedRequestState"): ("sampling_params", "num_prompt_tokens"),
    ("vllm.v1.core.sched.output", "SchedulerOutput"): ("scheduled_spec_decode_tokens", "finished_req_ids"),
    ("vllm.v1.outputs", "ModelRunnerOutput"): ("req_id_to_index", "sampled_token_ids"),
    ("vllm.sampling_params", "SamplingParams"): ("extra_args",),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer"): (
        "method", "model", "parallel_drafting", "use_heterogeneous_vocab"),
}
FIRST_PASS_SAMPLED = 1   # the index of token_indices_to_sample in what set_inputs_first_pass returns


def hooks_missing() -> list[str]:
    """What of the hooked code this vLLM lacks or has changed (empty: every hooked method is there with
    the parameters the probe was written against)."""
    import importlib
    import inspect

    missing = []
    for (module, cls, method), parameters in HOOKED.items():
        try:
            found = getattr(getattr(importlib.import_module(module), cls), method)
        except (ImportError, AttributeError):
            missing.append(f"{cls}.{method} is missing")
            continue
        if tuple(inspect.signature(found).parameters) != parameters:
            missing.append(f"{cls}.{method} takes ({', '.join(inspect.signature(found).parameters)})")
    return missing


def version_check(version: str) -> str:
    """How this vLLM release is known to fit the probe ("" where it does not fit: the probe stays off).
    The hooked methods are checked under every release, the ones named in CHECKED_VERSIONS too: a
    patched or mislabelled build of a checked release is refused by what its code takes."""
    missing = hooks_missing()
    if missing:
        log.warning("eagle_probe %s does not fit vLLM %s (%s): it stays off", __version__, version,
                    "; ".join(missing))
        return ""
    if version in CHECKED_VERSIONS:
        return CHECKED_VERSIONS[version]
    log.warning("eagle_probe %s has not been checked against vLLM %s; every method it hooks is there as in %s, so "
                "it runs unverified: its attention self-check decides what it reports", __version__, version,
                VLLM_VERSION)
    return f"unverified: not checked against this release; the methods it hooks are there as in {VLLM_VERSION}"


def install() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it in every one of its processes."""
    import vllm

    if not multiprocessing.current_process().name.startswith(RUNNER_PROCESSES):
        return
    checked = version_check(vllm.__version__)
    if not checked:
        return
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    WORKER.vllm = (vllm.__version__, checked)
    if getattr(GPUModelRunner, "_eagle_probe", False):
        return
    classes = {"GPUModelRunner": GPUModelRunner, "SpecDecodeBaseProposer": SpecDecodeBaseProposer}
    # each wrapper is this module's function named after its method; all are found before any is installed
    wrappers = [(classes[cls], method, globals()["_" + method.lstrip("_")]) for _, cls, method in HOOKED]
    GPUModelRunner._eagle_probe = True
    for cls, method, wrapper in wrappers:
        _wrap(cls, method, wrapper)
    # the methods the API process calls (collective_rpc); each refuses a caller without its token
    WorkerBase.eagle_probe_configure = lambda worker, secrets, token: STORE.configure(
        [bytes.fromhex(s) for s in secrets], token)
    WorkerBase.eagle_probe_fetch = lambda worker, token, asked: STORE.fetch_many(token, asked)
    WorkerBase.eagle_probe_status = lambda worker, token: status(token, getattr(worker, "model_runner", None),
                                                                 GPUModelRunner)


def status(token: object, runner, hooked_class: type) -> dict:
    STORE.check(token)
    memory = {"record_bytes": STORE.held_bytes, "key_copy_bytes": BUDGET.used} if SETTINGS.status_memory else {}
    return {"version": __version__, "vllm": WORKER.vllm[0], "vllm_checked": WORKER.vllm[1],
            "checked_versions": CHECKED_VERSIONS, "recording": STORE.live(), "steps_seen": WORKER.steps,
            "fetch_calls": STORE.fetch_calls, "unproven_keys": STORE.unproven, **memory,
            "limits": SETTINGS.describe(),
            "measures": measures(runner, hooked_class, WORKER.attention_backend)}


def _wrap(cls: type, name: str, wrapper) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)
    setattr(cls, name, wrapped)


def guarded(hook: str, part: Callable, *args, **kwargs):
    """`part(*args, **kwargs)`, the probe's share of a hook: an exception in it ends the recording of the
    requests in this step (their records say why), and returns None."""
    try:
        if FAULTS and hook in Path(FAULTS).read_text().split():
            raise RuntimeError(f"a fault injected into {hook} ({FAULT_FILE})")
        return part(*args, **kwargs)
    except Exception as e:
        log.warning("eagle_probe failed in %s: %r; the requests it was recording are no longer recorded", hook, e)
        WORKER.fail(f"the probe failed in {hook}: {type(e).__name__}: {e}")
        return None


def _extra_args(runner, req_id: str) -> dict:
    """The request's `vllm_xargs` ({} when it has none, or has left the runner)."""
    state = runner.requests.get(req_id)
    return (state.sampling_params.extra_args if state is not None and state.sampling_params else None) or {}


Attention = list   # by depth: the Masses of that depth's query, or why there are none (a str)


@dataclass
class Query:
    """One depth's query row and the backend's output for it, kept until the round's drafts are all made:
    the depths of a round are measured together, reading the request's key copy once."""
    query: torch.Tensor    # [heads, head_dim]
    output: torch.Tensor   # [heads, value_dim]
    position: int


@dataclass
class Proposal:
    drafts: list[int]
    rms: list[float] = field(default_factory=list)
    attention: Attention = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    probe_ms: float = 0.0


@dataclass
class Capture:
    """What one `propose` call records: the batch rows to measure and, per row, the RMS and the
    attention by depth."""
    rows: dict[int, str]                      # batch row -> internal request id
    prompt_tokens: dict[int, int]             # batch row -> its prompt's length (sinks lie within it)
    first_rows: dict[int, int] | None = None  # batch row -> its row in call 0 (token_indices_to_sample)
    calls: int = 0
    positions: object = None                  # the current call's positions tensor
    round_start: dict[int, int] = field(default_factory=dict)   # batch row -> position of its first draft
    scale: float = 1.0                        # the drafter attention's softmax scale
    rms: dict[int, list[float]] = field(default_factory=dict)
    attention: dict[int, list[Query | str]] = field(default_factory=dict)   # measured when the round ends
    probs: dict[int, list[float]] = field(default_factory=dict)
    sampling: bool = False     # set while vLLM samples this call's drafts
    logits: object = None      # the logits vLLM computed for them, the probed rows in float32
    spent_s: float = 0.0   # time the probe's measurements took in this call, for all its rows


@dataclass
class Worker:
    """What the hooks keep between calls in one worker process (the runner calls them one at a time).
    Every dict is keyed by vLLM's internal request id and emptied when vLLM reports the request finished."""
    keys: dict[str, str] = field(default_factory=dict)           # admitted requests -> their client's key
    passed: set[str] = field(default_factory=set)                # requests not recorded (not asked, or refused)
    broken: set[str] = field(default_factory=set)                # admitted requests whose recording failed
    pending: dict[str, Proposal] = field(default_factory=dict)   # admitted requests -> their next drafts
    copies: dict[str, KeyCopy] = field(default_factory=dict)     # admitted requests -> their drafter keys
    no_copy: dict[str, str] = field(default_factory=dict)        # admitted requests -> why they have no copy
    capture: Capture | None = None   # set while a propose call for probed requests runs
    steps: int = 0                   # steps the hooks have seen: 0 under traffic means they do not run
    attention_backend: str = ""      # the drafter attention backend's class, once the drafter loads
    vllm: tuple[str, str] = ("", "")  # this vLLM's version, and how it is known to fit the probe

    def admitted(self, runner) -> dict[str, str]:
        """The requests of the runner's batch being recorded: internal id -> the client's key. A request
        is admitted or refused once, at its first step."""
        keys = {}
        for req in runner.input_batch.req_ids:
            if req in self.passed or req in self.broken:
                continue
            if req not in self.keys:
                key = _extra_args(runner, req).get(REQUEST_FIELD)
                if key is None or STORE.admit(key, req) is not None:
                    self.passed.add(req)
                    continue
                self.keys[req] = key
            keys[req] = self.keys[req]
        return keys

    def forget(self, finished: set[str]) -> None:
        """Requests the scheduler reports finished (aborted ones too): their records are complete."""
        for req in finished:
            self.passed.discard(req)
            self.broken.discard(req)
            self.pending.pop(req, None)
            self.no_copy.pop(req, None)
            self.drop_copy(req)
            if req in self.keys:
                STORE.finish(self.keys.pop(req), req)

    def drop_copy(self, req: str) -> None:
        copy = self.copies.pop(req, None)
        if copy is not None:
            copy.release()

    def fail(self, why: str) -> None:
        """End the recording of every request being recorded now: the last record of each says why."""
        self.capture = None
        for req, key in self.keys.items():
            if req not in self.broken:
                self.broken.add(req)
                self.pending.pop(req, None)
                self.drop_copy(req)
                STORE.add(key, req, {"request": req, "error": why})


WORKER = Worker()


def _update_states(original, runner, scheduler_output):
    """Every step begins here, scheduled or not: the moment to forget the requests that finished."""
    guarded("update_states", _count_step, scheduler_output)
    result = original(runner, scheduler_output)
    if WORKER.keys:
        guarded("update_states", _forget_gone, runner)
    return result


def _count_step(scheduler_output) -> None:
    WORKER.steps += 1
    if WORKER.keys or WORKER.passed:
        WORKER.forget(scheduler_output.finished_req_ids)


def _forget_gone(runner) -> None:
    """The recorded requests the runner no longer holds (it drops a request only when it finishes,
    vllm/v1/worker/gpu_model_runner.py ~1183): finished, where the probe missed the step that said so."""
    WORKER.forget({req for req in WORKER.keys if req not in runner.requests})


def _sample_tokens(original, runner, grammar_output):
    before = guarded("sample_tokens", _verified_drafts, runner)
    output = original(runner, grammar_output)   # also proposes the next step's drafts
    if before:
        guarded("sample_tokens", _record_step, runner, output, *before)
    return output


def _verified_drafts(runner) -> tuple[dict, dict, dict] | None:
    """Before the step's sampling: the recorded requests, the drafts their step verifies, and the
    proposals those drafts came from."""
    state = runner.execute_model_state
    keys = WORKER.admitted(runner) if state is not None else {}
    if not keys:
        return None
    scheduled = state.scheduler_output.scheduled_spec_decode_tokens
    verified = {req: list(scheduled.get(req, ())) for req in keys}
    return keys, verified, {req: WORKER.pending.pop(req, None) for req in keys}


def _record_step(runner, output, keys: dict, verified: dict, proposals: dict) -> None:
    index = getattr(output, "req_id_to_index", None)
    for req, key in keys.items():
        if req in WORKER.broken:
            continue
        if index is None:   # asynchronous scheduling hands its output over later
            WORKER.broken.add(req)
            STORE.add(key, req, {"request": req, "error": "asynchronous scheduling: start vLLM with "
                                                          "--no-async-scheduling to record steps"})
            continue
        tokens = [int(t) for t in output.sampled_token_ids[index[req]]] if req in index else []
        if tokens:   # none: a chunk of a long prompt, nothing committed yet
            STORE.add(key, req, _record(runner, req, verified[req], tokens, proposals[req]))


def _record(runner, req: str, drafts: list[int], tokens: list[int], proposal: Proposal | None) -> dict:
    record = {"request": req, "drafts": drafts, "accepted": len(tokens) - 1 if drafts else 0, "tokens": tokens,
              "hidden_rms": []}
    if drafts and proposal is not None and proposal.drafts[:len(drafts)] == drafts:
        record["hidden_rms"] = proposal.rms[:len(drafts)]
        record["draft_probs"] = proposal.probs[:len(drafts)]
        record["probe_ms"] = proposal.probe_ms
        if not proposal.rms and runner.speculative_config.method.startswith("eagle3"):
            record["note"] = "the drafter's forward ran without Python hooks (a captured graph): no RMS"
        if proposal.attention:
            record.update(_attention_fields(proposal.attention[:len(drafts)], bool(_extra_args(runner, req).get(
                HEADS_FIELD))))
    return record


def _attention_fields(by_depth: Attention, heads: bool) -> dict:
    """The record's attention by depth, averaged over this worker's query heads (and per head if asked)."""
    errors = [m for m in by_depth if isinstance(m, str)]
    if errors:
        return {"attention_error": errors[0]}
    fields = {"sink_attention": [fmean(m.sink) for m in by_depth],
              "self_attention": [fmean(m.drafts) for m in by_depth],
              "rest_attention": [fmean(m.rest) for m in by_depth]}
    if heads:
        fields["attention_by_head"] = [[list(h) for h in zip(m.sink, m.drafts, m.rest)] for m in by_depth]
    return fields


def _propose_draft_token_ids(original, runner, *args, **kwargs):
    capture = guarded("propose_draft_token_ids", _start_capture, runner)
    if capture is None:
        return original(runner, *args, **kwargs)
    try:
        drafts = original(runner, *args, **kwargs)
    finally:
        WORKER.capture = None
    guarded("propose_draft_token_ids", _keep_proposals, capture, drafts)
    return drafts


def _start_capture(runner) -> Capture | None:
    keys = WORKER.admitted(runner)
    if not keys:
        return None
    rows = {i: req for i, req in enumerate(runner.input_batch.req_ids) if req in keys}
    WORKER.capture = Capture(rows, {row: runner.requests[req].num_prompt_tokens for row, req in rows.items()})
    return WORKER.capture


def _keep_proposals(capture: Capture, drafts) -> None:
    _measure_round(capture)
    for row, req in capture.rows.items():
        if req in WORKER.broken:
            continue
        ids = drafts[row].tolist() if hasattr(drafts, "tolist") else list(drafts[row])
        WORKER.pending[req] = Proposal([int(t) for t in ids], capture.rms.get(row, []),
                                       capture.attention.get(row, []), capture.probs.get(row, []),
                                       capture.spent_s * 1e3)


def _set_inputs_first_pass(original, proposer, *args, **kwargs):
    result = original(proposer, *args, **kwargs)
    if WORKER.capture is not None:
        guarded("set_inputs_first_pass", _note_first_rows, WORKER.capture, result)
    return result


def _note_first_rows(capture: Capture, result) -> None:
    token_indices_to_sample = result[FIRST_PASS_SAMPLED]
    capture.first_rows = {row: int(token_indices_to_sample[row]) for row in capture.rows}


def _sample_draft_tokens(original, proposer, hidden_states, *args, **kwargs):
    """One depth's drafts, from one row per request; for the probed rows, the drafter's probability of
    the draft chosen, from the logits vLLM computes for them (kept by _keep_logits while this runs)."""
    capture = WORKER.capture
    measuring = capture is not None and guarded("sample_draft_tokens", _measures_draft_probs, proposer)
    if measuring:
        capture.sampling, capture.logits = True, None
    try:
        result = original(proposer, hidden_states, *args, **kwargs)
    finally:
        if measuring:
            capture.sampling = False
    if measuring:
        guarded("sample_draft_tokens", _draft_probs, capture, proposer, hidden_states, result)
        capture.logits = None
    return result


def _measures_draft_probs(proposer) -> bool:
    one_row_each = not getattr(proposer, "parallel_drafting", False)   # parallel drafting: k rows a request
    own_vocab = getattr(proposer, "use_heterogeneous_vocab", False)    # its logits are over another vocabulary
    return one_row_each and not own_vocab and hasattr(proposer.model, "compute_logits")


def _keep_logits(compute_logits):
    """Wrap the drafter's `compute_logits` (on the instance): while drafts are sampled for a probed
    batch, keep a copy of the probed rows of the logits vLLM computes (it may scale them in place
    afterwards), so the probe never computes them again."""
    @functools.wraps(compute_logits)
    def wrapped(hidden_states, *args, **kwargs):
        logits = compute_logits(hidden_states, *args, **kwargs)
        capture = WORKER.capture
        if capture is not None and capture.sampling:
            guarded("sample_draft_tokens", _keep_rows, capture, hidden_states, logits)
        return logits
    return wrapped


def _keep_rows(capture: Capture, hidden_states, logits) -> None:
    start = time.perf_counter()
    if logits is not None and logits.shape[0] == hidden_states.shape[0] > max(capture.rows):
        capture.logits = logits[list(capture.rows)].float()
    capture.spent_s += time.perf_counter() - start


def _draft_probs(capture: Capture, proposer, hidden_states, result) -> None:
    start = time.perf_counter()
    drafts = result[0] if isinstance(result, tuple) else result
    rows = list(capture.rows)
    # vLLM's own logits of the probed rows; computed here only where it drew the drafts without them
    logits = capture.logits if capture.logits is not None else proposer.model.compute_logits(hidden_states[rows])
    if logits is not None:
        chosen = drafts[rows].reshape(-1, 1).to(logits.device)
        if int(chosen.max()) >= logits.shape[-1]:   # logits over another vocabulary than the drafts'
            return
        probs = logits.float().softmax(-1).gather(1, chosen)[:, 0].tolist()
        for row, prob in zip(rows, probs):
            capture.probs.setdefault(row, []).append(prob)
    capture.spent_s += time.perf_counter() - start


def _load_model(original, proposer, *args, **kwargs):
    result = original(proposer, *args, **kwargs)
    guarded("load_model", _attach_to_drafter, proposer)
    return result


def _attach_to_drafter(proposer) -> None:
    if hasattr(proposer.model, "compute_logits"):
        proposer.model.compute_logits = _keep_logits(proposer.model.compute_logits)
    if proposer.method.startswith("eagle3"):
        proposer.model.register_forward_pre_hook(_measure_fed_back_state, with_kwargs=True)
        layers = [m for m in proposer.model.modules() if hasattr(m, "impl") and hasattr(m.impl, "forward")]
        if layers:   # EAGLE-3 drafters have one decoder layer; deeper ones are measured at the first
            WORKER.attention_backend = type(layers[0].impl).__name__
            _watch_attention(layers[0].impl)


def _measure_fed_back_state(module, args, kwargs):
    """A forward pre-hook on the EAGLE-3 drafter: the RMS of the state entering this depth, per probed row."""
    capture = WORKER.capture
    if capture is not None:   # None: warm-up, dummy runs, batches without a probed request
        guarded("fed_back_state", _fed_back_rms, capture, kwargs)
    return None


def _fed_back_rms(capture: Capture, kwargs: dict) -> None:
    hidden = kwargs.get("hidden_states")
    if hidden is None:
        return
    start = time.perf_counter()
    capture.positions = kwargs.get("positions")
    if capture.calls == 0:
        rows = None if capture.first_rows is None else list(capture.first_rows.values())
    else:
        rows = list(capture.rows)
    if rows is not None:
        rms = hidden[rows].float().pow(2).mean(dim=-1).sqrt().tolist()
        for row, value in zip(capture.rows, rms):
            capture.rms.setdefault(row, []).append(value)
    capture.calls += 1
    capture.spent_s += time.perf_counter() - start


def _watch_attention(impl) -> None:
    """Wrap the drafter attention backend's `forward` on this instance: vLLM calls it from its
    attention op's Python body (never traced into a compiled graph), after the step's keys are written."""
    original = impl.forward

    @functools.wraps(original)
    def forward(layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
        result = original(layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        capture = WORKER.capture
        if capture is not None and attn_metadata is not None:
            start = time.perf_counter()
            guarded("attention", _measure_attention, capture, impl, query, key, value, attn_metadata, args, kwargs)
            capture.spent_s += time.perf_counter() - start
        return result
    impl.forward = forward


def _measure_attention(capture: Capture, impl, query, key, value, attn_metadata, args: tuple, kwargs: dict) -> None:
    """Add the probed rows' keys of this drafter call to their copies, and measure each one's query."""
    output = kwargs["output"] if "output" in kwargs else args[0]
    depth = capture.calls - 1   # the pre-hook has counted this call
    if key is None or capture.positions is None or (depth == 0 and capture.first_rows is None) \
            or not hasattr(attn_metadata, "query_start_loc"):
        for row in capture.rows:
            capture.attention.setdefault(row, []).append(
                "the drafter's attention backend does not hand the probe its keys, positions and query rows")
        return
    starts = attn_metadata.query_start_loc.tolist()
    positions = capture.positions
    keys, values = (t.reshape(t.shape[0], impl.num_kv_heads, -1) for t in (key, value))
    for row, req in capture.rows.items():
        start, end = starts[row], starts[row + 1]
        if end <= start:
            continue
        capture.attention.setdefault(row, []).append(
            _measure_row(capture, impl, req, row, depth, start, end, positions, query, keys, values, output))


def _measure_row(capture: Capture, impl, req: str, row: int, depth: int, start: int, end: int, positions,
                 query, keys, values, output) -> Query | str:
    """One request's query at this depth, kept to be measured when the round ends, or why it has none.
    The row measured must be the one whose output becomes the draft: at depth 0 the row vLLM samples
    from, at depth d >= 1 the request's only row, at the position d after the round's first (the
    sink/draft split depends on it)."""
    at = capture.first_rows[row] if depth == 0 else start
    position = int(positions[at])
    if depth == 0:
        if not start <= at < end:
            return "the row vLLM drafts from lies outside the request's query rows: the probe cannot place it"
        capture.round_start[row] = position + 1
    elif end - start != 1 or position != capture.round_start[row] + depth - 1:
        return (f"at draft depth {depth + 1} the drafter's query is not one row at the position after the last "
                "draft: the probe would measure another row than the draft's")
    if req in WORKER.no_copy:
        return WORKER.no_copy[req]
    try:
        copy = WORKER.copies.get(req)
        if copy is None:
            copy = WORKER.copies[req] = KeyCopy(keys, values.shape[-1], BUDGET)
        copy.write(positions[start:end], keys[start:end], values[start:end])
    except Unavailable as e:   # over a limit: no copy at all for this request from now on
        _measure_queries(capture, row, req)   # the depths before this one attended within the limits
        WORKER.no_copy[req] = str(e)
        WORKER.drop_copy(req)
        return str(e)
    capture.scale = impl.scale
    return Query(query[at].reshape(impl.num_heads, -1).clone(), output[at].reshape(impl.num_heads, -1).clone(),
                 position)


def _measure_round(capture: Capture) -> None:
    """Every probed row's queries of this round, measured at once over the row's key copy."""
    start = time.perf_counter()
    for row, req in capture.rows.items():
        _measure_queries(capture, row, req)
    capture.spent_s += time.perf_counter() - start


def _measure_queries(capture: Capture, row: int, req: str) -> None:
    """The row's queries kept so far this round, measured together and put in their depths' places."""
    by_depth = capture.attention.get(row) or []
    queries = [(d, q) for d, q in enumerate(by_depth) if isinstance(q, Query)]
    if not queries:
        return
    copy = WORKER.copies.get(req)
    if copy is None:
        for d, _ in queries:
            by_depth[d] = WORKER.no_copy.get(req, "the probe's key copy of this request is gone")
        return
    measured = copy.masses_of_round(torch.stack([q.query for _, q in queries]), [q.position for _, q in queries],
                                    capture.round_start[row], min(SINK_TOKENS, capture.prompt_tokens[row]),
                                    capture.scale, torch.stack([q.output for _, q in queries]))
    for (d, _), masses in zip(queries, measured):
        by_depth[d] = masses
