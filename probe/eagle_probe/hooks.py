"""The worker side: wraps of vLLM 0.32's V1 model runner and speculative proposer that record the
steps of requests that opted in, and the worker method the HTTP route calls.

Where each figure comes from (vllm/v1/worker/gpu_model_runner.py, vllm/v1/spec_decode/llm_base_proposer.py):
- drafts verified in a step: `scheduler_output.scheduled_spec_decode_tokens[req]`, what the
  scheduler sent the target (the drafts of the step before, trimmed as it decided);
- accepted: the rejection sampler's committed tokens of the step minus its one target token
  (`ModelRunnerOutput.sampled_token_ids`), the count vLLM's own spec-decode metrics use;
- fed-back RMS by depth, for EAGLE-3 drafters: the `hidden_states` the drafter model is called
  with. Call 0 of `propose` gets the fused target features of the whole batch (the request's row is
  `token_indices_to_sample`); call d >= 1 gets the state fed back from depth d, one row per request.
Nothing is computed for a step in which no request opted in.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
from dataclasses import dataclass, field

from eagle_probe import REQUEST_FIELD, VLLM_VERSION, __version__
from eagle_probe.store import Store

log = logging.getLogger("eagle_probe")
STORE = Store()
# processes that run the model: the engine core (a single in-process worker) and multiprocess workers
RUNNER_PROCESSES = ("EngineCore", "VllmWorker")


def install() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it in every one of its processes."""
    import vllm

    if vllm.__version__ != VLLM_VERSION:
        log.warning("eagle_probe %s was written for vLLM %s, not %s: it stays off", __version__, VLLM_VERSION,
                    vllm.__version__)
        return
    if not multiprocessing.current_process().name.startswith(RUNNER_PROCESSES):
        return
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    if getattr(GPUModelRunner, "_eagle_probe", False):
        return
    GPUModelRunner._eagle_probe = True
    _wrap(GPUModelRunner, "_update_states", _update_states)
    _wrap(GPUModelRunner, "sample_tokens", _sample_tokens)
    _wrap(GPUModelRunner, "propose_draft_token_ids", _propose_draft_token_ids)
    _wrap(SpecDecodeBaseProposer, "set_inputs_first_pass", _set_inputs_first_pass)
    _wrap(SpecDecodeBaseProposer, "load_model", _load_model)
    WorkerBase.eagle_probe_fetch = lambda worker, key, final=False: STORE.fetch(key, final)
    WorkerBase.eagle_probe_status = lambda worker: {"version": __version__, "vllm": vllm.__version__,
                                                    "recording": len(STORE), "steps_seen": WORKER.steps}


def _wrap(cls: type, name: str, wrapper) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)
    setattr(cls, name, wrapped)


def probed(runner) -> dict[str, str]:
    """The requests of the runner's batch that asked to be recorded: internal id -> the client's id."""
    keys = {}
    for req_id in runner.input_batch.req_ids:
        state = runner.requests.get(req_id)
        extra = state.sampling_params.extra_args if state is not None and state.sampling_params else None
        if extra and extra.get(REQUEST_FIELD):
            keys[req_id] = str(extra[REQUEST_FIELD])
    return keys


@dataclass
class Proposal:
    drafts: list[int]
    rms: list[float] = field(default_factory=list)


@dataclass
class Capture:
    """What one `propose` call records: the batch rows to measure and, per row, the RMS by depth."""
    rows: dict[int, str]                      # batch row -> internal request id
    first_rows: list[int] | None = None       # call 0's rows: token_indices_to_sample of `rows`
    calls: int = 0
    rms: dict[int, list[float]] = field(default_factory=dict)


@dataclass
class Worker:
    """What the hooks keep between calls in one worker process (the runner calls them one at a time)."""
    pending: dict[str, Proposal] = field(default_factory=dict)   # internal request id -> its next drafts
    keys: dict[str, str] = field(default_factory=dict)           # internal request id -> the client's id
    capture: Capture | None = None   # set while a propose call for probed requests runs
    steps: int = 0                   # steps the hooks have seen: 0 under traffic means they do not run

    def forget(self, finished: set[str]) -> None:
        """Requests the scheduler reports finished: their records are complete, their proposals void."""
        for req in finished:
            self.pending.pop(req, None)
            if req in self.keys:
                STORE.finish(self.keys.pop(req))


