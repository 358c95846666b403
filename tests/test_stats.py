from dataclasses import replace

import numpy as np
import pytest

from playground import plots
from playground.engines.events import StepEvent, collect, ended, reconcile
from playground.engines.quantities import (ATTENTION_QUANTITIES, FED_BACK_RMS, REST_ATTENTION,
                                           SINK_ATTENTION)
from playground.engines.intervals import bootstrap_interval
from playground.engines.stats import acceptance_by_depth, drafting_counts, mean_acceptance_length, summarize


def step(i, drafted, accepted, tokens):
    return StepEvent(step=i, position=10 + i, token_ids=tuple(range(tokens)), token_texts=("x",) * tokens,
                     drafted=drafted, accepted=accepted, elapsed_s=0.1 * (i + 1),
                     sink_attention=(0.5,) * drafted, self_attention=tuple(0.1 * d for d in range(drafted)),
                     hidden_norm=(1.0,) * drafted)


def test_per_position_acceptance_unconditional_and_conditional():
    events = [step(0, 0, 0, 1), step(1, 3, 3, 4), step(2, 3, 1, 2), step(3, 3, 0, 1), step(4, 2, 2, 3)]
    unconditional, conditional = acceptance_by_depth(events)
    # of 4 drafting steps, 3 accepted >= 1 draft, 2 accepted >= 2, 1 accepted 3
    assert unconditional == (3 / 4, 2 / 4, 1 / 4)
    assert conditional == (3 / 4, 2 / 3, 1 / 2)
    assert mean_acceptance_length(events) == 1 + 6 / 4


def test_per_position_acceptance_counts_every_drafting_step_at_every_depth_as_vllm_does():
    """vLLM divides the steps that accepted at least d drafts by all drafting steps, also those
    that drafted fewer than d (`num_accepted_tokens_per_pos[d-1] / num_drafts`)."""
    events = [step(0, 0, 0, 1), step(1, 3, 3, 4), step(2, 3, 2, 3), step(3, 1, 1, 2)]
    unconditional, conditional = acceptance_by_depth(events)
    assert unconditional == pytest.approx((3 / 3, 2 / 3, 1 / 3))
    assert conditional == pytest.approx((1.0, 2 / 3, 1 / 2))
    assert list(unconditional) == sorted(unconditional, reverse=True)


def test_drafting_counts_skip_steps_that_did_not_draft():
    assert drafting_counts([step(0, 0, 0, 1), step(1, 3, 3, 4), step(2, 3, 1, 2)]) == (4, 2)


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_units():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    mean = lambda units: lambda idx: np.asarray(units)[idx].mean(-1)
    lo, hi = bootstrap_interval(mean(values), len(values))
    assert 1.0 < lo < 3.5 < hi < 6.0
    many = values * 16
    lo_many, hi_many = bootstrap_interval(mean(many), len(many))
    assert lo < lo_many < 3.5 < hi_many < hi
    assert bootstrap_interval(mean([2.0] * 5), 5) == (2.0, 2.0)
    assert bootstrap_interval(mean(values), len(values)) == (lo, hi)   # seeded: reprints the same


def test_summary_counts_tokens_and_steps():
    events = [step(0, 0, 0, 1), step(1, 3, 3, 4), step(2, 3, 1, 2)]
    s = summarize(events)
    assert s.tokens == 7 and s.steps == 2 and s.prompt_tokens == 10
    assert s.tokens_per_s == pytest.approx(7 / 0.3)
    assert s.mean(SINK_ATTENTION) == (0.5, 0.5, 0.5)
    assert s.mean(REST_ATTENTION) == pytest.approx((0.5, 0.4, 0.3))   # what sink and own drafts leave
    assert s.to_json()["mean_rest_attention"] == s.mean(REST_ATTENTION)   # --json: mean_<name> of every quantity


