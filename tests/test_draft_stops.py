"""`bench draft-stop`: thresholds chosen on held-out prompts, then rules against fixed k on prompts the
choice never saw, every answer the same as fixed k's."""

import json
from pathlib import Path

import pytest

from playground.engines.draft_stop import DraftStop
from playground.engines.intervals import paired_ratio
from playground.engines.stats import rate_of_runs
from playground.evaluation import runner
from playground.prompts.files import read_prompt_file
from playground.studies import draft_stops
from playground.prompts.sets import BenchPrompt, suite
from playground.studies.draft_stop_report import DraftStopReport, markdown, table
from playground.studies.draft_stops import CANDIDATES, DraftStopConfig
from playground.studies.rejection import SAMPLE


def test_thresholds_are_chosen_on_prompts_the_evaluation_never_sees(engine):
    config = DraftStopConfig(prompts=24)
    assert set(draft_stops.evaluation_sets(config, engine.tokenizer)) == {"chat sample", "long documents"}
    chosen_on = {p.request("none", 1, 1).prompt for p in draft_stops.choice_prompts(config)}
    evaluated = {p.prompt for prompts in draft_stops.evaluation_sets(config, engine.tokenizer).values()
                 for p in prompts}
    assert len(chosen_on) >= 40 and not chosen_on & evaluated
    assert not chosen_on & {p.prompt for p in read_prompt_file(SAMPLE).prompts}   # the whole sample


def test_a_measured_choice_keeps_the_fastest_candidate_and_every_answer_equals_fixed_ks(engine):
    config = DraftStopConfig(drafters=("eagle3.1",), prompts=1, documents=0, max_tokens=24)
    result = draft_stops.measure(engine, config)
    written = json.loads(json.dumps(result.to_json()))   # as results.json holds it, and as it reads back
    assert json.loads(json.dumps(DraftStopReport.from_json(written).to_json())) == written
    choice = written["choice"]
    assert [r["method"] for r in choice][0] == "k=5" and len(choice) == 1 + sum(map(len, CANDIDATES.values()))
    for rules, chosen in zip(CANDIDATES.values(), written["chosen"]["eagle3.1"]):
        fastest = max((r for r in choice if r["rule"] in rules), key=lambda r: r["tokens_per_s"])
        assert chosen == fastest["rule"]
    rows = written["evaluation"]
    assert {r["set"] for r in rows} == {"chat sample"}
    assert [r["method"] for r in rows] == ["k=5", "k=1", "k=2", "k=10", "k=5, a call per depth",
                                           *(f"k<=10 until {rule}" for rule in written["chosen"]["eagle3.1"])]
    for r in choice + rows:
        assert r["answers_differ"] == 0, r
        assert 0 <= r["refused_per_step"] <= r["drafted_per_step"] <= r["k"]
    by_method = {r["method"]: r for r in rows}
    assert by_method["k=5"]["speedup_vs_k5"] == 1 and by_method["k=5"]["speedup_vs_k5_ci"] == [1, 1]
    steps_of = lambda r: (r["tokens_per_step"], r["drafted_per_step"], r["refused_per_step"], r["tau"])
    assert steps_of(by_method["k=5, a call per depth"]) == steps_of(by_method["k=5"])   # the same drafts, greedy
    assert by_method["k=5, a call per depth"]["rule"] is None
    assert by_method["k=10"]["drafted_per_step"] > by_method["k=5"]["drafted_per_step"]
    strict = DraftStop.parse(written["chosen"]["eagle3.1"][0])
    assert by_method[f"k<=10 until {strict}"]["drafted_per_step"] < 10
    assert "Against fixed k" in markdown(result) and result.lossless


def test_the_stored_report_reads_back_and_writes_the_same_file_and_table():
    stored = Path(__file__).resolve().parents[1] / "assets" / "benchmark" / "draft-stop"
    written = json.loads((stored / "results.json").read_text())
    report = DraftStopReport.from_json(written)
    assert json.loads(json.dumps(report.to_json())) == written
    assert markdown(report) == (stored / "results.md").read_text()


def test_the_questions_about_one_long_document_are_one_unit_of_the_intervals(engine):
    documents = suite(engine.tokenizer, draft_stops.DOCUMENTS, 2)
    assert [p.document for p in documents] == [c for c in draft_stops.DOCUMENTS for _ in range(2)]
    prompts = [BenchPrompt("x", "Read: the sea is blue and cold. Why is it blue?", document="sea"),
               BenchPrompt("x", "Read: the sea is blue and cold. Is it warm?", document="sea"),
               BenchPrompt("x", "What is 12 times 13?")]
    config = DraftStopConfig(drafters=("eagle3.1",), prompts=1, documents=0, max_tokens=16)
    k5, k1 = draft_stops.fixed(5, "eagle3.1"), draft_stops.fixed(1, "eagle3.1")
    results = draft_stops._measured(engine, prompts, [k5, k1], config, None, "units")
    row = draft_stops._row("set", "eagle3.1", k1, results, k5)
    units = runner.by_unit(results)
    assert (row.prompts, row.units, len(units)) == (3, 2, 2)
    assert units[0].runs["k=1"].tokens == results[0].runs["k=1"].tokens + results[1].runs["k=1"].tokens
    speedup, ci = paired_ratio(rate_of_runs([u.runs["k=1"] for u in units]),
                               rate_of_runs([u.runs["k=5"] for u in units]), 2)
    assert row.speedup_vs_k5 == pytest.approx(speedup, rel=1e-12) and row.speedup_vs_k5_ci == list(ci)
    assert "set (3 on 2 texts)" in table([row]) and "95% CI over the set's units" in table([row])
