"""`python -m playground bench`: the suite, its report, and its separation from the training prompts."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from playground.engines import chat
from playground.engines.tree import TreeShape
from playground.evaluation import report, trees
from playground.evaluation.bench_report import BenchReport
from playground.evaluation.benchmark import BenchConfig, collect, results
from playground.prompts.sets import CATEGORIES, EVAL_KINDS, suite
from playground.training.prompts import conversations
from tests.engines import CountingEngine

ROOT = Path(__file__).resolve().parents[1]


def test_suite_covers_every_category_with_long_contexts_near_their_budget(engine):
    prompts = suite(engine.tokenizer)
    assert {p.category for p in prompts} == set(CATEGORIES)
    for p in prompts:
        n = len(engine.prompt_ids(p.request("none", 5, 8)))
        if p.category.startswith("long context"):
            budget = int(p.category.split()[-1].rstrip("k")) * 1000
            assert 0.9 * budget <= n <= 1.1 * budget, (p.category, n)
    assert {p.template for p in prompts if p.category == "perturbed template"} <= set(chat.TEMPLATES) - {"model"}
    assert all(p.system for p in prompts if p.category == "odd system prompt")


def test_suite_prompts_are_not_training_prompts(engine):
    training = {m["content"] for conv in conversations(4000) for m in conv}
    assert not [p.prompt for p in suite(engine.tokenizer) if p.prompt in training or (p.system or "") in training]


@pytest.mark.slow
def test_bench_cli_writes_table_json_and_charts_and_is_lossless(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "playground", "bench", "--categories", "coding", "perturbed template",
                           "--per-category", "1", "--max-tokens", "12", "--sweep-ks", "1", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["lossless"] and not res["mismatches"]
    assert {(r["category"], r["method"]) for r in res["rows"]} == {
        (c, m) for c in ("coding", "perturbed template") for m in ("none", "eagle3", "eagle3.1")}
    for r in res["rows"]:
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0
        assert r["mean_acceptance_length"] >= 1.0
        assert (r["method"] == "none") == (r["steps"] > 0 and not r["acceptance"])
    assert [s["k"] for s in res["sweep"]] == [1, 3] and len(res["sweep"][1]["acceptance"]) == 3
    # every drafter also drafts the default tree, on the same prompts (the lossless check covers it)
    assert {(t["category"], t["method"]) for t in res["trees"]} == {
        (c, f"{d} · tree 2/4/8") for c in ("coding", "perturbed template") for d in ("eagle3", "eagle3.1")}
    rows = {(r["category"], r["method"]): r for r in res["rows"]}
    for t in res["trees"]:
        chain = rows[(t["category"], t["drafter"])]
        assert t["tree"] == {"top_k": 2, "depth": 4, "nodes": 8} and t["tokens"] == chain["tokens"]
        assert t["chain_tau"] == chain["mean_acceptance_length"] and t["verify_ms"] > 0
        assert t["speedup_vs_chain"] == pytest.approx(t["tokens_per_s"] / chain["tokens_per_s"])
    # the drift signals over both categories: each drafter's per-step mean, with its interval
    signals = {(row["signal"], row["depth"]): row for row in res["signals"]}
    assert {s for s, _ in signals} == {"sink_attention", "self_attention", "rest_attention", "hidden_norm"}
    assert ("hidden_norm", 5) in signals and ("self_attention", 1) not in signals
    for (signal, depth), row in signals.items():
        assert set(row["mean"]) == {"eagle3", "eagle3.1"}
        for drafter, (lo, hi) in row["ci"].items():   # pooled over two categories: between their own means
            by_category = [r[signal][depth - 1] for r in res["rows"] if r["method"] == drafter]
            assert min(by_category) - 1e-12 <= row["mean"][drafter] <= max(by_category) + 1e-12
            assert lo <= row["mean"][drafter] <= hi
        assert row["differences"][0]["difference"] == pytest.approx(row["mean"]["eagle3.1"] - row["mean"]["eagle3"])
    ceiling = res["ceiling"]
    assert ceiling["bandwidth_gb_s"] > 0 and ceiling["measured_ms"]["1"] > 0 and ceiling["tokens_per_s"] > 0
    table = (out / "results.md").read_text()
    assert "| coding |" in table and "| perturbed template |" in table and "k sweep" in table
    assert "against a draft tree (2/4/8" in table and "| coding | EAGLE 3.1 |" in table
    assert "Drift signals by depth (95% CI over prompts), all categories" in table
    assert table in proc.stdout
    assert "plotly" in (out / "charts.html").read_text()[:5_000_000]


def holds(written, stored) -> bool:
    """Whether `written` holds every field of `stored` with its value, fields it adds aside."""
    if isinstance(stored, dict):
        return isinstance(written, dict) and all(k in written and holds(written[k], v) for k, v in stored.items())
    if isinstance(stored, list):
        return isinstance(written, list) and len(written) == len(stored) and all(map(holds, written, stored))
    return written == stored


@pytest.mark.parametrize("name, record, render", [("reference", BenchReport, report.markdown),
                                                  ("k-auto", BenchReport, report.markdown),
                                                  ("trees", trees.TreeBench, trees.markdown)])
def test_a_stored_report_reads_back_and_writes_every_field_it_held(name, record, render):
    """The shipped reports, the older without the fields added since (the decode phase, the chosen ks, attention
    to the rest of the context), read as records that write every field again with its value."""
    stored = json.loads((ROOT / "assets" / "benchmark" / name / "results.json").read_text())
    read = record.from_json(stored)
    again = json.loads(json.dumps(read.to_json()))
    assert holds(again, stored)
    assert (again == stored) == (name != "trees")   # the suite's and k-auto's have every field already
    assert "| chat |" in render(read)
    assert holds({"a": 1, "b": [2]}, {"a": 1}) and not holds({"a": 1}, {"a": 2}) and not holds({"a": [1]}, {"a": [1, 2]})


def test_the_suites_drift_signals_resample_a_documents_questions_together(engine, tmp_path):
    """Three prompts, two of them naming one document: the signals' means are the same sums, their intervals
    resample two units, and the report says so."""
    config = BenchConfig(max_tokens=8, categories=("coding",), per_category=3, sweep_ks=(), tree=None)
    alone = collect(engine, engine, config, tmp_path / "progress.pkl")
    clustered = [replace(r, document="shared") if r.index < 2 else r for r in alone]
    by_prompt, by_unit = results(alone, config), results(clustered, config)
    assert (by_prompt.signal_units, by_unit.signal_units) == (3, 2)
    assert [(s.signal, s.depth) for s in by_unit.signals] == [(s.signal, s.depth) for s in by_prompt.signals]
    for unit, prompt in zip(by_unit.signals, by_prompt.signals):
        assert unit.mean == pytest.approx(prompt.mean)
    assert [s.ci for s in by_unit.signals] != [s.ci for s in by_prompt.signals]
    assert BenchReport.from_json(json.loads(json.dumps(by_unit.to_json()))).signal_units == 2
    assert "Drift signals by depth (95% CI over 2 units: each document's prompts together" in report.markdown(by_unit)
    assert "Drift signals by depth (95% CI over prompts)" in report.markdown(by_prompt)


def test_an_interrupted_bench_goes_on_from_its_last_finished_prompt(engine, tmp_path):
    config = BenchConfig(drafters=("eagle3.1",), max_tokens=6, categories=("coding",), per_category=2, sweep_ks=())
    progress = tmp_path / "progress.pkl"
    with pytest.raises(KeyboardInterrupt):   # stopped in the second prompt's second run
        collect(CountingEngine(engine, stop_at=4), engine, config, progress)
    resumed = CountingEngine(engine)
    out = collect(resumed, engine, config, progress)
    assert resumed.calls == 2 and [r.index for r in out] == [0, 1]
    assert all(set(r.runs) == {"none", "eagle3.1"} and r.reference_seconds > 0 and r.answer for r in out)
    assert not any(r.mismatches for r in out)

    other = CountingEngine(engine)   # another configuration does not reuse the saved runs
    collect(other, engine, replace(config, max_tokens=5), progress)
    assert other.calls == 4


# the fields of a chain-vs-tree row in `bench`'s results.json ("trees") and in `bench trees`' ("compare", "sweep")
SUITE_TREE_FIELDS = {"category", "drafter", "method", "tree", "runs", "min_prompt_tokens", "tokens", "seconds", "steps",
                     "mean_acceptance_length", "acceptance", "sink_attention", "hidden_norm", "draft_ms", "verify_ms",
                     "other_ms", "tokens_per_s", "speedup_vs_chain", "speedup_vs_none", "chain_tau",
                     "chain_tokens_per_s", "chain_verify_ms", "chain_draft_ms"}
TREE_BENCH_FIELDS = {"kind", "drafter", "method", "tau", "tokens_per_s", "speedup_vs_chain", "draft_ms", "verify_ms",
                     "steps", "tokens"}


def test_both_tree_benchmarks_build_and_print_their_rows_alike(engine):
    tree = TreeShape(2, 2, 3)
    config = BenchConfig(drafters=("eagle3.1",), max_tokens=6, categories=("coding",), per_category=1, sweep_ks=(),
                         compare_generate=False, tree=tree)
    res = results(collect(engine, engine, config), config)
    swept = trees.measure(engine, trees.TreeBenchConfig(drafters=("eagle3.1",), kinds=(EVAL_KINDS["chat"],),
                                                        tree=tree, shapes=(), prompts=1, max_tokens=6))
    rows = [r.to_json() for r in res.trees + swept.compare + swept.sweep]
    assert [r["method"] for r in rows] == ["eagle3.1 · tree 2/2/3", "chain k=5", "tree 2/2/3", "chain k=5"]
    for r in rows:
        assert not (SUITE_TREE_FIELDS | TREE_BENCH_FIELDS) - set(r), (SUITE_TREE_FIELDS | TREE_BENCH_FIELDS) - set(r)
        assert r["kind"] == r["category"] and r["tau"] == r["mean_acceptance_length"]
        assert r["speedup_vs_chain"] == pytest.approx(r["tokens_per_s"] / r["chain_tokens_per_s"])
    chain = res.row("coding", "eagle3.1").pooled
    assert res.trees[0].chain_tau == chain.mean_acceptance_length and res.trees[0].speedup_vs_none > 0
    # the chain row is the chain's own run, measured again here (greedy: the same steps)
    from playground.engines.stats import summarize
    from playground.evaluation.heldout import eval_requests

    alone = summarize(list(engine.generate(eval_requests(EVAL_KINDS["chat"], "eagle3.1", 5, 6)[0])))
    first = rows[1]   # swept.compare[0]
    assert first["tau"] == alone.mean_acceptance_length and first["tokens"] == alone.tokens
    assert first["chain_tau"] == first["tau"] and first["tree"] is None
    assert rows[2]["tree"] == {"top_k": 2, "depth": 2, "nodes": 3}
    # the report reads back as it was written, and writes the same file again
    written = json.loads(json.dumps(res.to_json()))
    assert json.loads(json.dumps(BenchReport.from_json(written).to_json())) == written
    # one writer: the same table in the suite's report and in the tree benchmark's
    assert trees.chain_vs_tree_table(res.trees) in report.markdown(res)
    assert trees.chain_vs_tree_table(swept.compare) in trees.markdown(swept)
    assert "| coding | eagle3.1 | tree 2/2/3 |" in report.markdown(res)


def test_bench_k_auto_runs_each_prompts_chains_at_the_k_generate_would_choose(engine, step_costs, tmp_path):
    from playground.evaluation.k_choice import chosen
    from playground.prompts.sets import suite

    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "playground", "bench", "--k", "auto", "--categories", "chat",
                           "coding", "--per-category", "1", "--max-tokens", "12", "--sweep-ks", "--no-trees",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["k"] == "auto" and res["lossless"]
    for prompt in suite(engine.tokenizer, ("chat", "coding"), 1):
        for drafter in ("eagle3", "eagle3.1"):
            request = chosen(engine, prompt.request(drafter, 5, 12))[0]
            k = request.k if request.drafter == drafter else 0
            row = next(r for r in res["rows"] if r["category"] == prompt.category and r["method"] == drafter)
            assert row["chain_ks"] == {str(k): 1}, (prompt.category, drafter)
    for row in res["rows"]:   # the decode phase's speed-up: tokens after each prompt's prefill, over plain decoding's
        none = next(r for r in res["rows"] if r["category"] == row["category"] and r["method"] == "none")
        assert row["decode_tokens_per_s"] == pytest.approx(row["decode_tokens"] / row["decode_seconds"])
        assert row["decode_speedup_vs_none"] == pytest.approx(row["decode_tokens_per_s"] / none["decode_tokens_per_s"])
    assert "k auto chose, by prompt" in (out / "results.md").read_text()
    for command in (["bench", "--k", "auto", "trees"], ["bench", "--k", "auto", "--backend", "vllm"]):
        proc = subprocess.run([sys.executable, "-m", "playground", *command], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode != 0 and "--k auto" in proc.stderr and "Traceback" not in proc.stderr
