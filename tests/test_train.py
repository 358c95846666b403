"""Training-time test sees exactly what chain drafting sees, and training lowers the loss."""

import math

import pytest
import torch
from torch import nn

from playground.engines.quantities import DEPTH_QUANTITIES, FED_BACK_RMS
from playground.engines.proposers import EagleProposer
from playground.engines.sampling import SamplingParams
from playground.model.drafter import Eagle3Drafter
from playground.training.train import TrainConfig, pick_draft_vocab, schedule_factor
from playground.training.ttt import (batch_parts, counted_positions, query_window, target_states, ttt_attend, ttt_loss,
                                     ttt_pooled)
from tests.test_drafter_checkpoint import small_config


def test_unrolled_steps_match_chain_drafting():
    torch.manual_seed(0)
    for eagle31 in (False, True):
        drafter = Eagle3Drafter(small_config(eagle31)).init_random(2).requires_grad_(False)
        drafter.set_draft_vocab(torch.arange(100))
        embed = nn.Embedding(500, 64).requires_grad_(False)
        T, t = 9, 6
        features = torch.randn(1, T, 144)
        ids = torch.randint(0, 100, (1, T + 2))

        proposer = EagleProposer(drafter, embed, capacity=32)
        proposer.observe(features[0, :t + 1], ids[0, 1:t + 2].tolist())
        proposal = proposer.propose(2, SamplingParams(), torch.Generator())
        ids[0, t + 2] = proposal.ids[0]  # teacher-force what the chain drafted at depth 1

        keys, values = [], []
        normed0, fed0 = drafter.step(drafter.fuse(features), embed(ids[:, 1:T + 1]), torch.arange(T),
                                     ttt_attend(keys, values, 2))
        normed1, _ = drafter.step(fed0, embed(ids[:, 2:T + 2]), torch.arange(T) + 1, ttt_attend(keys, values, 2))
        p0 = drafter.draft_logits(normed0[0, t]).softmax(-1)
        p1 = drafter.draft_logits(normed1[0, t]).softmax(-1)
        assert int(p0.argmax()) == proposal.ids[0]
        torch.testing.assert_close(float(p0.max()), proposal.probs[0], rtol=1e-4, atol=1e-5)
        assert int(p1.argmax()) == proposal.ids[1]
        torch.testing.assert_close(float(p1.max()), proposal.probs[1], rtol=1e-4, atol=1e-5)


def test_draft_vocab_is_the_most_frequent_answer_tokens():
    examples = [{"ids": torch.tensor([9, 9, 9, 1, 1, 2, 3, 3]), "prompt_len": 3}]
    assert pick_draft_vocab(examples, vocab_size=10, size=2).tolist() == [1, 3]


