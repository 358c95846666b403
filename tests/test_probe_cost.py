"""The flood table's paired comparison (`bench probe`): rounds pair lanes, so the round-to-round noise
that both lanes share cancels out of the change and its interval."""

from playground.evaluation.probe_cost import _change


def test_a_lane_paired_with_quiet_by_round_shows_its_cost_through_the_rounds_noise():
    quiet = [40.0, 80.0, 55.0, 70.0, 45.0, 65.0]
    rates = {"quiet": quiet, "flood": [0.9 * q for q in quiet], "same": list(quiet)}
    change = _change(rates, "flood", "quiet", "quiet")
    assert change["change_vs_quiet"] == -0.1
    assert change["change_vs_quiet_ci"] == [-0.1, -0.1]   # the rounds' noise is shared: none is left
    unpaired = _change({"quiet": quiet, "flood": [0.9 * q for q in quiet[::-1]]}, "flood", "quiet", "quiet")
    assert unpaired["change_vs_quiet_ci"][1] - unpaired["change_vs_quiet_ci"][0] > 0.2   # noise not shared
    assert _change(rates, "same", "quiet", "quiet")["change_vs_quiet"] == 0.0
    assert _change(rates, "quiet", "quiet", "quiet") == {}