def test_no_speculation_has_tau_one():
    assert mean_acceptance_length([step(0, 0, 0, 1), step(1, 0, 0, 1)]) == 1.0
    assert summarize([step(0, 0, 0, 1), step(1, 0, 0, 1)]).tokens_per_pass == 1.0


def test_tokens_per_target_pass_counts_the_steps_that_drafted_nothing():
    """A stop rule that drafts nothing on a step still spends a target pass on it: tau leaves the step
    out, tokens per target pass does not."""
    events = [step(0, 0, 0, 1), step(1, 5, 5, 6), step(2, 0, 0, 1), step(3, 0, 0, 1), step(4, 5, 1, 2)]
    s = summarize(events)
    assert s.mean_acceptance_length == 1 + 6 / 2 and s.tokens_per_pass == (6 + 1 + 1 + 2) / 4
    from playground.engines.stats import RunTotals, Pooled
    assert RunTotals.of(events).tokens_per_pass == s.tokens_per_pass
    assert Pooled.of([RunTotals.of(events)] * 2).tokens_per_pass == s.tokens_per_pass


def test_a_stop_rule_run_reports_its_tokens_over_its_verify_steps(engine):
    from playground.engines.draft_stop import DraftStop
    from playground.engines.request import GenerationRequest

    request = GenerationRequest(prompt="List three uses of a paperclip.", drafter="eagle3.1", k=8, max_tokens=48,
                                draft_stop=DraftStop.parse("probability<0.5"))
    s = summarize(list(engine.generate(request)))
    assert s.steps > s.drafting_steps   # the rule left some steps without a draft
    assert s.tokens_per_pass == pytest.approx((s.tokens - 1) / s.steps) and s.tokens_per_pass < s.mean_acceptance_length


def test_reconcile_resplits_chunks_the_server_merged():
    # vLLM merged steps 1 and 2 into one chunk; its per-step counts arrive on the last event
    events = [
        StepEvent(step=0, position=10, token_ids=(1,), token_texts=("a",)),
        StepEvent(step=1, position=11, token_ids=(2, 3, 4), token_texts=("b", "c", "d"), drafted=3, accepted=2),
        StepEvent(step=2, position=14, token_ids=(5,), token_texts=("e",), drafted=3, finish_reason="length",
                  step_accepted=(1, 0, 0), step_drafted=(3, 3, 3)),
    ]
    steps = reconcile(events)
    assert [e.token_ids for e in steps] == [(1,), (2, 3), (4,), (5,)]
    assert [e.accepted for e in steps] == [0, 1, 0, 0]
    assert [e.position for e in steps] == [10, 11, 13, 14]
    assert steps[-1].finish_reason == "length" and steps[1].finish_reason is None
    assert reconcile(steps) is steps   # marked as the steps: reconciled once
    assert ended(events[:2]) == events[:2]   # the stream has not ended: the steps as they came
    assert ended(list(events)) == collect(iter(events)) == steps
    summary = summarize(events)
    assert summary.steps == 3 and summary.text == "abcde"
    assert summary.mean_acceptance_length == pytest.approx(1 + 1 / 3)
    assert summary.per_position_acceptance == pytest.approx((1 / 3, 0.0, 0.0))


def test_reconcile_leaves_streams_without_counts_alone():
    events = [StepEvent(step=0, position=3, token_ids=(1,), token_texts=("a",), finish_reason="eos")]
    assert reconcile(events) is events


def test_summary_counts_the_samples_behind_each_mean_by_depth():
    events = [step(0, 0, 0, 1), step(1, 3, 3, 4), step(2, 3, 1, 2), step(3, 2, 0, 1)]
    s = summarize(events)
    assert s.drafting_steps == 3                        # behind every unconditional rate
    assert s.conditional_acceptance_steps == (3, 2, 1)  # steps that accepted at least 0, 1, 2 drafts
    assert s.samples_of(FED_BACK_RMS) == (3, 3, 2)       # steps that drafted at depth 1, 2, 3
    assert s.samples_of(SINK_ATTENTION) == s.samples_of(REST_ATTENTION) == (3, 3, 2)
    assert (s.to_json()["drafting_steps_by_depth"], s.to_json()["attention_steps_by_depth"]) == ((3, 3, 2), (3, 3, 2))
    assert s.to_json()["conditional_acceptance_steps"] == (3, 2, 1)


