"""Your prompts through both drafters: the pooled report equals the runs one by one, a stopped study goes
on where it stopped, and the CLI's errors are one line."""

import json
from dataclasses import replace

import pytest

import playground.cli as command_line
from playground.engines.intervals import bootstrap_interval, tau_of
from playground.evaluation import prompt_report
from playground.evaluation.prompt_report import run
from playground.evaluation.study_report import StudyReport
from playground.evaluation.prompt_study import StudyConfig, measure
from playground.prompts.files import read_prompts
from tests.engines import CountingEngine

PROMPTS = [{"id": "sea", "prompt": "Write a haiku about the sea.", "document": "d"},
           {"id": "sort", "prompt": "Write a Python function that sorts a list of names.", "system": "Be brief.",
            "document": "d"},
           {"id": "math", "prompt": "What is 12 times 13?", "category": "math"}]
MAX_TOKENS = 24


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = command_line.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_pooled_report_equals_generate_json_run_one_by_one(tmp_path, capsys):
    too_long = {"id": "too-long", "prompt": "word " * 9000}   # past the 8,192-token context: skipped, with the reason
    write_jsonl(tmp_path / "mine.jsonl", PROMPTS + [too_long])
    code, out, err = run_cli(capsys, "bench", "--prompts", str(tmp_path / "mine.jsonl"), "--max-tokens", str(MAX_TOKENS),
                             "--max-prompt-chars", "50000", "--out", str(tmp_path / "report"))
    assert code == 0, err
    res = json.loads((tmp_path / "report" / "results.json").read_text())
    assert res["source"] == {"file": "mine.jsonl", "format": "prompt records", "prompts": 4, "measured": 3, "skipped": 1,
                             "units": 2}   # the two prompts naming document "d" are one unit of the intervals
    assert "the context holds 8192" in res["prompts"][3]["skipped"] and "too-long" in out
    assert res["lossless"] and {f.name for f in (tmp_path / "report").iterdir()} == {
        "results.json", "results.md", "prompts.csv", "charts.html"}

    for drafter in ("eagle3", "eagle3.1"):
        summaries = []
        for p in PROMPTS:
            system = ["--system", p["system"]] if "system" in p else []
            code, out, _ = run_cli(capsys, "generate", "--prompt", p["prompt"], *system, "--drafter", drafter,
                                   "--max-tokens", str(MAX_TOKENS), "--json")
            summaries.append(json.loads(out.strip().splitlines()[-1])["summary"])
        for p, s in zip(res["prompts"], summaries):
            assert p["runs"][drafter]["mean_acceptance_length"] == s["mean_acceptance_length"]
            assert p["runs"][drafter]["tokens_per_pass"] == s["tokens_per_pass"]
            assert p["runs"][drafter]["verify_steps"] == s["steps"]
            assert (p["prompt_tokens"], p["runs"][drafter]["tokens"]) == (s["prompt_tokens"], s["tokens"])
        pooled = next(row for row in res["pooled"] if row["method"] == drafter)
        steps = [s["drafting_steps"] for s in summaries]
        accepted = sum(round((s["mean_acceptance_length"] - 1) * n) for s, n in zip(summaries, steps))
        assert pooled["mean_acceptance_length"] == pytest.approx(1 + accepted / sum(steps), abs=1e-12)
        counts = [(round((s["mean_acceptance_length"] - 1) * n), n) for s, n in zip(summaries, steps)]
        units = [(counts[0][0] + counts[1][0], counts[0][1] + counts[1][1]), counts[2]]   # "d", then "math"
        assert pooled["tau_ci"] == pytest.approx(bootstrap_interval(tau_of(units), 2), abs=1e-12)
        # the headline: every token after a prompt's first over every verify step
        decoded = sum(s["tokens"] - 1 for s in summaries)
        assert pooled["tokens_per_pass"] == pytest.approx(decoded / sum(s["steps"] for s in summaries), abs=1e-12)
        assert pooled["tokens_per_pass_ci"][0] <= pooled["tokens_per_pass"] <= pooled["tokens_per_pass_ci"][1]
        depths = max(len(s["per_position_acceptance"]) for s in summaries)
        acceptance = [sum(s["per_position_acceptance"][d] * n for s, n in zip(summaries, steps)
                          if len(s["per_position_acceptance"]) > d) / sum(steps) for d in range(depths)]
        assert pooled["acceptance"] == pytest.approx(acceptance, abs=1e-12)
        for field in ("sink_attention", "rest_attention", "hidden_norm"):
            mean = f"mean_{field}"
            weights = [s["samples_by_depth"][field] for s in summaries]
            expected = [sum(s[mean][d] * w[d] for s, w in zip(summaries, weights) if len(w) > d)
                        / sum(w[d] for w in weights if len(w) > d) for d in range(len(pooled[field]))]
            assert pooled[field] == pytest.approx(expected, rel=1e-9) and len(pooled[field]) == 5

    # the three drift signals by depth, each drafter's mean the pooled row's, with intervals and the paired difference
    pooled = {row["method"]: row for row in res["pooled"]}
    signals = {(row["signal"], row["depth"]): row for row in res["signals"]}
    assert {s for s, _ in signals} == {"sink_attention", "self_attention", "rest_attention", "hidden_norm"}
    assert ("self_attention", 1) not in signals and ("self_attention", 5) in signals   # no own drafts at depth 1
    for (signal, depth), row in signals.items():
        for drafter in ("eagle3", "eagle3.1"):
            assert row["mean"][drafter] == pytest.approx(pooled[drafter][signal][depth - 1], rel=1e-9)
            assert row["ci"][drafter][0] <= row["mean"][drafter] <= row["ci"][drafter][1]
        (difference,) = row["differences"]
        assert (difference["a"], difference["b"]) == ("eagle3", "eagle3.1")
        assert difference["difference"] == pytest.approx(row["mean"]["eagle3.1"] - row["mean"]["eagle3"], abs=1e-12)
        assert difference["ci"][0] <= difference["difference"] <= difference["ci"][1]
    written = (tmp_path / "report" / "results.md").read_text()
    assert "Drift signals by depth (95% CI over 2 units: each document's prompts together, every other prompt " \
           "alone)" in written and "3 of 4 prompts measured, 1 skipped (intervals over 2 units" in written
    ratio = res["ratios"][0]
    assert (ratio["a"], ratio["b"]) == ("eagle3.1", "eagle3") and ratio["ci"][0] <= ratio["tau_ratio"] <= ratio["ci"][1]
    assert ratio["per_pass_ratio"] == pytest.approx(pooled["eagle3.1"]["tokens_per_pass"]
                                                    / pooled["eagle3"]["tokens_per_pass"], rel=1e-12)
    assert ratio["per_pass_ci"][0] <= ratio["per_pass_ratio"] <= ratio["per_pass_ci"][1]
    assert [g["group"] for g in res["by_category"]] == ["–", "math"]
    assert len(res["gains"]["most"]) == 1 and res["gains"]["better"] == "eagle3.1"
    csv_lines = (tmp_path / "report" / "prompts.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("index,id,category,prompt_tokens,skipped,eagle3 tau")
    html = (tmp_path / "report" / "charts.html").read_text()
    assert "tokens per target pass against prompt length" in html and 'src="https://cdn.plot.ly' not in html and len(html) > 1_000_000
    reloaded = StudyReport.from_json(res)   # the file read back draws what the run drew, and writes what it wrote
    assert reloaded.to_json() == res
    attention = prompt_report.figure_set(reloaded)["sink"]   # each drafter's sink, own-draft and rest lines
    assert {(t.legendgroup, t.line.dash) for t in attention.data} == {
        (d, dash) for d in ("eagle3", "eagle3.1") for dash in ("solid", "dot", "dash")}
    rest = next(t for t in attention.data if t.legendgroup == "eagle3.1" and t.line.dash == "dash")
    assert list(rest.y) == pytest.approx(next(r for r in res["pooled"] if r["method"] == "eagle3.1")["rest_attention"])


def test_a_stopped_study_goes_on_where_it_stopped(engine, tmp_path):
    prompts = read_prompts("\n\n".join(p["prompt"] for p in PROMPTS))
    config = StudyConfig(max_tokens=6)
    with pytest.raises(KeyboardInterrupt):   # in the second prompt's first run
        run(CountingEngine(engine, stop_at=3), config, prompts, "mine.txt", tmp_path)
    resumed = CountingEngine(engine)
    res, _ = run(resumed, config, prompts, "mine.txt", tmp_path)
    assert resumed.calls == 4 and [p.id for p in res.prompts] == ["prompt 1", "prompt 2", "prompt 3"]
    fresh = [u.result for u in measure(engine, prompts, config) if u.result]
    assert [p.runs["eagle3.1"].mean_acceptance_length for p in res.prompts] == [
        r.runs["eagle3.1"].tau for r in fresh]
    assert not (tmp_path / "progress.pkl").exists()

    with pytest.raises(KeyboardInterrupt):
        run(CountingEngine(engine, stop_at=3), config, prompts, "mine.txt", tmp_path)
    other = CountingEngine(engine)   # another configuration does not reuse the saved prompts
    run(other, replace(config, max_tokens=5), prompts, "mine.txt", tmp_path)
    assert other.calls == 6


def test_closing_the_study_stops_it_within_a_step(engine):
    prompts = read_prompts("\n\n".join(p["prompt"] for p in PROMPTS))
    watched = CountingEngine(engine)
    updates = measure(watched, prompts, StudyConfig(max_tokens=64))
    first = next(updates)
    assert first.result is None and first.current.startswith("prompt 1 · EAGLE 3 · ") and watched.ended == []
    updates.close()
    assert watched.calls == 1 and watched.ended == [1]   # the engine's stream was closed after its first step


def test_several_prompts_at_once_finish_all_and_stop_when_closed(engine):
    prompts = read_prompts("\n\n".join(p["prompt"] for p in PROMPTS))
    config = StudyConfig(max_tokens=8, concurrency=2)
    results = sorted((u.result for u in measure(engine, prompts, config)), key=lambda r: r.index)
    one_by_one = [u.result for u in measure(engine, prompts, replace(config, concurrency=1)) if u.result]
    assert [(r.id, {m: run.tau for m, run in r.runs.items()}) for r in results] == [
        (r.id, {m: run.tau for m, run in r.runs.items()}) for r in one_by_one]
    watched = CountingEngine(engine)
    updates = measure(watched, prompts, replace(config, max_tokens=64))
    next(updates)
    updates.close()
    assert sorted(watched.ended) == list(range(1, watched.calls + 1))   # every stream started has ended


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "ok"}\n{oops\n', "mine.jsonl: line 2: not JSON"),
    ("", "mine.jsonl: the file is empty"),
    (None, "cannot read"),
])
def test_a_bad_prompt_file_is_a_one_line_error(tmp_path, capsys, content, message):
    path = tmp_path / "mine.jsonl"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli(capsys, "bench", "--prompts", str(path), "--out", str(tmp_path / "report"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_out_of_range_study_options_are_one_line_errors(tmp_path, capsys):
    write_jsonl(tmp_path / "mine.jsonl", PROMPTS)
    for args, message in ((["--concurrency", "4"], "one prompt at a time"),
                          (["--drafters", "eagle3", "medusa"], "has no medusa"),
                          (["--sample", "0"], "the sample must be 1 to 1,000 prompts, got 0"),
                          (["--max-prompts", "2"], "the limit is 2")):
        code, _, err = run_cli(capsys, "bench", "--prompts", str(tmp_path / "mine.jsonl"), *args,
                               "--out", str(tmp_path / "report"))
        assert code == 2 and message in err, (args, err)
