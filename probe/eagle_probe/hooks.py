"""The worker side: what of vLLM 0.32's V1 model runner and speculative proposer the probe wraps to record
the steps of requests that opted in (steps.py the runner's side, drafts.py and drafter_attention.py the
proposer's, worker.py what they keep, records.py what they record), and the worker methods the HTTP routes
call.

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

from eagle_probe import CHECKED_VERSIONS, VLLM_VERSION, __version__, drafts, steps
from eagle_probe.capabilities import measures
from eagle_probe.sampling import speculative_sampling
from eagle_probe.worker import BUDGET, SETTINGS, STORE, WORKER

log = logging.getLogger("eagle_probe")
# processes that run the model: the engine core (a single in-process worker) and multiprocess workers
RUNNER_PROCESSES = ("EngineCore", "VllmWorker")


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
# second (drafts.FIRST_PASS_SAMPLED). tests/test_probe_fits_releases.py checks HOOKED, READS and that
# position in each release's source.
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
# each hooked method's wrapper: it gets vLLM's method and the call's arguments
WRAPPERS = {"_update_states": steps.update_states, "sample_tokens": steps.sample_tokens,
            "propose_draft_token_ids": drafts.propose_draft_token_ids,
            "set_inputs_first_pass": drafts.set_inputs_first_pass,
            "_sample_draft_tokens": drafts.sample_draft_tokens, "load_model": drafts.load_model}


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
    wrappers = [(classes[cls], method, WRAPPERS[method]) for _, cls, method in HOOKED]   # all found before any is set
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
            "measures": measures(runner, hooked_class, WORKER.attention_backend),
            "speculative_sampling": speculative_sampling()}


def _wrap(cls: type, name: str, wrapper) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)
    setattr(cls, name, wrapped)
