"""The runner's side of a step (vllm/v1/worker/gpu_model_runner.py): which requests a step verifies drafts
for, what it committed, and the record of it; and the moment finished requests are forgotten."""

from __future__ import annotations

from eagle_probe import HEADS_FIELD
from eagle_probe.records import StepRecord, attention_fields, error_record
from eagle_probe.worker import STORE, WORKER, Proposal, extra_args, guarded


def update_states(original, runner, scheduler_output):
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


def sample_tokens(original, runner, grammar_output):
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
            STORE.add(key, req, error_record(req, "asynchronous scheduling: start vLLM with --no-async-scheduling "
                                                  "to record steps"))
            continue
        tokens = [int(t) for t in output.sampled_token_ids[index[req]]] if req in index else []
        if tokens:   # none: a chunk of a long prompt, nothing committed yet
            STORE.add(key, req, step_record(runner, req, verified[req], tokens, proposals[req]).to_json())


def step_record(runner, req: str, drafts: list[int], tokens: list[int], proposal: Proposal | None) -> StepRecord:
    """The record of a step that verified `drafts` and committed `tokens`, with what was measured while the
    drafts were made (`proposal`, where it made exactly these)."""
    accepted = len(tokens) - 1 if drafts else 0
    if not (drafts and proposal is not None and proposal.drafts[:len(drafts)] == drafts):
        return StepRecord(req, drafts, accepted, tokens, hidden_rms=[])
    depths = len(drafts)
    note = None
    if not proposal.rms and runner.speculative_config.method.startswith("eagle3"):
        note = "the drafter's forward ran without Python hooks (a captured graph): no RMS"
    attention = attention_fields(proposal.attention[:depths], bool(extra_args(runner, req).get(HEADS_FIELD))) \
        if proposal.attention else {}
    return StepRecord(req, drafts, accepted, tokens, hidden_rms=proposal.rms[:depths],
                      draft_probs=proposal.probs[:depths], probe_ms=proposal.probe_ms, note=note, **attention)
