"""A finished run's downloads (JSON, CSV by draft depth, HTML plots under the settings), the plots'
sample counts and the Comparison tab's table and note, from StepEvents built by hand."""

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from playground import plots
from playground.engines.draft_stop import DraftStop
from playground.engines.events import StepEvent
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.step_diff import DRAFT_QUANTITIES
from playground.engines.tree import TreeShape
from playground.ui import render
from playground.ui.compare_tab import TABLE_HEADERS, outputs_note, slower_reason, summary_table
from playground.ui.explainer import stored_bench, stored_speedups
from playground.ui.runs import CSV_FIELDS, RunLog, csv_rows, export, file_stem
from playground.ui.step_columns import QUANTITY_NAMES, divergence_marks, step_diff, step_figure, step_tolerance

PREFILL = StepEvent(step=0, position=12, token_ids=(7,), token_texts=("The",), verify_ms=30.0, elapsed_s=0.03)
# drafted 3, accepted 1: depth 1 accepted, depth 2 rejected, depth 3 never verified
CHAIN = StepEvent(step=1, position=13, token_ids=(8, 9), token_texts=(" sea", ","), draft_ids=(8, 5, 6),
                  draft_texts=(" sea", " is", " blue"), drafted=3, accepted=1, draft_probs=(0.9, 0.5, 0.4),
                  sink_attention=(0.6, 0.7, 0.8), self_attention=(0.0, 0.1, 0.2), hidden_norm=(1.0, 2.0, 3.0),
                  draft_ms=4.0, verify_ms=20.0, elapsed_s=0.06, finish_reason="length")


def steps(n: int, drafted: int = 3, accepted: int = 2) -> list[StepEvent]:
    """A prefill and n verify steps that each drafted `drafted` and accepted `accepted`."""
    return [PREFILL] + [StepEvent(step=i, position=12 + i * (accepted + 1), token_ids=(1,) * (accepted + 1),
                                  token_texts=("x",) * (accepted + 1), drafted=drafted, accepted=accepted,
                                  sink_attention=(0.5,) * drafted, self_attention=(0.1,) * drafted,
                                  hidden_norm=(1.0,) * drafted, draft_ms=2.0, verify_ms=10.0, elapsed_s=0.1 * i)
                        for i in range(1, n + 1)]


def test_a_step_is_a_csv_row_per_draft_depth_with_its_verdict():
    rows = csv_rows("eagle3.1", CHAIN)
    assert [(r["depth"], r["draft_text"], r["verdict"]) for r in rows] == [
        (1, " sea", "accepted"), (2, " is", "rejected"), (3, " blue", "not reached")]
    assert [r["sink_attention"] for r in rows] == [0.6, 0.7, 0.8]
    assert all(r["run"] == "eagle3.1" and r["committed_text"] == " sea," and r["accepted"] == 1 for r in rows)
    assert set(rows[0]) == set(CSV_FIELDS)


def test_a_step_without_drafts_is_one_row_with_empty_depth_cells():
    (row,) = csv_rows("none", PREFILL)
    assert row["step"] == 0 and row["committed_text"] == "The" and "depth" not in row and "verdict" not in row


def test_a_backend_that_reports_counts_only_still_has_a_row_per_depth():
    event = StepEvent(step=1, position=13, token_ids=(8,), token_texts=("a",), drafted=2, accepted=0, backend="vllm")
    rows = csv_rows("eagle3", event)
    assert [(r["depth"], r["verdict"], "draft_id" in r) for r in rows] == [(1, "rejected", False),
                                                                          (2, "not reached", False)]


def test_the_inspector_and_the_csv_read_one_verdict_rule():
    ended = StepEvent(step=1, position=13, token_ids=(8, 5), token_texts=("a", "b"), draft_ids=(8, 5, 6, 2),
                      draft_texts=("a", "b", "c", "d"), drafted=2, accepted=2)   # ended on an accepted draft
    for event in (CHAIN, ended):
        shown = re.findall(r'<span class="verdict [\w-]+">([\w ]+)</span>', render.inspector_html(event))
        assert tuple(shown) == event.draft_verdicts == tuple(r["verdict"] for r in csv_rows("x", event))
    assert ended.draft_verdicts == ("accepted", "accepted", "not reached", "not reached")