def test_a_few_steps_lower_the_loss():
    torch.manual_seed(0)
    drafter = Eagle3Drafter(small_config(True)).init_random(0)
    drafter.set_draft_vocab(torch.arange(100))
    embed, head = torch.randn(500, 64), torch.randn(500, 48)
    head[100:] -= 10  # the target mostly predicts draft-vocab tokens
    B, T = 4, 12
    batch = {"ids": torch.randint(0, 100, (B, T + 1)), "features": torch.randn(B, T, 144),
             "final": torch.randn(B, T, 48), "answer": torch.ones(B, T + 1, dtype=torch.bool)}
    batch["top"] = (batch["final"] @ head.T).argmax(-1)
    config = TrainConfig(variant="eagle3.1", data=None, out=None, ttt_steps=3)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss, losses, accs, _ = ttt_loss(drafter, embed, head, drafter.t2d.clone(), batch, config.ttt_steps,
                                         config.decay)
        first = first if first is not None else float(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert len(losses) == 3 and float(loss.detach()) < 0.8 * first


def small_batch(B: int, T: int, answers: list[tuple[int, int]]) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Random ids and states, each row's answer at positions [start, end) of its ids."""
    embed, head = torch.randn(500, 64), torch.randn(500, 48)
    head[100:] -= 10  # the target mostly predicts draft-vocab tokens
    batch = {"ids": torch.randint(0, 100, (B, T + 1)), "features": torch.randn(B, T, 144),
             "final": torch.randn(B, T, 48), "answer": torch.zeros(B, T + 1, dtype=torch.bool)}
    for b, (start, end) in enumerate(answers):
        batch["answer"][b, start:end] = True
    batch["top"] = (batch["final"] @ head.T).argmax(-1)
    return batch, embed, head


def test_queries_from_where_the_answers_begin_give_the_loss_and_gradient_of_queries_everywhere():
    """The loss counts answer positions only: the queries, head and loss before them are skipped (their
    keys kept) and the positions after them too, which long prompts need, and nothing the loss or its
    gradient sees changes."""
    torch.manual_seed(0)
    drafter = Eagle3Drafter(small_config(True)).init_random(0)
    drafter.set_draft_vocab(torch.arange(100))
    batch, embed, head = small_batch(3, 40, [(25, 34), (31, 36), (28, 30)])
    assert query_window(batch["answer"], 4) == (20, 34)
    measured = []
    for window in ((0, 40), None):
        drafter.zero_grad()
        result = ttt_loss(drafter, embed, head, drafter.t2d.clone(), batch, 4, 0.8, window=window)
        result.loss.backward()
        measured.append((result, [p.grad.clone() for p in drafter.parameters()]))
    (everywhere, grads_everywhere), (answers, grads_answers) = measured
    torch.testing.assert_close(answers.loss, everywhere.loss)
    assert answers.step_tokens == everywhere.step_tokens and min(answers.step_tokens) > 0
    torch.testing.assert_close(answers.step_acc, everywhere.step_acc)
    for a, b in zip(grads_answers, grads_everywhere):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_batch_trained_in_parts_gets_the_gradient_of_one_pass():
    """A batch of long contexts is trained in parts of bounded attention, rows whose answers start near each
    other together; the parts' losses and gradients add up to one pass's."""
    torch.manual_seed(0)
    drafter = Eagle3Drafter(small_config(False)).init_random(0)
    drafter.set_draft_vocab(torch.arange(100))
    batch, embed, head = small_batch(6, 24, [(3, 10), (20, 25), (9, 20), (14, 25), (6, 12), (0, 0)])
    assert batch_parts(batch["answer"], 3, 10_000) == [[0, 4, 2, 3, 1]]   # the row without an answer left out
    assert batch_parts(batch["answer"], 3, 600) == [[0, 4], [2], [3, 1]]
    measured = []
    for part_scores in (10_000, 600):
        drafter.zero_grad()
        result = ttt_pooled(drafter, embed, head, drafter.t2d.clone(), batch, 3, 0.8, bf16=False, backward=True,
                            part_scores=part_scores)
        measured.append((result, [p.grad.clone() for p in drafter.parameters()]))
    (whole, grads_whole), (parts, grads_parts) = measured
    torch.testing.assert_close(parts.loss, whole.loss)
    assert parts.step_tokens == whole.step_tokens == counted_positions(batch, drafter.t2d, 3)
    torch.testing.assert_close(parts.step_loss, whole.step_loss)
    torch.testing.assert_close(parts.step_acc, whole.step_acc)
    for a, b in zip(grads_parts, grads_whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_batched_target_states_are_the_states_of_each_sequence_alone(target):
    """Training recomputes the target's states over right-padded batches; each row must get what
    the target computes for its sequence alone (what the drafter reads when it drafts)."""
    from playground.engines import chat

    seqs = [chat.encode(target.tokenizer, [{"role": "user", "content": p}])
            for p in ("Why is the sky blue?", "Write a Python function that adds two numbers, with a docstring.")]
    T = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (T - len(s)) for s in seqs])
    states = target_states(target, ids)
    for b, seq in enumerate(seqs):
        alone = target.forward(torch.tensor([seq]), target.new_cache(len(seq)))
        n = len(seq)
        torch.testing.assert_close(states["features"][b, :n], alone.features[0], atol=5e-4, rtol=1e-4)
        torch.testing.assert_close(states["final"][b, :n], alone.final_hidden[0], atol=5e-4, rtol=1e-4)
        assert states["top"][b, :n].tolist() == alone.logits[0].argmax(-1).tolist()
    assert states["features"].requires_grad is False and not states["features"].is_inference()


