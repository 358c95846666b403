"""The long-context study at toy size with the real target: held-out documents cut at each length,
both drafters at one k, tau with intervals by document, and own-draft attention against uniform."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from playground.engines.events import StepEvent
from playground.engines.stats import own_vs_uniform, pooled_tau
from playground.evaluation.machine import machine
from playground.evaluation.runner import by_document
from playground.evaluation.tables import with_interval
from playground.studies import long_context
from playground.studies.long_context import LongContextConfig, document_of, documents, prompts


def test_own_draft_attention_is_measured_against_a_uniform_spread_over_the_keys():
    event = StepEvent(step=3, position=100, token_ids=(1,), token_texts=("a",), self_attention=(0.0, 0.02, 0.03))
    assert own_vs_uniform(event) == pytest.approx((0.0, 0.02 * 101 / 1, 0.03 * 102 / 2))


def test_documents_are_held_out_disjoint_and_cut_at_each_length(engine):
    docs = documents(4, 2000)
    assert len({d.id for d in docs}) == 4 and all(d.tokens >= 2000 for d in docs)
    assert all(name.startswith("doc/") for d in docs for name in d.files)   # pytest's documentation
    assert not set(docs[0].text.split("\n\n")) & set(docs[-1].text.split("\n\n")) - {""}
    cut = prompts(docs[:2], (256, 1024), engine.tokenizer)
    assert [p.id for p in cut] == ["doc00@256", "doc00@1024", "doc01@256", "doc01@1024"]
    lengths = [len(engine.prompt_ids(p.request("eagle3", 5, 8))) for p in cut]
    assert all(abs(n - p.length) <= long_context.QUESTION_ROOM for n, p in zip(lengths, cut))
    assert cut[0].text.split("\n\n")[-1] == cut[1].text.split("\n\n")[-1]   # one question for a document's cuts
    assert cut[1].text.startswith(cut[0].text.rsplit("\n\n", 1)[0][:200])    # its cuts start alike


def test_the_study_pools_by_length_and_resamples_documents(engine, tmp_path):
    config = LongContextConfig(documents=2, lengths=(128, 256), ks=(2,), max_tokens=8)
    docs, results = long_context.collect(config, engine, tmp_path)
    assert len(results) == 4 and not any(r.skipped for r in results)
    report = {**long_context.analyse(config, results), "config": asdict(config), "machine": machine()}
    rows = {(r["context"], r["k"]): r for r in report["rows"]}
    assert set(rows) == {("128", 2), ("256", 2), ("all", 2)} and report["lossless"]
    assert rows[("256", 2)]["prompt_tokens"] > rows[("128", 2)]["prompt_tokens"]
    for drafter in config.drafters:
        method = long_context.method_name(drafter, 2)
        whole = by_document(results, method, document_of)   # a document's two cuts summed: the unit resampled
        assert len(whole) == 2 and sum(t.drafting_steps for t in whole) == sum(r.runs[method].drafting_steps
                                                                              for r in results)
        assert rows[("all", 2)]["tau"][drafter] == pytest.approx(pooled_tau(t.counts for t in whole))
        lo, hi = rows[("all", 2)]["tau_ci"][drafter]
        assert lo <= rows[("all", 2)]["tau"][drafter] <= hi
        assert rows[("128", 2)]["own_vs_uniform"][drafter][0] == 0.0   # depth 1 has no earlier drafts
    row = rows[("all", 2)]
    assert row["ratio"] == pytest.approx(row["tau"]["eagle3.1"] / row["tau"]["eagle3"])
    text = long_context.markdown(report)
    assert "| context | k | documents |" in text and "resample documents" in text


STORED = Path(__file__).resolve().parents[1] / "assets" / "benchmark"
DRIFT_DOC = STORED.parents[1] / "docs" / "drift.md"


def stored(folder: str) -> dict:
    return json.loads((STORED / folder / "results.json").read_text())


def rows_of(text: str, head: str) -> list[list[str]]:
    """The cells of the rows of the table under the first line starting with `head`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head)) + 2
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start:end]]


def test_the_stored_reports_and_the_docs_tables_say_what_the_results_hold():
    """results.md is the study's table of results.json; docs/drift.md's tables are rows of those reports."""
    shipped, retrained = stored("long-context"), stored("long-context-retrained")
    for folder, report in (("long-context", shipped), ("long-context-retrained", retrained)):
        assert long_context.markdown(report) == (STORED / folder / "results.md").read_text()
    doc, report_md = DRIFT_DOC.read_text(), (STORED / "long-context" / "results.md").read_text()
    tau_rows = rows_of(doc, "| context | k | documents | prompt tokens (median) |")
    assert len(tau_rows) >= 5 and all(f"| {' | '.join(row)} |" in report_md for row in tau_rows)

    eagle3, eagle31 = lambda report: report["config"]["drafters"][0], lambda report: report["config"]["drafters"][-1]
    cell = lambda row, drafter: with_interval(row["tau"][drafter], row["tau_ci"][drafter])
    key = lambda row: (row["context"] if row["context"] == "all" else f"{int(row['context']):,}", str(row["k"]))
    by_key = lambda report: {key(row): row for row in report["rows"]}
    first, second = by_key(shipped), by_key(retrained)
    pair_rows = rows_of(doc, "| context | k | documents | EAGLE 3 shipped |")
    assert len(pair_rows) == len(first) == len(second)
    for row in pair_rows:
        old, new = first[tuple(row[:2])], second[tuple(row[:2])]
        assert row[2:] == [str(old["documents"]), cell(old, eagle3(shipped)), cell(new, eagle3(retrained)),
                           cell(old, eagle31(shipped)), cell(new, eagle31(retrained)),
                           with_interval(old["ratio"], old["ratio_ci"]), with_interval(new["ratio"], new["ratio_ci"])], row
