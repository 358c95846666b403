"""What predicts a rejected draft (studies/rejection.py): the statistics on data whose answer is known,
and the stored report's negative control."""

import json

import numpy as np

from playground.engines.events import StepEvent
from playground.engines.stats import VerifiedDraft, verified_drafts
from playground.evaluation.runner import PromptResult
from playground.studies import rejection
from playground.studies.rejection_report import DRIFT, SIGNALS, RejectionReport, figure, markdown


def test_auc_counts_pairs_and_halves_ties():
    assert rejection.auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert rejection.auc(np.array([1.0]), np.array([1.0])) == 0.5
    assert rejection.auc(np.array([1.0, 2.0]), np.array([2.0, 3.0])) == 0.125   # one tie of four pairs
    assert np.isnan(rejection.auc(np.array([1.0]), np.array([])))


def test_only_drafts_the_target_verified_count():
    step = StepEvent(step=1, position=5, token_ids=(7, 8), token_texts=("a", "b"), draft_ids=(7, 9, 9), drafted=3,
                     accepted=1, draft_probs=(0.9, 0.4, 0.3), sink_attention=(0.1, 0.2, 0.3), hidden_norm=(1.0, 2.0))
    drafts = verified_drafts([StepEvent(step=0, position=4, token_ids=(1,), token_texts=("x",)), step])
    assert drafts == (VerifiedDraft(1, True, 0.9, {"sink_attention": 0.1, "hidden_norm": 1.0}),
                      VerifiedDraft(2, False, 0.4, {"sink_attention": 0.2, "hidden_norm": 2.0}))
    assert drafts[1].value("self_attention") is None and drafts[1].value("probability") == 0.4


def noise(rng) -> dict[str, float]:
    """Every drift signal drawn at random."""
    return {name: rng.uniform() for name in DRIFT}


def synthetic(prompts: int, seed: int = 0) -> list[PromptResult]:
    """Drafts whose acceptance follows their probability, with attention that is noise."""
    rng = np.random.default_rng(seed)
    results = []
    for i in range(prompts):
        drafts = []
        for _ in range(20):
            for depth in (1, 2):
                p = rng.uniform()
                drafts.append(VerifiedDraft(depth, bool(rng.uniform() < p), p, noise(rng)))
        results.append(PromptResult(i, f"p{i}", None, drafts={"eagle3.1": tuple(drafts)}))
    return results


def test_a_signal_that_decides_acceptance_separates_and_noise_and_shuffled_verdicts_do_not():
    config = rejection.RejectionConfig(drafters=("eagle3.1",), k=2)
    report = rejection.analyse(synthetic(30), config, resamples=300).drafters["eagle3.1"]
    for row in report.by_depth:
        low, high = row.auc_ci
        if row.signal == "probability":
            assert low > 0.6, row   # P(accepted) = p: an AUC near 0.83
            assert row.null_band[0] <= 0.5 <= row.null_band[1] < low, row
        else:
            assert low <= 0.5 <= high, row
    assert report.added_value.gain_ci[0] <= 0 <= report.added_value.gain_ci[1]
    assert report.added_value.probability_auc > 0.7


def test_the_within_prompt_auc_counts_only_pairs_of_one_prompt():
    values = np.array([2.0, 1.0, 0.0, 5.0])
    accepted = np.array([True, False, True, False])
    groups = [np.array([0, 1]), np.array([2, 3])]
    assert rejection.auc(values[accepted], values[~accepted]) == 0.25   # pooled: one pair of four
    assert rejection.within_prompt_auc(values, accepted, groups) == 0.5   # one pair of each prompt's two
    assert np.isnan(rejection.within_prompt_auc(values, accepted, [np.array([0]), np.array([2])]))


def confounded(prompts: int, seed: int = 0) -> list[PromptResult]:
    """Prompts whose sink attention sets both its own level and the prompt's acceptance rate, with no
    information about which of a prompt's drafts is accepted; the probability decides within prompts."""
    rng = np.random.default_rng(seed)
    results = []
    for i in range(prompts):
        level = rng.uniform()
        drafts = []
        for _ in range(20):
            p = rng.uniform()
            accepted = bool(rng.uniform() < 0.5 * p + 0.5 * level)
            drafts.append(VerifiedDraft(1, accepted, p, {**noise(rng), "sink_attention": level + 0.05 * rng.normal(),
                                                         "hidden_norm": 1.0}))
        results.append(PromptResult(i, f"p{i}", None, drafts={"eagle3.1": tuple(drafts)}))
    return results


