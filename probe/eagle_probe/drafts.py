"""The proposer's side (vllm/v1/spec_decode/llm_base_proposer.py): a `propose` call for a batch with
recorded requests is captured, and while it drafts, each probed row's fed-back RMS and the drafter's
probability of each draft are taken (attention: drafter_attention.py); the drafts and those measures are
kept as the request's Proposal until the step that verifies them."""

from __future__ import annotations

import functools
import time

from eagle_probe.drafter_attention import measure_round, watch_attention
from eagle_probe.worker import WORKER, Capture, Proposal, guarded

FIRST_PASS_SAMPLED = 1   # the index of token_indices_to_sample in what set_inputs_first_pass returns


def propose_draft_token_ids(original, runner, *args, **kwargs):
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
    measure_round(capture)
    for row, req in capture.rows.items():
        if req in WORKER.broken:
            continue
        ids = drafts[row].tolist() if hasattr(drafts, "tolist") else list(drafts[row])
        WORKER.pending[req] = Proposal([int(t) for t in ids], capture.rms.get(row, []),
                                       capture.attention.get(row, []), capture.probs.get(row, []),
                                       capture.spent_s * 1e3)


def set_inputs_first_pass(original, proposer, *args, **kwargs):
    result = original(proposer, *args, **kwargs)
    if WORKER.capture is not None:
        guarded("set_inputs_first_pass", _note_first_rows, WORKER.capture, result)
    return result


def _note_first_rows(capture: Capture, result) -> None:
    token_indices_to_sample = result[FIRST_PASS_SAMPLED]
    capture.first_rows = {row: int(token_indices_to_sample[row]) for row in capture.rows}


def sample_draft_tokens(original, proposer, hidden_states, *args, **kwargs):
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


def load_model(original, proposer, *args, **kwargs):
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
            watch_attention(layers[0].impl)


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
