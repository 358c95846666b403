"""The explainer says what the paper says and what the stored benchmark measured, in that direction."""

import json

from playground.ui.explainer import STORED_RESULTS, explainer_markdown, stored_probes


def test_the_explainers_drift_statement_matches_the_stored_benchmark():
    results = json.loads(STORED_RESULTS.read_text())
    old, new = stored_probes(results)["eagle3"], stored_probes(results)["eagle3.1"]
    # what the explainer states: EAGLE 3's attention moves away from the sink tokens with depth while
    # its fed-back state grows; EAGLE 3.1's drifts far less and its state keeps one scale
    assert old.sink_last < old.sink_first
    assert old.sink_last / old.sink_first < new.sink_last / new.sink_first
    assert old.rms_last / old.rms_first > 1.5 > new.rms_last / new.rms_first
    text = explainer_markdown()
    assert "the drafter's attention moves *away* from the sink tokens and *onto its own drafts*" in text
    assert f"sink tokens falls from {old.sink_first:.3f} at depth 1 to {old.sink_last:.3f} at depth 5" in text
    assert f"grows from RMS {old.rms_first:.1f} to {old.rms_last:.1f}" in text
    assert "rising sink attention" not in text and "$measured" not in text


def test_without_a_stored_benchmark_the_explainer_says_how_to_measure(tmp_path):
    text = explainer_markdown(tmp_path / "results.json")
    assert "Run `python -m playground bench` to measure it on this machine." in text and "$" not in text