def test_a_stream_that_reports_its_steps_at_its_end_is_exported_and_inspected_by_those_steps(tmp_path):
    """A vLLM stream without the probe: chunks as they came, then the server's per-step counts (1 then 2
    accepted). The answer's step numbers, the inspector's steps and the JSON export are the verify steps."""
    chunk = dict(backend="vllm", drafted=3)
    events = [StepEvent(step=0, position=12, token_ids=(1, 2), token_texts=("a", "b"), **chunk),
              StepEvent(step=1, position=14, token_ids=(3, 4, 5), token_texts=("c", "d", "e"), **chunk,
                        finish_reason="length", step_accepted=(1, 2), step_drafted=(3, 3))]
    run = RunLog(GenerationRequest(prompt="p"), events)
    assert [(e.token_texts, e.accepted) for e in run.steps] == [(("a",), 0), (("b", "c"), 1), (("d", "e"), 2)]
    streamed = RunLog(GenerationRequest(prompt="p"))
    streamed.add(events[0])
    assert streamed.steps == events[:1]   # the stream's chunks until its end
    streamed.add(events[1])
    assert streamed.steps == run.steps and streamed.steps is streamed.steps   # re-split once, where it ended
    html = render.answer_html(run.steps)
    assert re.findall(r'data-step="(\d+)"', html) == ["0", "1", "2"]
    exported = json.loads(Path(export({"eagle3": run}, plots.all_figures({"eagle3": run.summary}),
                                      tmp_path)[0]).read_text())
    assert [step["token_texts"] for step in exported["eagle3"]["steps"]] == [["a"], ["b", "c"], ["d", "e"]]


def test_a_run_log_is_summarised_once_per_new_event(monkeypatch):
    """A page reads every run's summary at each update; a run with no new step since is not summarised
    again, and a new step, or its last step replaced (Stop marks it), is."""
    from playground.ui import runs

    calls = []
    monkeypatch.setattr(runs, "summarize", lambda events: calls.append(len(events)) or summarize(events))
    run = RunLog(GenerationRequest(prompt="p"), steps(2))
    assert run.summary == run.summary == summarize(steps(2)) and calls == [3]
    run.events.append(steps(3)[-1])
    assert run.summary == summarize(steps(3)) and calls == [3, 4]
    run.events[-1] = replace(run.events[-1], finish_reason="stopped")
    assert run.summary.finish_reason == "stopped" and calls == [3, 4, 4]


def test_file_names_say_which_runs_and_when():
    runs = {name: None for name in ("eagle3", "eagle3.1", "none")}
    assert file_stem(runs, "20261124-110512") == "eagle3_vs_eagle3.1_vs_none-20261124-110512"
    tree = {"eagle3 · chain k=4": None, "eagle3 · tree 2/4/8": None}
    assert file_stem(tree, "20261124-110512") == "eagle3_chain_k_4_vs_eagle3_tree_2_4_8-20261124-110512"
    folder = file_stem({"../../home/me/a very long checkpoint folder name/drafter": None}, "1")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", folder) and not folder.startswith(".") and len(folder) < 40


