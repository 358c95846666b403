"""The corpus behind the long-context and people sources: chunks cut at paragraphs to their budget,
held-out sources never trained on, and both sources made by the real target, sent and unpacked whole."""

import random
import subprocess
import sys

import pytest
import torch

from playground.prompts import corpus_file
from playground.training import corpus, prompts
from playground.training.corpus import CHUNK_TOKENS, Document


def _documents(source: str, count: int, paragraphs: int, words: int) -> list[Document]:
    rng = random.Random(source)
    return [Document(source, f"{source}/{d}.rst",
                     f"Title {d}\n========\n\n" + "\n\n".join(" ".join(rng.choice(["alpha", "beta", "gamma", "delta"])
                                                                       for _ in range(words))
                                                              for _ in range(paragraphs)))
            for d in range(count)]


def _word_count(text: str) -> int:
    return len(text.split())


def test_chunks_keep_whole_paragraphs_in_order_within_their_budget():
    documents = _documents("django", 6, 40, 90)
    chunks = list(corpus._chunks(documents, _word_count, random.Random(0)))
    assert len(chunks) >= 3
    paragraphs = [p for doc in documents for p in doc.text.split("\n\n")]
    for chunk in chunks:
        assert CHUNK_TOKENS[0] <= chunk["tokens"] <= CHUNK_TOKENS[1]
        parts = chunk["text"].split("\n\n")
        first = paragraphs.index(parts[0])
        assert parts == paragraphs[first:first + len(parts)]   # whole paragraphs, in the documents' order
        assert chunk["names"] and all(name.startswith("django/") for name in chunk["names"])


def test_headings_of_restructured_text_markdown_and_manual_pages():
    text = "Intro\n=====\n\nbody\n\n## Install it\n\nOPTIONS\n       -v  more\n\n2.0.3\n-----\n\nNAME\n"
    assert corpus.headings(text) == ["Install it", "Intro", "Options"]   # no version numbers, no NAME


def test_held_out_sources_are_never_read_for_training(tmp_path):
    rng = random.Random(0)
    entries = (corpus.entries_of("django", _documents("django", 4, 40, 90), _word_count, rng)
               + corpus.entries_of("pytest", _documents("pytest", 4, 40, 90), _word_count, rng))
    assert {e["source"] for e in entries if e["kind"] == "chunk"} == {"django", "pytest"}
    assert not [e for e in entries if e["kind"] == "paste" and e["source"] == "pytest"]
    chunks, pastes = corpus.read(corpus_file.write(tmp_path / "corpus.jsonl.xz", entries))
    assert chunks and {c["source"] for c in chunks} == {"django"} and pastes
    assert corpus.read(tmp_path / "corpus.jsonl.xz") == (chunks, pastes)   # one fixed order everywhere
    messages = corpus.long_conversation(chunks, 3)
    assert chunks[1]["text"] in messages[-1]["content"] and chunks[1]["questions"][1] in messages[-1]["content"]
    pasted = [prompts.paste_conversation(pastes, i) for i in range(8)]
    assert all(any(p["text"] in m[-1]["content"] for p in pastes) for m in pasted)


def assert_same_shards(shards, folder) -> None:
    """Each shard's conversations (token ids, prompt length) as the shard of that name in `folder` has them."""
    pairs = lambda examples: [(e["ids"].tolist(), e["prompt_len"]) for e in examples]
    for shard in shards:
        assert pairs(torch.load(shard)) == pairs(torch.load(folder / shard.name))