@pytest.mark.slow
def test_eval_long_context_prompts_are_long_and_perturbed_use_other_templates(engine, tmp_path):
    from playground.evaluation.heldout import (eval_requests, evaluate, format_ratios, format_rows, kind_prompts,
                                               write_figures)
    from playground.prompts.sets import HELDOUT_SYSTEMS, LONGER_CONTEXT, OTHER_TEMPLATES, UNUSUAL_SYSTEMS

    rows = evaluate(engine, ["eagle3", "eagle3.1"], k=3, max_tokens=8, kinds=("long context",), prompts=2)
    pooled = rows[1].pooled
    assert pooled.runs == 2 and pooled.min_prompt_tokens >= 1500
    assert len(pooled.acceptance) == 3 and pooled.mean_acceptance_length >= 1.0
    assert "| long context | eagle3.1 | 2 |" in format_rows(rows)
    assert 0.5 < rows[1].draftable <= 1.0 and format_rows(rows).endswith(f"| {rows[1].draftable:.3f} |")
    # eight questions about one report are one document: no interval over prompts that share it
    [(accepted, steps)] = rows[1].counts
    assert 1 + accepted / steps == pytest.approx(pooled.mean_acceptance_length)
    assert len({p.document for p in kind_prompts("long context", None)}) == 1
    assert len({p.document for p in kind_prompts("chat", None)}) == len(kind_prompts("chat", None)) == 24
    assert rows[1].tau_interval() is None and "| – (one document) |" in format_rows(rows)
    ratio = rows[1].pooled.mean_acceptance_length / rows[0].pooled.mean_acceptance_length
    assert f"| long context | eagle3.1 / eagle3 | {ratio:.2f} | – (one document) |" in format_ratios(rows)
    write_figures(rows, tmp_path / "curves.html")
    page = (tmp_path / "curves.html").read_text()
    assert page.count("long context: ") == 1 + len(DEPTH_QUANTITIES) and "fed-back RMS" in page and "EAGLE 3.1" in page
    assert f"{rows[1].pooled.mean(FED_BACK_RMS)[0]}" in page   # the plotted values are the pooled ones
    assert len(eval_requests("long context", "eagle3", 5, 8)) == 8
    [longer] = evaluate(engine, ["eagle3.1"], k=3, max_tokens=4, kinds=(LONGER_CONTEXT,), prompts=1)
    assert longer.pooled.min_prompt_tokens >= 4000
    templates, systems = (eval_requests(kind, "eagle3", 5, 8) for kind in (OTHER_TEMPLATES, UNUSUAL_SYSTEMS))
    assert eval_requests("perturbed format", "eagle3", 5, 8) == templates + systems
    assert {r.template for r in templates} == {"plain", "markdown"} and {r.system for r in templates} == {None}
    assert {r.template for r in systems} == {"model"} and [r.system for r in systems] == HELDOUT_SYSTEMS


def test_tau_ratio_of_a_drafter_with_itself_is_one():
    from playground.evaluation.heldout import EvalRow, tau_ratios

    counts = ((3, 4), (1, 5), (8, 6))   # per prompt: (accepted drafts, drafting steps); pooled only by the table
    rows = [EvalRow(name, "chat", None, 1.0, counts) for name in ("a", "b")]
    assert tau_ratios(rows) == [("chat", "b", "a", 1.0, (1.0, 1.0))]
    other = EvalRow("c", "chat", None, 1.0, ((0, 4), (0, 5), (0, 6)))
    [(_, _, _, value, (lo, hi))] = tau_ratios([rows[0], other])
    assert value == pytest.approx(1 / (1 + 12 / 15)) and lo <= value <= hi


