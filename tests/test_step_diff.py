"""The step-by-step diff of two runs, on the embedded engine's own runs (vLLM's are in test_vllm.py)."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from playground.engines.request import GenerationRequest
from playground.engines.step_diff import TOLERANCES, diff_steps

PROMPT = "Write a Python function that reverses a list."
F32 = TOLERANCES["float32"]


@pytest.fixture(scope="module")
def runs(engine) -> dict[str, list]:
    return {drafter: list(engine.generate(GenerationRequest(prompt=PROMPT, drafter=drafter, k=5, max_tokens=40)))
            for drafter in ("eagle3", "eagle3.1")}


def with_value(events: list, step: int, field: str, depth: int, value) -> list:
    """The run with one value of one step replaced (its depth counts from 1)."""
    event = events[step]
    values = list(getattr(event, field))
    values[depth - 1] = value
    return events[:step] + [replace(event, **{field: tuple(values)})] + events[step + 1:]


def test_a_run_agrees_with_itself_at_every_step(runs):
    found = diff_steps(runs["eagle3.1"], runs["eagle3.1"], F32)
    assert found.agree and found.steps_aligned == len(runs["eagle3.1"])
    assert found.compared == ("fed_back_rms", "sink_attention", "own_draft_attention", "rest_attention",
                              "draft_probability", "draft")


@pytest.mark.parametrize("step, depth", [(1, 1), (3, 4), (-2, 2)])
def test_one_shifted_draft_is_reported_at_its_step_and_depth(runs, step, depth):
    events = runs["eagle3"]
    step = step % len(events)
    shifted = with_value(events, step, "draft_ids", depth, events[step].draft_ids[depth - 1] + 1)
    d = diff_steps(events, shifted, F32).divergence
    start = events[0].position
    assert (d.step, d.depth, d.quantity) == (events[step].step, depth, "draft")
    assert d.position == events[step].position - start + depth - 1
    assert d.second == d.first + 1


@pytest.mark.parametrize("field, quantity, factor", [("hidden_norm", "fed_back_rms", 1.01),
                                                     ("sink_attention", "sink_attention", 1.5),
                                                     ("draft_probs", "draft_probability", 0.99)])
def test_a_value_past_the_tolerance_is_reported_and_one_within_it_is_not(runs, field, quantity, factor):
    events = runs["eagle3.1"]
    value = getattr(events[2], field)[1]
    moved = with_value(events, 2, field, 2, value * factor + (0.01 if quantity == "sink_attention" else 0))
    d = diff_steps(events, moved, F32).divergence
    assert (d.step, d.depth, d.quantity) == (2, 2, quantity)
    assert diff_steps(events, with_value(events, 2, field, 2, value * (1 + 1e-5)), F32).agree


def test_the_first_cause_is_reported_not_what_follows_from_it(runs):
    """EAGLE 3 against EAGLE 3.1: same answer, different drafters: their first difference is the state
    fed into the first draft of the first verify step, which the drafter computes before anything else."""
    a, b = runs["eagle3"], runs["eagle3.1"]
    assert [t for e in a for t in e.token_ids] == [t for e in b for t in e.token_ids]
    d = diff_steps(a, b, F32).divergence
    assert (d.step, d.position, d.depth, d.quantity) == (1, 1, 1, "fed_back_rms")


def test_runs_without_drafts_compare_counts_and_tokens(runs):
    """A vLLM server without the probe reports accepted counts only: those and the tokens are compared."""
    strip = [replace(e, draft_ids=(), draft_probs=(), hidden_norm=(), sink_attention=(), self_attention=())
             for e in runs["eagle3.1"]]
    found = diff_steps(strip, runs["eagle3"], F32)
    assert found.compared == ()
    steps = [e for e in runs["eagle3"] if e.step > 0]
    mine = [e for e in runs["eagle3.1"] if e.step > 0]
    differs = next((x, y) for x, y in zip(mine, steps) if x.accepted != y.accepted)
    assert found.divergence.quantity == "accepted" and found.divergence.step == differs[0].step


def test_a_different_token_and_a_shorter_answer_are_reported(runs):
    events = runs["eagle3"]
    changed = with_value(events, 4, "token_ids", 1, events[4].token_ids[0] + 1)
    d = diff_steps(events, changed, F32).divergence
    assert (d.quantity, d.position, d.depth) == ("token", events[4].position - events[0].position, 0)
    d = diff_steps(events, events[:-1], F32).divergence
    assert d.quantity == "answer_end" and d.position == sum(len(e.token_ids) for e in events[:-1])


def test_the_command_prints_one_object_per_prompt(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a haiku about the sea.\n\nWhat is 2 + 2?\n")
    out = subprocess.run([sys.executable, "-m", "playground", "diff", "reference:eagle3.1", "reference:eagle3.1",
                          "--prompts", str(prompts), "--max-tokens", "16", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(x["prompt_id"], x["agree"], x["first_divergence"]) for x in lines] == [("prompt 1", True, None),
                                                                                 ("prompt 2", True, None)]
    assert all(x["tau"][0] == x["tau"][1] > 1 for x in lines)
    out = subprocess.run([sys.executable, "-m", "playground", "diff", "reference:eagle3", "reference:eagle3.1",
                          "--prompt", "What is 2 + 2?", "--max-tokens", "16"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and "first divergence: step 1" in out.stdout and "fed_back_rms" in out.stdout
    out = subprocess.run([sys.executable, "-m", "playground", "diff", "eagle3.1", "reference:eagle3",
                          "--prompt", "Hi"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "name a server with --vllm-url" in out.stderr and "Traceback" not in out.stderr