def test_export_writes_named_json_csv_and_a_small_html_page_with_the_settings(tmp_path):
    prompt, system = "Is <b>this</b> & that safe?", "Answer in <i>one</i> line."
    chain = GenerationRequest(prompt=prompt, system=system, drafter="eagle3.1", k=3, temperature=0.7, top_p=0.9,
                              max_tokens=2, seed=42)
    runs = {"eagle3.1": RunLog(chain, [PREFILL, CHAIN]),
            "eagle3 · tree 2/4/8": RunLog(GenerationRequest(prompt=prompt, system=system, drafter="eagle3",
                                                            tree=TreeShape(2, 4, 8), max_tokens=2), [PREFILL])}
    paths = [Path(p) for p in export(runs, plots.all_figures({n: r.summary for n, r in runs.items()}), root=tmp_path)]
    assert [p.suffix for p in paths] == [".json", ".csv", ".html"]
    assert re.fullmatch(r"eagle3\.1_vs_eagle3_tree_2_4_8-\d{8}-\d{6}", paths[0].stem)

    exported = json.loads(paths[0].read_text())
    assert list(exported) == list(runs) and set(exported["eagle3.1"]) == {"request", "steps", "summary"}
    chain_run = exported["eagle3.1"]
    assert (chain_run["request"]["prompt"], chain_run["request"]["seed"], chain_run["request"]["k"]) == (prompt, 42, 3)
    assert [s["token_ids"] for s in chain_run["steps"]] == [[7], [8, 9]]
    assert (chain_run["steps"][1]["draft_texts"], chain_run["steps"][1]["accepted"]) == ([" sea", " is", " blue"], 1)
    assert chain_run["steps"][1]["sink_attention"] == [0.6, 0.7, 0.8]
    summary = chain_run["summary"]   # one drafting step of 3 drafts that accepted the first
    assert (summary["tokens"], summary["mean_acceptance_length"]) == (3, 2.0)
    assert summary["per_position_acceptance"] == [1.0, 0.0, 0.0] and summary["finish_reason"] == "length"
    assert exported["eagle3 · tree 2/4/8"]["request"]["tree"] == {"top_k": 2, "depth": 4, "nodes": 8}

    with paths[1].open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_FIELDS
    assert [(r["run"], r["step"], r["depth"], r["verdict"]) for r in rows] == [
        ("eagle3.1", "0", "", ""), ("eagle3.1", "1", "1", "accepted"), ("eagle3.1", "1", "2", "rejected"),
        ("eagle3.1", "1", "3", "not reached"), ("eagle3 · tree 2/4/8", "0", "", "")]
    assert not any(cell.startswith("[") for r in rows for cell in r.values())

    page = paths[2].read_text()
    assert len(page) < 200_000 and "cdn.plot.ly" in page   # plotly.js is not inlined
    assert "Is &lt;b&gt;this&lt;/b&gt; &amp; that safe?" in page and "<b>this</b>" not in page
    assert "Answer in &lt;i&gt;one&lt;/i&gt; line." in page
    for setting in ("chain k=3", "tree 2/4/8", "<td>0.7</td>", "<td>0.9</td>", "<td>42</td>", "EAGLE 3.1"):
        assert setting in page, setting


def test_plots_show_the_samples_and_draw_thin_means_hollow():
    few, many = summarize(steps(3)), summarize(steps(8, accepted=1))
    acceptance, attention, norm = plots.all_figures({"eagle3": few, "eagle3.1": many})
    bars = [t for t in acceptance.data if t.type == "bar"]
    assert [list(t.customdata) for t in bars] == [[3, 3, 3], [8, 8, 8]]
    assert bars[0].marker.color == "rgba(0,0,0,0)" and bars[1].marker.color == plots.color("eagle3.1")
    conditional = [t for t in acceptance.data if t.type == "scatter"][1]
    assert list(conditional.customdata) == [8, 8, 0]   # steps that accepted d-1 drafts
    assert list(conditional.marker.symbol) == ["circle", "circle", "circle-open"]
    assert all("n = %{customdata}" in t.hovertemplate for fig in (acceptance, attention, norm) for t in fig.data)
    assert all("hollow: fewer than 5 samples" in fig.layout.title.text for fig in (acceptance, attention, norm))
    trusted = plots.hidden_norm({"eagle3.1": many})
    assert set(trusted.data[0].marker.symbol) == {"circle"} and "hollow" not in trusted.layout.title.text


def test_comparison_table_formats_and_columns():
    table = summary_table({"eagle3.1": summarize(steps(4)), "none": summarize(steps(4, drafted=0, accepted=0))})
    assert len(TABLE_HEADERS) == len(table[0]) and TABLE_HEADERS[3] == "speedup vs none"
    eagle, none = table
    assert eagle[0] == "EAGLE 3.1" and none[3] == "1.00x"
    assert (eagle[TABLE_HEADERS.index("tau (vLLM's)")], none[TABLE_HEADERS.index("tau (vLLM's)")]) == ("3.00", "1.00")
    assert (eagle[TABLE_HEADERS.index("tokens/pass")], none[TABLE_HEADERS.index("tokens/pass")]) == ("3.00", "1.00")
    assert eagle[TABLE_HEADERS.index("draft ms/step")] == "2.0" and none[TABLE_HEADERS.index("draft ms/step")] == "–"
    assert eagle[TABLE_HEADERS.index("verify ms/step")] == "10.0"
    assert re.fullmatch(r"\d+\.\d", eagle[TABLE_HEADERS.index("decode tokens/s")])
    assert isinstance(eagle[TABLE_HEADERS.index("steps")], int)


