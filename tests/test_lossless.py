"""Greedy speculative decoding emits exactly the target's own greedy tokens."""

import pytest

from playground.engines.draft_stop import DraftStop
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.evaluation.generate_baseline import transformers_greedy

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Write a Python class for a bank account with deposit, withdraw and a transaction history, and explain it.",
    "Explain step by step how vaccines train the immune system, with examples.",
    "Tell me a long story about a lighthouse keeper and a storm.",
]
NEW_TOKENS = 128


@pytest.mark.slow   # the fast tier's lossless check is test_greedy_lossless_for_any_k
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_transformers_generate(engine, prompt):
    base = GenerationRequest(prompt=prompt, max_tokens=NEW_TOKENS)
    expected = transformers_greedy(engine, base)[0]
    assert len(expected) == NEW_TOKENS  # the prompts are chosen to run the full length
    for drafter in ("eagle3", "eagle3.1", "none"):
        request = GenerationRequest(prompt=prompt, max_tokens=NEW_TOKENS, drafter=drafter, k=5)
        summary = summarize(list(engine.generate(request)))
        assert list(summary.token_ids) == expected, drafter
        assert summary.text == engine.tokenizer.decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_greedy_lossless_for_any_k(engine, k):
    request = GenerationRequest(prompt=PROMPTS[0], max_tokens=48, drafter="eagle3.1", k=k)
    events = list(engine.generate(request))
    assert list(summarize(events).token_ids) == transformers_greedy(engine, request)[0]
    assert max(e.drafted for e in events) == k


def test_stops_at_eos_like_generate(engine):
    request = GenerationRequest(prompt="Say only the word yes.", max_tokens=64, drafter="eagle3")
    events = list(engine.generate(request))
    expected = transformers_greedy(engine, request)[0]
    assert list(summarize(events).token_ids) == expected
    assert expected[-1] in engine.target.eos_ids and events[-1].finish_reason == "eos"


def test_drafts_after_an_accepted_end_of_sequence_were_never_verified(engine):
    """EAGLE 3.1 drafts ' today' '?' '<|im_end|>' and two more; the target accepts all three, so
    the sequence ends there and the two drafts after it are neither drafted nor accepted."""
    request = GenerationRequest(prompt="Say hello world.", drafter="eagle3.1", k=5, max_tokens=64)
    events = list(engine.generate(request))
    last = events[-1]
    assert last.finish_reason == "eos" and last.token_ids[-1] in engine.target.eos_ids
    end = last.draft_ids.index(last.token_ids[-1]) + 1
    assert end < len(last.draft_ids) == 5, "the scenario: drafts after the accepted end of sequence"
    assert last.drafted == last.accepted == len(last.token_ids) == end
    assert last.accept_flags == (True,) * end
    assert list(summarize(events).token_ids) == transformers_greedy(engine, request)[0]

    from playground.ui.render import inspector_html

    html = inspector_html(last)
    assert html.count(">not reached<") == 5 - end and ">rejected<" not in html
    assert "none: the sequence ended on an accepted draft" in html

    from playground.terminal import render_step

    assert render_step(last, color=False) == "".join(last.token_texts)   # no struck-through drafts


class KeepsARejectedDraft(ReferenceEngine):
    """A broken engine: after a rejection the target's cache keeps the first rejected draft."""

    def _roll_back(self, cache, length):
        cache.truncate(min(length + 1, cache.length))


def test_the_lossless_check_detects_an_engine_that_keeps_a_rejected_draft(engine):
    broken = KeepsARejectedDraft(engine.target)
    request = GenerationRequest(prompt=PROMPTS[0], max_tokens=48, drafter="eagle3.1", k=3)
    events = list(broken.generate(request))
    assert any(e.accepted < e.drafted for e in events), "the scenario: a rejected draft"
    assert list(summarize(events).token_ids) != transformers_greedy(engine, request)[0]


@pytest.mark.parametrize("rule", ["probability<0.6", "probability<0.3,self_attention>0.25"])
def test_greedy_lossless_with_a_draft_stop_rule(engine, rule):
    stop = DraftStop.parse(rule)
    for prompt in PROMPTS[:3]:
        request = GenerationRequest(prompt=prompt, max_tokens=48, drafter="eagle3.1", k=8, draft_stop=stop)
        events = list(engine.generate(request))
        assert list(summarize(events).token_ids) == transformers_greedy(engine, request)[0], prompt
        assert len({e.drafted for e in events[1:-1]}) >= 3, "the rule cut chains to several lengths"
        for e in events[1:]:   # no draft kept meets the rule
            assert not any(stop.stops(probability=p, sink_attention=s, self_attention=o, hidden_norm=h)
                           for p, s, o, h in zip(e.draft_probs, e.sink_attention, e.self_attention, e.hidden_norm))


def test_a_draft_stop_rule_that_never_holds_drafts_what_fixed_k_drafts(engine):
    fixed = GenerationRequest(prompt=PROMPTS[1], max_tokens=32, drafter="eagle3", k=4)
    never = GenerationRequest(prompt=PROMPTS[1], max_tokens=32, drafter="eagle3", k=4,
                              draft_stop=DraftStop.parse("probability<0"))
    for a, b in zip(engine.generate(fixed), engine.generate(never), strict=True):
        assert (a.token_ids, a.draft_ids, a.drafted) == (b.token_ids, b.draft_ids, b.drafted)
        assert a.draft_probs == pytest.approx(b.draft_probs, abs=1e-4)
        assert a.sink_attention == pytest.approx(b.sink_attention, abs=1e-4)
        assert a.self_attention == pytest.approx(b.self_attention, abs=1e-4)
        assert a.hidden_norm == pytest.approx(b.hidden_norm, rel=1e-4)