def test_attention_counts_its_own_samples_where_only_rms_was_measured():
    """A probe past its key-copy limit records RMS without attention: the attention plot's points then say
    how few steps they average, and are drawn hollow."""
    events = [step(0, 0, 0, 1), *(replace(step(i, 3, 1, 2), sink_attention=(), self_attention=()) if i > 1
                                  else step(i, 3, 1, 2) for i in range(1, 8))]
    s = summarize(events)
    assert (s.samples_of(FED_BACK_RMS), s.samples_of(SINK_ATTENTION)) == ((7, 7, 7), (1, 1, 1))
    markers = [trace.marker.symbol for trace in plots.attention({"eagle3": s}).data]
    assert markers == [("circle-open",) * 3] * len(ATTENTION_QUANTITIES)   # sink, own drafts, the rest


def test_runs_pooled_from_their_totals_equal_every_step_pooled_at_once():
    """The suite, the study and the held-out evaluation pool runs through one type (Pooled.of of each run's
    RunTotals): its figures are the step-level definitions over all the runs' steps together."""
    from playground.engines.stats import Pooled, RunTotals, pool

    def mean_by_depth(rows):   # by hand: each depth's mean over the rows that reach it
        rows = [r for r in rows if r]
        return [sum(r[d] for r in rows if len(r) > d) / sum(len(r) > d for r in rows)
                for d in range(max(map(len, rows)))]

    def measured(i, drafted, accepted, tokens, sink, rms):
        return replace(step(i, drafted, accepted, tokens), sink_attention=sink, hidden_norm=rms,
                       draft_ms=1.0 + i, verify_ms=2.0 * i)

    runs = [[step(0, 0, 0, 1), measured(1, 3, 3, 4, (0.2, 0.4, 0.6), (1.0, 2.0, 3.0)),
             measured(2, 3, 1, 2, (), (4.0, 5.0, 6.0))],                     # RMS without attention
            [replace(step(0, 0, 0, 1), position=3), measured(1, 5, 4, 5, (0.1,) * 5, (7.0,) * 5),
             measured(2, 2, 0, 1, (0.3, 0.3), ()), measured(3, 0, 0, 1, (), ())]]
    every = [e for run in runs for e in run]
    drafting = [e for e in every if e.drafted]
    pooled = Pooled.of([RunTotals.of(run) for run in runs])
    assert pooled == pool(runs)
    assert pooled.mean_acceptance_length == mean_acceptance_length(every) == 1 + 8 / 4
    assert pooled.acceptance == acceptance_by_depth(every)[0] == (3 / 4, 2 / 4, 2 / 4, 1 / 4, 0.0)
    assert pooled.mean(SINK_ATTENTION) == pytest.approx(mean_by_depth(e.sink_attention for e in drafting))
    assert pooled.mean(SINK_ATTENTION)[:2] == pytest.approx(((0.2 + 0.1 + 0.3) / 3, (0.4 + 0.1 + 0.3) / 3))
    assert pooled.mean(FED_BACK_RMS) == pytest.approx(mean_by_depth(e.hidden_norm for e in drafting))
    assert pooled.to_json()["hidden_norm"] == pooled.mean(FED_BACK_RMS)   # --json: every quantity under its name
    assert (pooled.runs, pooled.min_prompt_tokens, pooled.tokens, pooled.steps) == (2, 3, 15, 5)
    assert pooled.draft_ms == pytest.approx((2 + 3 + 2 + 3 + 4) / 5) and pooled.verify_ms == pytest.approx(18 / 5)