def test_long_and_people_data_from_the_target_sent_and_unpacked_whole(tmp_path):
    """The wide plan at toy size through the command line: long-context questions after short
    chunks and the people source, then both folders compact and back as the same shards."""
    documents = _documents("django", 3, 12, 12)
    shrunk = lambda text: _word_count(text) * 50   # chunks of ~40-120 words pass for 2k-6k tokens
    entries = corpus.entries_of("django", documents, shrunk, random.Random(0))
    entries += [{"kind": "paste", "form": "code", "source": "stdlib/x.py", "text": "def f(x):\n    return x + 1"}]
    path = corpus_file.write(tmp_path / "corpus.jsonl.xz", entries)
    lease = [sys.executable, "-m", "devtools.gpu_lease"]
    work, out, back = tmp_path / "work", tmp_path / "out", tmp_path / "back"
    for step in (["data", "--budget-s", "600"], ["send", "--out", str(out)], ["unpack-data", "--parts", str(out), "--data", str(back)]):
        done = subprocess.run(lease + step + ["--plan", "toy-wide", "--work", str(work), "--corpus", str(path)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    from playground.model.target import Target
    tokenizer = Target.load().tokenizer
    for folder in ("long", "people"):
        made = sorted((work / "data" / folder).glob("shard-*.pt"))
        assert made and [p.name for p in made] == [p.name for p in sorted((back / folder).glob("shard-*.pt"))]
        assert_same_shards(made, back / folder)
    # a data folder made here travels the same way (pack-data), and comes back as it was
    again, back_again = tmp_path / "again", tmp_path / "back-again"
    for step in (["pack-data", "--data", str(back / "long"), "--out", str(again)],
                 ["unpack-data", "--parts", str(again), "--data", str(back_again)]):
        done = subprocess.run(lease + step, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in again.iterdir()] == ["data.tar.part-00"]
    assert_same_shards(sorted((back / "long").glob("shard-*.pt")), back_again / "long")
    long = [tokenizer.decode(e["ids"][:e["prompt_len"]]) for s in sorted((back / "long").glob("shard-*.pt")) for e in torch.load(s)]
    assert len(long) == 3
    assert all(any(c["text"] in p for c in corpus.read(path)[0]) for p in long)


def test_the_written_validation_set_is_whole_and_disjoint_from_every_held_out_and_sample_prompt(engine):
    """At least 200 prompts written as people type them, read by the page's own prompt-file reader, none
    of them in the held-out evaluation, the benchmark's suite, the page's samples or presets."""
    from pathlib import Path

    from playground.evaluation.heldout import eval_requests
    from playground.prompts.files import read_prompt_file
    from playground.prompts.sets import EVAL_KINDS, TRAINING_PROMPTS, suite
    from playground.ui.presets import PRESETS

    root = Path(__file__).resolve().parents[1]
    written = read_prompt_file(root / "training-data" / "validation" / "prompts.jsonl")
    assert len(written.prompts) >= 200 and len(written.categories) >= 8
    key = lambda text: " ".join(text.lower().split())
    mine = {key(p.prompt) for p in written.prompts}
    assert len(mine) == len(written.prompts)
    others = {key(r.prompt) for kind in EVAL_KINDS.values() if kind != TRAINING_PROMPTS
              for r in eval_requests(kind, "eagle3", 5, 8)}
    others |= {key(p.prompt) for p in suite(engine.tokenizer)} | {key(p.prompt) for p in PRESETS.values()}
    for sample in (root / "assets" / "prompts").iterdir():
        others |= {key(p.prompt) for p in read_prompt_file(sample).prompts}
    others |= {key(m[-1]["content"]) for m in prompts.conversations(5000)}
    assert len(others) > 100 and not mine & others


def test_a_prompt_file_is_a_data_source_its_prompts_answered_in_order(target, tmp_path):
    from pathlib import Path

    from playground.prompts.files import read_prompt_file
    from playground.training.data import DataConfig, generate, load_examples

    path = Path(__file__).resolve().parents[1] / "training-data" / "validation" / "prompts.jsonl"
    config = DataConfig(out=tmp_path / "val", prompts=3, batch=2, max_new_tokens=3, source="file", prompt_file=str(path))
    assert generate(config, target=target)
    examples = load_examples([config.out])
    assert [p.prompt for p in read_prompt_file(path).prompts[:3]] == [
        target.tokenizer.decode(ex["ids"][:ex["prompt_len"]]).split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        for ex in examples]
    assert all(0 < len(ex["ids"]) - ex["prompt_len"] <= 3 for ex in examples)


def test_a_folder_made_from_a_first_conversation_goes_on_where_another_ended(target, tmp_path):
    """`first`: the conversations from that index on, as the folder made from 0 has them (the greedy ones, in
    the same batches, token for token); its shards number from 0."""
    from pathlib import Path

    from playground.training.data import DataConfig, generate, list_shards, load_examples

    path = Path(__file__).resolve().parents[1] / "training-data" / "validation" / "prompts.jsonl"
    made = lambda name, **kw: DataConfig(out=tmp_path / name, batch=2, max_new_tokens=4, source="file",
                                         prompt_file=str(path), **kw)
    whole, rest = made("whole", prompts=4), made("rest", prompts=2, first=2)
    assert generate(whole, target=target) and generate(rest, target=target)
    assert [p.name for p in list_shards(rest.out)] == ["shard-00000.pt"]
    (_, _, greedy, sampled), (greedy_again, sampled_again) = load_examples([whole.out]), load_examples([rest.out])
    assert greedy["ids"].tolist() == greedy_again["ids"].tolist()
    prompt = lambda example: example["ids"][:example["prompt_len"]].tolist()
    assert prompt(sampled) == prompt(sampled_again) and prompt(greedy) != prompt(sampled)


@pytest.mark.parametrize("folder", ["long", "long-cpu", "people"])
def test_the_training_data_readme_counts_what_its_parts_hold(folder, tmp_path):
    from pathlib import Path
    from statistics import median

    from devtools.gpu_lease import unpack_data
    from playground.training.data import load_examples

    root = Path(__file__).resolve().parents[1] / "training-data"
    examples = load_examples(unpack_data(root / folder, tmp_path))
    prompts = [e["prompt_len"] for e in examples]
    answers = [len(e["ids"]) - e["prompt_len"] for e in examples]
    row = (f"| `{folder}` | {len(examples):,} | {sum(prompts):,} ({median(prompts):,.0f}) | "
           f"{sum(answers):,} ({median(answers):,.0f}) | {sum(a >= 256 for a in answers):,} |")
    assert row in (root / "README.md").read_text().splitlines()