def test_a_retrained_pair_is_also_compared_with_the_shipped_drafter_of_its_own_variant():
    from playground.evaluation.heldout import EvalRow, tau_ratios

    row = lambda name, variant, accepted: EvalRow(name, "code", None, 1.0, ((accepted, 4), (1, 5)), variant=variant)
    rows = [row("eagle3.1", "eagle3.1", 6), row("runs/new-eagle3.1/drafter", "eagle3.1", 8),
            row("eagle3", "eagle3", 2), row("runs/new-eagle3/drafter", "eagle3", 3)]
    pairs = [(a, b) for _, a, b, _, _ in tau_ratios(rows)]
    assert pairs == [("runs/new-eagle3.1/drafter", "eagle3.1"), ("eagle3", "eagle3.1"),
                     ("runs/new-eagle3/drafter", "eagle3.1"), ("runs/new-eagle3/drafter", "eagle3")]
    [(_, _, _, value, _)] = [r for r in tau_ratios(rows) if r[1:3] == ("runs/new-eagle3/drafter", "eagle3")]
    assert value == pytest.approx((1 + 4 / 9) / (1 + 3 / 9))


def train_here(capsys, train_args: list[str]) -> tuple[int, str, str]:
    """`train ...` run in this process (a subprocess spends seconds importing the libraries): its exit
    status, stdout and stderr."""
    from playground.cli import main

    capsys.readouterr()
    code = main(["train", *train_args])
    return code, *capsys.readouterr()


def printed(capsys, train_args: list[str]) -> str:
    """What `train ...` prints; it must succeed."""
    code, out, err = train_here(capsys, train_args)
    assert code == 0, err
    return out


def refused(capsys, train_args: list[str], message: str) -> bool:
    """Whether `train ...` exits non-zero with `message` on stderr (an exception would fail the test itself)."""
    code, _, err = train_here(capsys, train_args)
    return code != 0 and message in err


