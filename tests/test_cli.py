"""The CLI's JSON contract and its one-line errors."""

import json
import subprocess
import sys

import pytest

STEP_FIELDS = {"token_ids", "draft_ids", "accepted", "sink_attention", "hidden_norm"}
SUMMARY_FIELDS = {"text", "token_ids", "tokens", "steps", "mean_acceptance_length", "per_position_acceptance",
                  "tokens_per_s"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "playground", *args], capture_output=True, text=True, timeout=600)


def test_generate_json_lines(engine):
    from playground.request import GenerationRequest
    from playground.stats import summarize

    proc = cli("generate", "--prompt", "Write a haiku about the sea.", "--drafter", "eagle3.1", "--k", "4",
               "--max-tokens", "30", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    steps, summary = lines[:-1], lines[-1]["summary"]
    assert all(STEP_FIELDS <= set(s) for s in steps)
    assert SUMMARY_FIELDS <= set(summary)
    assert [t for s in steps for t in s["token_ids"]] == summary["token_ids"]
    assert summary["tokens"] == len(summary["token_ids"]) == 30
    assert all(len(s["sink_attention"]) == len(s["hidden_norm"]) == len(s["draft_ids"]) for s in steps)
    assert max(len(s["draft_ids"]) for s in steps) == 4
    expected = summarize(list(engine.generate(GenerationRequest(prompt="Write a haiku about the sea.", k=4,
                                                                max_tokens=30))))
    assert summary["text"] == expected.text


def test_readable_stream_says_the_drafter_is_random():
    proc = cli("generate", "--prompt", "Hi", "--drafter", "eagle3", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "randomly initialised" in proc.stderr or "trained" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "hi", "--k", "0"], "k must be between 1 and 10"),
    (["--prompt", "hi", "--k", "11"], "k must be between 1 and 10"),
    (["--prompt", "hi", "--temperature", "-0.5"], "temperature must be"),
    (["--prompt", "hi", "--top-p", "0"], "top-p must be in"),
    (["--prompt", "hi", "--top-p", "1.5"], "top-p must be in"),
    (["--prompt", "hi", "--max-tokens", "0"], "max tokens must be"),
    (["--prompt", "hi", "--drafter", "/no/such/drafter"], "unknown drafter"),
    (["--prompt", "word " * 9000], "the context holds 8192"),
])
def test_bad_input_is_one_line_and_nonzero(args, message):
    proc = cli("generate", *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