def test_a_run_slower_than_no_speculation_says_why():
    """A long prompt's prefill, the same with or without drafts, and decode steps dearer than the tokens
    each pass made: both in the note, with the figures behind them; a faster run gets no reason."""
    base = replace(summarize(steps(4, drafted=0, accepted=0)), tokens_per_s=20.0, decode_tokens_per_s=40.0,
                   time_to_first_token_s=3.0, elapsed_s=6.0, steps=120)
    slow = replace(summarize(steps(4)), tokens_per_s=18.0, decode_tokens_per_s=24.0, time_to_first_token_s=3.2,
                   elapsed_s=8.2, steps=50, tokens_per_pass=2.4)
    reason = slower_reason("eagle3.1", slow, base)
    assert reason == ("EAGLE 3.1 ran 0.90x end to end; the prefill (3.2 s, 39% of the run) is the same work with or "
                      "without drafts; decoding alone 0.60x: a step took 100.0 ms against 25.0 ms without speculation "
                      "at this context on this CPU, so each pass had to make 4.00 tokens to break even, and made 2.40. ")
    assert slower_reason("eagle3.1", replace(slow, tokens_per_s=21.0), base) == ""
    table = summary_table({"eagle3.1": slow, "none": base})
    assert table[0][TABLE_HEADERS.index("decode speedup")] == "0.60x" and table[1][TABLE_HEADERS.index("decode speedup")] == "1.00x"


def test_steps_an_engine_did_not_time_show_no_time():
    """A vLLM server times neither draft nor verify (both stay 0): the table and the inspector say nothing, not 0 ms."""
    untimed = [replace(e, draft_ms=0.0, verify_ms=0.0, backend="vllm") for e in steps(4)]
    row = summary_table({"eagle3.1": summarize(untimed)})[0]
    assert row[TABLE_HEADERS.index("draft ms/step")] == row[TABLE_HEADERS.index("verify ms/step")] == "–"
    assert "ms" not in re.search(r'<div class="inspector-head".*?</div>', render.inspector_html(untimed[2])).group()
    assert "verify 10.0 ms" in render.inspector_html(steps(4)[2])


@pytest.mark.parametrize("temperature, other, expected", [
    (0.0, (7, 8, 9), "All three answers are identical token for token (greedy decoding is lossless)."),
    (0.8, (7, 8, 4), "The answers differ from token 3 on: at temperature 0.8 each run samples its own tokens"),
    (0.0, (7,), "The answers differ from token 2 on: a run was stopped."),
])
def test_outputs_note_says_whether_the_answers_agree(temperature, other, expected):
    def log(ids, finish="length"):
        event = StepEvent(step=0, position=3, token_ids=ids, token_texts=("t",) * len(ids), finish_reason=finish)
        return RunLog(GenerationRequest(prompt="p", temperature=temperature), [event])

    logs = {"eagle3": log((7, 8, 9)), "eagle3.1": log(other, "stopped" if len(other) == 1 else "length"),
            "none": log((7, 8, 9))}
    note = outputs_note(logs)
    assert note.startswith(expected) and "one run on a shared CPU, and noisy" in note
    assert note.endswith(stored_speedups(stored_bench()))   # beside it, what many runs measured