@pytest.mark.slow
def test_data_train_resume_and_ship_end_to_end(tmp_path, engine, capsys):
    """The whole pipeline at toy scale with the real target: data, both variants trained with a
    resume in between, then shipped with model cards that load as drafters."""
    import json
    import signal
    import subprocess
    import sys

    from playground.model.drafter import load_drafter
    from playground.training.ship import ship
    from playground.training.train import checkpoint_step

    data, self_data = tmp_path / "data", tmp_path / "self"
    cli = [sys.executable, "-m", "playground", "train"]
    subprocess.run(cli + ["data", "--out", str(data), "--prompts", "4", "--batch", "2", "--max-new-tokens", "6"],
                   check=True, capture_output=True)
    subprocess.run(cli + ["data", "--out", str(self_data), "--source", "self", "--prompts", "2", "--batch", "2",
                          "--max-new-tokens", "6", "--dtype", "bfloat16"], check=True, capture_output=True)
    assert len(list(data.glob("shard-*.pt"))) == 2
    assert json.loads((self_data / "data_config.json").read_text())["dtype"] == "bfloat16"
    assert 1 <= sum(len(torch.load(s)) for s in self_data.glob("shard-*.pt")) <= 2
    runs = [tmp_path / "eagle3", tmp_path / "eagle3.1"]
    args = ["drafter", "--variant", "eagle3", "eagle3.1", "--out", *map(str, runs), "--batch", "2",
            "--draft-vocab", "512", "--ttt-steps", "2", "--save-every", "1", "--warmup", "1", "--no-bf16"]
    # the second call resumes both runs from their checkpoints, with one more data folder (the first
    # holds the self-written data out and measures the drafters on it at every save)
    for steps, folders, held_out in (("1", [data], [self_data]), ("2", [data, self_data], [])):
        subprocess.run(cli + args + ["--steps", steps, "--data", *map(str, folders)]
                       + (["--val-data", *map(str, held_out)] if held_out else []), check=True, capture_output=True)
        # EAGLE 3.1's folder carried as to another machine: without its checkpoint, from its export
        (runs[1] / "checkpoint.pt").unlink(missing_ok=True)
    assert [checkpoint_step(run) for run in runs] == [2, 2]
    logs = [[json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] for run in runs]
    for run, log in zip(runs, logs):
        assert [r["step"] for r in log] == [1, 2]
        val = [json.loads(line) for line in (run / "val.jsonl").read_text().splitlines()]
        assert [r["step"] for r in val] == [1] and val[0]["tokens"] > 0 and len(val[0]["step_acc"]) == 2
        recorded = json.loads((run / "train_config.json").read_text())["data_stats"]   # the run describes its data
        assert [(d["folder"], d["conversations"]) for d in recorded][0] == (str(data), 4)
        assert recorded[1]["source"] == "self" and recorded[1]["answer_tokens"] > 0
    # a checkpoint keeps Adam's moments in bfloat16; the resumed run above read them back
    moments = torch.load(runs[0] / "checkpoint.pt")["optimizer"]["state"][0]
    assert moments["exp_avg"].dtype == moments["exp_avg_sq"].dtype == torch.bfloat16
    # the same batches, different drafters: the losses differ, and the two switches are the difference
    assert [r["loss"] for r in logs[0]] != [r["loss"] for r in logs[1]]
    # side by side changes nothing for a run: EAGLE 3 trained alone logs the same losses
    alone = tmp_path / "eagle3-alone"
    subprocess.run(cli + ["drafter", "--variant", "eagle3", "--out", str(alone), *args[7:], "--steps", "1",
                          "--data", str(data)], check=True, capture_output=True)
    alone_log = [json.loads(line) for line in (alone / "log.jsonl").read_text().splitlines()]
    assert alone_log[0]["loss"] == pytest.approx(logs[0][0]["loss"], rel=1e-6)
    # refusals, in this process (a subprocess would spend seconds importing PyTorch to print one line)
    assert refused(capsys, ["drafter", "--variant", "eagle3", "eagle3.1", "--out", str(runs[0])],
                   "give one --out per variant")
    assert refused(capsys, args + ["--steps", "3", "--data", str(data), "--val-data", str(data)], "must be held out")
    assert refused(capsys, ["validate", "--drafters", "eagle3.1", "--data", str(tmp_path / "nothing")],
                   "hold no sequences")
    # SIGTERM ends the step in progress, saves and stops: the same command goes on from there
    stopping = tmp_path / "stopping"
    process = subprocess.Popen(cli + ["drafter", "--variant", "eagle3", "--out", str(stopping), *args[7:], "--steps",
                                      "100000", "--save-every", "100000", "--data", str(data)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    while "train eagle3" not in seen:   # the progress bar: training has begun
        seen += process.stderr.read(1)
    process.send_signal(signal.SIGTERM)
    said, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and "stopped at step" in said and "on SIGTERM" in said
    assert 0 < checkpoint_step(stopping) < 100000
    # a step's parts timed: each data folder's longest and median batch, the target's states and both passes
    costs = json.loads(printed(capsys, ["cost", "--data", str(data), "--batch", "2", "--json"]))
    assert [(r["batch"], r["sequences"]) for r in costs["rows"]] == [("longest", 2), ("median", 2)]
    lengths = sorted(len(ex["ids"]) - 1 for shard in data.glob("shard-*.pt") for ex in torch.load(shard))
    assert costs["rows"][0]["longest"] == lengths[-1] and costs["rows"][0]["tokens"] == sum(lengths[-2:])
    assert all(r["target_s"] > 0 and set(r["drafter_s"]) == {"eagle3", "eagle3.1"} for r in costs["rows"])
    # the same measure for a finished drafter: validating its exported checkpoint (bf16 weights)
    # gives what its run logged at that step
    val = json.loads((runs[0] / "val.jsonl").read_text().splitlines()[0])
    table = printed(capsys, ["validate", "--drafters", str(alone / "drafter"), "--data", str(self_data),
                             "--ttt-steps", "2", "--no-bf16"])
    row = next(line for line in table.splitlines() if line.startswith(f"| {alone / 'drafter'} |")).split("|")
    assert float(row[4]) == pytest.approx(val["loss"], rel=1e-2) and int(row[3]) == val["tokens"]
    shipped = ship(runs, engine, max_tokens=4, assets=tmp_path / "assets", prompts=2)
    assert [p.name for p in shipped] == ["eagle3", "eagle3.1"]
    for folder in shipped:
        assert load_drafter(folder).config.variant == folder.name
        card = (folder / "README.md").read_text()
        assert "Trained 2 steps of 2 scheduled" not in card and "Trained 2 steps." in card
        assert f"from step 1: data/{data.name} + data/{self_data.name}" in card and "--source self" in card
        assert str(tmp_path) not in card, "a card names no absolute path of the machine that trained it"
        assert "4 conversations" in card and "| long context | eagle3.1 |" in card and "| chat | eagle3 |" in card
        assert f"On held-out data (data/{self_data.name}: " in card and "at step 1: loss" in card
        assert "| chat | eagle3.1 / eagle3 |" in card and "--max-tokens 4 --prompts 2" in card
    # fine-tuning: new runs start from the shipped drafters (at learning rate 0 they stay those drafters),
    # and keep their cards; the shipped card then says where the run started
    tuned = [tmp_path / "tuned-eagle3", tmp_path / "tuned-eagle3.1"]
    assert refused(capsys, args + ["--steps", "1", "--data", str(data), "--out", *map(str, tuned),
                                   "--init", *map(str, shipped[::-1])], "it is eagle3.1, the run trains eagle3")
    assert not any(run.exists() for run in tuned)
    subprocess.run(cli + args + ["--steps", "1", "--lr", "0", "--data", str(data), "--out", *map(str, tuned),
                                 "--init", *map(str, shipped)], check=True, capture_output=True)
    for run, start in zip(tuned, shipped):
        before, after = load_drafter(start).state_dict(), load_drafter(run / "drafter").state_dict()
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        assert (run / "init_card.md").read_text() == (start / "README.md").read_text()
    retuned = ship(tuned, engine, max_tokens=4, assets=tmp_path / "assets-tuned", prompts=2)
    card = (retuned[1] / "README.md").read_text()
    assert f"starting from the trained drafter `{shipped[1]}`" in card and f"--init {shipped[1]}" in card
    assert "\n## Started from\n\n## EAGLE 3.1 drafter" in card and "\n### Evaluation\n" in card


def test_a_multi_turn_conversation_follows_up_on_the_targets_own_reply(target):
    from playground.engines import chat
    from playground.training import prompts
    from playground.training.data import write_first_replies

    conv = prompts.conversation(5)
    assert [m["role"] for m in conv][-3:] == ["user", "assistant", "user"] and conv[-2]["content"] is None
    written = write_first_replies(target, [conv, prompts.conversation(0)], [False, False], 12, 0.8, torch.Generator())
    head = torch.tensor([chat.encode(target.tokenizer, conv[:-2])])
    greedy = target.reference().generate(head, attention_mask=torch.ones_like(head), max_new_tokens=12,
                                         do_sample=False)[0, head.shape[1]:].tolist()
    reply = target.tokenizer.decode([t for t in greedy if t not in target.eos_ids]).strip()
    assert reply and written[0] == conv[:-2] + [{"role": "assistant", "content": reply}, conv[-1]]
    assert written[1] == prompts.conversation(0)


def test_evaluation_prompts_are_not_template_prompts():
    from playground.prompts.sets import HELDOUT_CHAT, HELDOUT_CODE, HELDOUT_LONG_QUESTIONS, HELDOUT_SYSTEMS
    from playground.training.prompts import SYSTEMS, conversations

    training = {m["content"] for conv in conversations(20000) for m in conv}
    held_out = [*HELDOUT_CHAT, *HELDOUT_CODE, *HELDOUT_LONG_QUESTIONS, *HELDOUT_SYSTEMS]
    assert not set(held_out) & training and len(set(held_out)) == len(held_out)
    assert not set(HELDOUT_SYSTEMS) & set(SYSTEMS)


def test_the_schedule_warms_up_again_where_a_carried_run_goes_on():
    """Linear warm-up, cosine to 0 at the last step; a run carried without its optimizer warms up again from
    the step it goes on at, and the cosine goes on where it was."""
    cosine = lambda step: 0.5 * (1 + math.cos(math.pi * step / 100))
    assert [schedule_factor(s, 10, 100) for s in (0, 4, 9)] == pytest.approx([0.1 * cosine(0), 0.5 * cosine(4),
                                                                              cosine(9)])
    assert schedule_factor(100, 10, 100) == 0.0
    assert [schedule_factor(s, 10, 100, rewarm_from=50) for s in (50, 54, 59, 70)] == pytest.approx(
        [0.1 * cosine(50), 0.5 * cosine(54), cosine(59), cosine(70)])
