"""The CLI's JSON contract, its one-line errors, and which function each subcommand runs."""

import argparse
import json
import inspect
import os
import re
import subprocess
import sys

import pytest

import playground.cli as command_line
from playground.cli import answers, bench, diff, train, watch

STEP_FIELDS = {"token_ids", "draft_ids", "accepted", "sink_attention", "hidden_norm"}
SUMMARY_FIELDS = {"text", "token_ids", "tokens", "steps", "mean_acceptance_length", "per_position_acceptance",
                  "tokens_per_s"}


CODE_PROMPT = "Write a Python function that reverses a list."


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "playground", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def tau_of(stderr: str) -> float:
    return float(re.search(r"tau (\d+\.\d+)", stderr).group(1))


def test_generate_json_lines(engine):
    from playground.engines.request import GenerationRequest
    from playground.engines.stats import summarize

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


def test_readable_stream_uses_the_shipped_drafter():
    proc = cli("generate", "--prompt", CODE_PROMPT, "--drafter", "eagle3.1", "--max-tokens", "48")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "randomly initialised" not in proc.stderr
    assert tau_of(proc.stderr) > 1.5, "the trained drafter's drafts are accepted"


@pytest.mark.slow
def test_a_missing_checkpoint_falls_back_to_a_random_drafter_and_says_so(tmp_path):
    proc = cli("generate", "--prompt", CODE_PROMPT, "--drafter", "eagle3.1", "--max-tokens", "48",
               env={"PLAYGROUND_DRAFTERS": str(tmp_path)})   # a drafters folder without checkpoints
    assert proc.returncode == 0, proc.stderr
    assert "note: eagle3.1 is a randomly initialised drafter (random (seed 0))" in proc.stderr
    assert proc.stdout.strip() and tau_of(proc.stderr) < 1.2, "a random drafter's drafts are rejected"


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
    (["--prompt", "hi", "--draft-stop", "probability"], "a draft stop rule reads SIGNAL<VALUE"),
    (["--prompt", "hi", "--draft-stop", "entropy>2"], "unknown signal 'entropy'"),
    (["--prompt", "hi", "--draft-stop", "probability<0.3", "--tree"], "a draft stop rule ends chains"),
    (["--prompt", "hi", "--draft-stop", "probability<0.3", "--backend", "vllm", "--vllm-url", "http://127.0.0.1:9"],
     "a draft stop rule runs in the embedded engine only"),
])
def test_bad_input_is_one_line_and_nonzero(args, message):
    proc = cli("generate", *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr


# a minimal command line of every subcommand -> the function that must run it
COMMANDS = {
    "generate --prompt hi": answers.generate,
    "convert --out x": answers.convert,
    "train data": train.train_data,
    "train drafter --variant eagle3 --out run": train.train_drafter,
    "train validate --data d": train.train_validate,
    "train cost --data d": train.train_cost,
    "train ship --runs r": train.train_ship,
    "train eval": train.train_eval,
    "bench": bench.bench_suite,
    "bench prompts mine.jsonl": bench.bench_prompts,
    "bench ui": bench.bench_ui,
    "bench vllm": bench.bench_vllm,
    "bench trees": bench.bench_trees,
    "bench rejection --prompts 2": bench.bench_rejection,
    "bench draft-stop --prompts 2": bench.bench_draft_stop,
    "bench --k 3 profile": bench.bench_profile,
    "bench profile --verify --contexts 128": bench.bench_profile,
    "bench kernels --rounds 1": bench.bench_kernels,
    "bench k-choice --weights gguf": bench.bench_k_choice,
    "bench memory --runs 2": bench.bench_memory,
    "bench probe --rounds 2": bench.bench_probe,
    "bench chunked-prefill --chunks 512": bench.bench_chunked_prefill,
    "bench long-context --documents 2": bench.bench_long_context,
    "watch --vllm-url http://a:1": watch.watch,
    "diff reference:eagle3 reference:eagle3.1 --prompt hi": diff.diff,
}


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every subcommand the parser runs, as its words (one whose subcommand is optional runs alone too)."""
    choosers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not choosers or not choosers[0].required:
        yield path
    for chooser in choosers:
        for name, sub in chooser.choices.items():
            yield from subcommands(sub, path + (name,))


def test_every_subcommand_runs_its_own_function():
    parser = command_line.build_parser()
    seen = set()
    for line, function in COMMANDS.items():
        args = parser.parse_args(line.split())
        assert inspect.unwrap(args.func) is function, line   # through a guard such as bench._one_k
        seen.add(tuple(w for w in (args.command, getattr(args, "stage", None), getattr(args, "suite", None)) if w))
    assert set(subcommands(parser)) == seen, "a subcommand without a row here runs no function of its own"


@pytest.mark.parametrize("argv, message", [
    (["train", "drafter", "--variant", "eagle3", "eagle3.1", "--out", "run"], "2 variants but 1 run folders"),
    (["train", "drafter", "--variant", "eagle3", "--out", "run", "--init", "a", "b"], "1 variants but 2 drafters"),
])
def test_each_train_stage_reaches_its_own_checks(argv, message, capsys):
    assert command_line.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


@pytest.mark.parametrize("argv, message", [(["train"], "required: stage"), (["train", "bogus"], "invalid choice"),
                                           (["bench", "ui", "--k", "3"], "unrecognized arguments: --k 3"),
                                           (["bench", "bogus"], "invalid choice")])
def test_an_unknown_or_missing_stage_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        command_line.main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("line, k", [("bench trees", 5), ("bench --k 3 trees", 3), ("bench trees --k 3", 3),
                                     ("bench --k 3 trees --k 4", 4), ("bench --k 3", 3)])
def test_bench_options_come_before_or_after_the_subcommand(line, k):
    assert command_line.build_parser().parse_args(line.split()).k == k


def test_bench_prompts_file_is_bench_dash_dash_prompts_file():
    parse = command_line.build_parser().parse_args
    words = "mine.jsonl --sample 3 --k 4 --drafters eagle3 none --backend vllm --vllm-url a=http://h:1"
    sub, flag = parse(f"bench prompts {words}".split()), parse(f"bench --prompts {words}".split())
    fields = ("prompt_file", "sample", "seed", "study_concurrency", "max_prompts", "max_prompt_chars", "drafters", "k",
              "max_tokens", "trees", "out", "backend", "vllm_url", "launch", "vllm_api_key")
    assert [getattr(sub, f) for f in fields] == [getattr(flag, f) for f in fields]
    assert inspect.unwrap(sub.func) is bench.bench_prompts and flag.func is bench.bench_suite   # which hands it to bench_prompts