def test_outputs_note_says_where_two_greedy_runs_of_one_drafter_first_differ_step_by_step(engine):
    """Fixed k against a stop rule, one drafter: the step diff finds the first step the rule cut. Two
    different drafters differ from their first draft on: no step diff, no outline, no note."""
    request = lambda drafter, rule=None: GenerationRequest(prompt="What is 2 + 2?", drafter=drafter, k=5, max_tokens=16,
                                                           draft_stop=DraftStop.parse(rule) if rule else None)
    two = {d: RunLog(request(d), list(engine.generate(request(d)))) for d in ("eagle3", "eagle3.1")}
    assert step_diff(two, step_tolerance(engine)) is None and "Step by step" not in outputs_note(two, None)
    logs = {"k=5": two["eagle3.1"], "stop": RunLog(request("eagle3.1", "probability<0.3"),
                                                          list(engine.generate(request("eagle3.1", "probability<0.3"))))}
    steps = step_diff(logs, step_tolerance(engine))
    note = outputs_note(logs, steps)
    assert "Step by step, k=5 and stop first differ at step 1 (its own counts): the accepted count, 5 against 4" in note
    same = {"a": logs["stop"], "b": RunLog(logs["stop"].request, logs["stop"].events)}
    assert "Step by step, a and b agree at every step (RMS and probability within 0.001 relative" in outputs_note(
        same, step_diff(same))
    assert set(QUANTITY_NAMES) == {name for name, _, _ in DRAFT_QUANTITIES} | {"accepted", "token", "answer_end"}
    marks = divergence_marks(steps)
    assert {name: step for name, (step, _) in marks.items()} == {"k=5": 1, "stop": 1}
    html = render.answer_html(logs["k=5"].steps, diverged=marks["k=5"])
    assert html.count('class="step diverged"') == 1 and 'data-step="1" title="first difference from the run' in html
    assert divergence_marks(step_diff({"a": logs["stop"], "b": logs["stop"]})) == {}
    # the step-by-step plot: a row per quantity, a line per depth, the first difference dotted
    figure = step_figure(logs, steps)
    rows = {trace.yaxis for trace in figure.data}
    # RMS, the three attention shares and the probability; the depths both drafted: the rule stopped at 4
    assert len(rows) == 5 and len(figure.data) == 5 * 4
    rms = next(t for t in figure.data if t.name == "depth 1" and t.yaxis == "y")
    first, second = logs["k=5"].steps, logs["stop"].steps
    assert rms.x[0] == 1 and rms.y[0] == pytest.approx(
        (second[1].hidden_norm[0] - first[1].hidden_norm[0]) / first[1].hidden_norm[0])
    deeper = next(t for t in figure.data if t.name == "depth 3" and t.yaxis == "y")
    assert deeper.x[0] == 3   # the draft of depth 3 of the step that starts at 1 concerns position 3
    assert [shape.x0 for shape in figure.layout.shapes] == [steps.diff.divergence.position] * 5
    same = step_figure(same, step_diff(same))
    assert {v for trace in same.data for v in trace.y} == {0.0} and not same.layout.shapes


def test_the_stored_speedups_are_each_drafters_range_over_the_categories():
    host = {"processor": "x86_64", "cpu": "Some CPU", "threads": 2, "torch": "2.13.0"}
    stored = stored_bench()
    rows = [replace(stored.rows[0], category=c, method=m, speedup_vs_none=v) for c, m, v in (
        ("chat", "none", 1.0), ("chat", "eagle3", 1.2), ("chat", "eagle3.1", 1.4),
        ("code", "none", 1.0), ("code", "eagle3", 0.9), ("code", "eagle3.1", 1.7))]
    assert stored_speedups(replace(stored, rows=rows, machine=host)) == (
        "The stored benchmark measured, over its 2 prompt categories, the speed without speculation times "
        "EAGLE 3 0.90x to 1.20x, EAGLE 3.1 1.40x to 1.70x (Some CPU, 2 threads, torch 2.13.0).")


def test_the_inspector_counts_what_it_lists_and_says_when_nothing_was_drafted():
    head = lambda html: re.search(r'<div class="inspector-head".*?</div>', html).group()
    assert "1 of 3 drafts accepted ·" in head(render.inspector_html(CHAIN))
    unverified = replace(CHAIN, drafted=2, accepted=1)   # the third draft was made, never checked
    html = render.inspector_html(unverified)
    assert "1 of 2 drafts accepted, 1 not verified" in head(html) and html.count("<tr>") == 1 + 3
    alone = replace(steps(1, drafted=0, accepted=0)[1], draft_ids=(), draft_texts=(), draft_probs=())
    html = render.inspector_html(alone)
    assert "<table" not in html and "Nothing was drafted at this step" in html
