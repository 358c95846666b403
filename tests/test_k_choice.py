"""k chosen by measured cost: this host's step costs, the drafter's stored acceptance, the fastest k."""

import json
import subprocess
import sys

import pytest

from playground.evaluation import k_choice
from playground.evaluation.k_choice import KChoice, StepCosts, choose, expected_tokens, stored_acceptance
from playground.engines.request import K_RANGE


def _costs(step_ms, per_1k=None, drafter_prompt_ms_per_1k=0.0) -> StepCosts:
    return StepCosts("a host", "f32", tuple(step_ms), tuple(per_1k or [0.0] * (K_RANGE[1] + 1)), drafter_prompt_ms_per_1k)


def test_the_choice_is_the_k_with_the_most_expected_tokens_per_second():
    acceptance = (0.6, 0.4, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0, 0.0, 0.0)
    costs = _costs([10, 12, 13, 15, 17, 19, 21, 23, 25, 27, 29])
    picked = choose(costs, acceptance, prompt_tokens=0)
    rates = [1000 * expected_tokens(acceptance, k) / ms for k, ms in enumerate(costs.step_ms)]
    assert picked.k == max(range(len(rates)), key=rates.__getitem__) == 2   # 2.0 tokens in 13 ms
    assert picked.tokens_per_s == pytest.approx(rates)
    assert picked.reason.startswith("k=2: 2.00 tokens a step of 13.0 ms = 154 tokens/s expected, against 100 ")


def test_a_long_context_makes_wide_verifies_dearer_and_the_choice_shorter():
    acceptance = (0.6, 0.4, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0, 0.0, 0.0)
    costs = _costs([10, 12, 13, 15, 17, 19, 21, 23, 25, 27, 29], [2.0 * (1 + rows) for rows in range(11)])
    assert choose(costs, acceptance, 0).k == 2
    assert choose(costs, acceptance, 4096).k == 1


def test_the_drafters_pass_over_a_long_prompt_is_spread_over_the_answer_and_can_tip_it_to_plain_decoding():
    acceptance = (0.5, 0.3) + (0.0,) * (K_RANGE[1] - 2)
    costs = _costs([10, 12] + [20] * (K_RANGE[1] - 1), drafter_prompt_ms_per_1k=100.0)
    short = choose(costs, acceptance, prompt_tokens=0)
    assert short.k == 1 and short.tokens_per_s[1] == pytest.approx(1000 * 1.5 / 12)   # 125 against 100
    # 1,000 prompt tokens: the drafter's 100 ms over 128 tokens adds 0.8 ms to each of 12 / 1.5 ms
    middle = choose(costs, acceptance, prompt_tokens=1000)
    assert middle.k == 1 and middle.tokens_per_s[1] == pytest.approx(1000 / (12 / 1.5 + 100 / 128))
    assert "1.50 tokens a step of 12.0 ms, and the drafter's 100 ms pass over the 1000-token prompt spread over " \
           "128 tokens = 114 tokens/s expected, against 100 " in middle.reason
    # 4,000: 400 ms, 3.1 ms more a token: 90 tokens/s, slower than plain decoding's 100
    long = choose(costs, acceptance, prompt_tokens=4000)
    assert long.tokens_per_s[1] == pytest.approx(1000 / (12 / 1.5 + 400 / 128)) and long.tokens_per_s[0] == 100
    assert long.k == 0 and choose(costs, acceptance, prompt_tokens=4000, answer_tokens=1024).k == 1   # a longer answer pays it


def test_no_speculation_is_chosen_where_plain_decoding_is_expected_to_be_faster():
    picked = choose(_costs([10] + [30] * K_RANGE[1]), (0.1,) * K_RANGE[1], prompt_tokens=0)
    assert picked.k == 0 and picked.reason.startswith("no speculation: plain decoding is expected at 100 tokens/s")


def test_the_stored_acceptance_pools_every_category_and_carries_on_past_the_stored_depths():
    rows = [row for row in json.loads(k_choice.STORED_RESULTS.read_text())["rows"] if row["method"] == "eagle3.1"]
    pooled = stored_acceptance("eagle3.1")
    assert len(pooled) == K_RANGE[1] and all(a >= b for a, b in zip(pooled, pooled[1:]))
    for depth in range(5):
        values = [row["acceptance"][depth] for row in rows]
        assert min(values) <= pooled[depth] <= max(values)
    assert stored_acceptance("/some/checkpoint") is None


def test_the_costs_are_measured_once_on_the_engine_and_read_back(engine, step_costs, monkeypatch):
    measured = step_costs   # measured afresh this session, and kept for what follows
    assert k_choice.cache_path(engine).exists() and measured.weights == engine.target.weights
    assert len(measured.step_ms) == K_RANGE[1] + 1 and all(ms > 0 for ms in measured.step_ms)
    assert all(ms >= 0 for ms in measured.context_ms_per_1k)
    # the drafter reads a long prompt's features once, after the first token: tens of ms per 1,000 tokens
    assert measured.drafter_prompt_ms_per_1k > 10

    def measure_again(engine, plan):
        raise AssertionError("measured twice")

    monkeypatch.setattr(k_choice, "measure", measure_again)
    assert k_choice.costs(engine) == measured
    picked = k_choice.choice_for(engine, "eagle3.1", 300)
    assert isinstance(picked, KChoice) and 0 <= picked.k <= K_RANGE[1]
    assert k_choice.choice_for(engine, "/some/checkpoint", 300).k == 5


def test_generate_with_k_auto_says_which_k_it_chose_and_why(step_costs):   # the CLI's run reads them
    done = subprocess.run([sys.executable, "-m", "playground", "generate", "--prompt", "Write a haiku about the sea.",
                           "--k", "auto", "--max-tokens", "24", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])["summary"]
    picked = summary["k_choice"]
    assert "--k auto chose " + picked["reason"] in done.stderr
    assert 0 <= picked["k"] <= K_RANGE[1] and len(picked["tokens_per_s"]) == K_RANGE[1] + 1
    refused = subprocess.run([sys.executable, "-m", "playground", "generate", "--prompt", "hi", "--k", "auto", "--tree"],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "chooses a chain's k on the embedded engine: not on vLLM, with a tree" in refused.stderr
    bad = subprocess.run([sys.executable, "-m", "playground", "generate", "--prompt", "hi", "--k", "many"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "k must be a whole number or auto, got 'many'" in bad.stderr