WORKER = Worker()


def _update_states(original, runner, scheduler_output):
    """Every step begins here, scheduled or not: the moment to forget the requests that finished."""
    WORKER.steps += 1
    if WORKER.pending or WORKER.keys:
        WORKER.forget(scheduler_output.finished_req_ids)
    return original(runner, scheduler_output)


def _sample_tokens(original, runner, grammar_output):
    state = runner.execute_model_state
    if state is None:
        return original(runner, grammar_output)
    scheduler_output = state[0]
    keys = probed(runner)
    if not keys:
        return original(runner, grammar_output)
    verified = {req: list(scheduler_output.scheduled_spec_decode_tokens.get(req, ())) for req in keys}
    proposals = {req: WORKER.pending.pop(req, None) for req in keys}
    output = original(runner, grammar_output)   # also proposes the next step's drafts
    index = getattr(output, "req_id_to_index", None)
    for req, key in keys.items():
        if not STORE.open(key):
            continue
        WORKER.keys[req] = key
        if index is None:   # asynchronous scheduling hands its output over later
            STORE.add(key, {"request": req, "error": "asynchronous scheduling: start vLLM with "
                                                     "--no-async-scheduling to record steps"})
            continue
        tokens = [int(t) for t in output.sampled_token_ids[index[req]]] if req in index else []
        if tokens:   # none: a chunk of a long prompt, nothing committed yet
            STORE.add(key, _record(runner, req, verified[req], tokens, proposals[req]))
    return output


def _record(runner, req: str, drafts: list[int], tokens: list[int], proposal: Proposal | None) -> dict:
    record = {"request": req, "drafts": drafts, "accepted": len(tokens) - 1 if drafts else 0, "tokens": tokens,
              "hidden_rms": []}
    if drafts and proposal is not None and proposal.drafts[:len(drafts)] == drafts:
        record["hidden_rms"] = proposal.rms[:len(drafts)]
        if not proposal.rms and runner.speculative_config.method.startswith("eagle3"):
            record["note"] = "the drafter's forward ran without Python hooks (a captured graph): no RMS"
    return record


def _propose_draft_token_ids(original, runner, *args, **kwargs):
    keys = probed(runner)
    if not keys:
        return original(runner, *args, **kwargs)
    rows = {i: req for i, req in enumerate(runner.input_batch.req_ids) if req in keys}
    WORKER.capture = capture = Capture(rows)
    try:
        drafts = original(runner, *args, **kwargs)
    finally:
        WORKER.capture = None
    for row, req in rows.items():
        ids = drafts[row].tolist() if hasattr(drafts, "tolist") else list(drafts[row])
        WORKER.pending[req] = Proposal([int(t) for t in ids], capture.rms.get(row, []))
    return drafts


def _set_inputs_first_pass(original, proposer, *args, **kwargs):
    result = original(proposer, *args, **kwargs)
    if WORKER.capture is not None:
        token_indices_to_sample = result[1]
        WORKER.capture.first_rows = [int(token_indices_to_sample[row]) for row in WORKER.capture.rows]
    return result


def _load_model(original, proposer, *args, **kwargs):
    result = original(proposer, *args, **kwargs)
    if proposer.method.startswith("eagle3"):
        proposer.model.register_forward_pre_hook(_measure_fed_back_state, with_kwargs=True)
    return result


def _measure_fed_back_state(module, args, kwargs):
    """A forward pre-hook on the EAGLE-3 drafter: the RMS of the state entering this depth, per probed row."""
    capture = WORKER.capture
    if capture is None:   # warm-up, dummy runs, batches without a probed request
        return None
    hidden = kwargs.get("hidden_states")
    if hidden is None:
        return None
    rows = capture.first_rows if capture.calls == 0 else list(capture.rows)
    if rows is not None:
        rms = hidden[rows].float().pow(2).mean(dim=-1).sqrt().tolist()
        for row, value in zip(capture.rows, rms):
            capture.rms.setdefault(row, []).append(value)
    capture.calls += 1
    return None