def test_a_signal_that_only_tells_the_prompt_apart_says_nothing_within_prompts():
    config = rejection.RejectionConfig(drafters=("eagle3.1",), k=1)
    report = rejection.analyse(confounded(40), config, resamples=300)
    rows = {r.signal: r for r in report.drafters["eagle3.1"].by_depth}
    sink, probability = rows["sink_attention"], rows["probability"]
    assert sink.auc_ci[0] > 0.55, sink                                   # pooled, the prompt's level shows
    assert sink.within_auc_ci[0] <= 0.5 <= sink.within_auc_ci[1], sink   # within prompts, nothing
    assert probability.within_auc_ci[0] > 0.55, probability
    # shuffled within prompts, the verdicts keep each prompt's acceptance: the band moves off 0.5 only as far
    # as the prompts' differences carry, and the probability stays above it
    low, high = probability.null_within_band
    assert high < probability.auc_ci[0], probability
    assert probability.null_band[0] <= 0.5 <= probability.null_band[1], probability
    # as results.json holds it: the controls on the probability's row only, and it reads back as written
    written = json.loads(json.dumps(report.to_json()))
    assert {"null_band", "null_within_band"} <= set(written["drafters"]["eagle3.1"]["by_depth"][0])
    assert not any("null_band" in r for r in written["drafters"]["eagle3.1"]["by_depth"][1:])
    assert json.loads(json.dumps(RejectionReport.from_json(written).to_json())) == written


STORED = rejection.Path(__file__).resolve().parents[1] / "assets" / "benchmark" / "rejection" / "results.json"


def test_the_stored_report_reads_back_and_writes_the_same_file_and_table():
    written = json.loads(STORED.read_text())
    report = RejectionReport.from_json(written)
    assert json.loads(json.dumps(report.to_json())) == written
    table = markdown(report)
    assert table == STORED.with_name("results.md").read_text()   # the table the study wrote
    assert table in (STORED.parents[3] / "docs" / "drift.md").read_text()   # and the one the docs show


def test_the_stored_reports_control_is_at_chance_and_the_probability_far_from_it():
    report = json.loads(STORED.read_text())
    for part in report["drafters"].values():
        for row in part["by_depth"]:
            if row["signal"] == "probability":   # no information at 0.5; the probability far from it
                assert row["null_band"][0] <= 0.5 <= row["null_band"][1] < row["auc_ci"][0], row


def test_the_figure_draws_each_drafters_aucs_with_their_intervals_and_the_shuffled_band():
    report = json.loads(STORED.read_text())
    fig = figure(RejectionReport.from_json(report))
    drafters = list(report["drafters"])
    for col, drafter in enumerate(drafters, start=1):
        axis = "x" if col == 1 else f"x{col}"
        traces = [t for t in fig.data if t.xaxis == axis]
        rows = report["drafters"][drafter]["by_depth"]
        for signal, title in SIGNALS.items():
            line = next(t for t in traces if t.name == title)
            mine = [r for r in rows if r["signal"] == signal]
            assert list(line.x) == [r["depth"] for r in mine] and list(line.y) == [r["auc"] for r in mine]
            tops = [y + up for y, up in zip(line.y, line.error_y.array)]
            bottoms = [y - down for y, down in zip(line.y, line.error_y.arrayminus)]
            assert np.allclose(tops, [r["auc_ci"][1] for r in mine])
            assert np.allclose(bottoms, [r["auc_ci"][0] for r in mine])
        band = next(t for t in traces if t.name == "verdicts shuffled within prompts (draft probability)")
        nulls = [r["null_within_band"] for r in rows if "null_band" in r]
        assert max(band.y) == max(hi for _, hi in nulls) and min(band.y) == min(lo for lo, _ in nulls)
    assert f"{report['prompts']} prompts" in fig.layout.title.text
