"""The running app, driven through its API with gradio_client (what scripts use)."""

import dataclasses
import html
import json
import math
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from playground.app_process import ROOT, api_client
from playground.engines.events import StepEvent
from playground.ui import render
from playground.ui.endpoints import COMPARE_OUTPUTS, RUN_OUTPUTS, SLOTS, CompareSettings, RunSettings, column

PROMPT = "Write a haiku about the sea."


def cli_text(prompt: str, max_tokens: int, drafter: str = "eagle3.1", k: int = 4) -> str:
    out = subprocess.run([sys.executable, "-m", "playground", "generate", "--prompt", prompt, "--json",
                          "--drafter", drafter, "--k", str(k), "--max-tokens", str(max_tokens)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["summary"]["text"]


@pytest.fixture(scope="module")
def client(app_url):
    return api_client(app_url)


def named(result, outputs: tuple[str, ...] = RUN_OUTPUTS) -> dict:
    """An endpoint's positional result by output name (RUN_OUTPUTS for /run, COMPARE_OUTPUTS for /compare)."""
    assert len(result) == len(outputs)
    return dict(zip(outputs, result))


def column_texts(out: dict) -> tuple[str, ...]:
    return tuple(out[column(slot, "text")] for slot in SLOTS)   # eagle3, eagle3.1, none


def exported_requests(out: dict) -> dict:
    """The request of each run in a finished run's JSON export, by run name."""
    return {name: run["request"] for name, run in json.loads(open(out["files"][0]).read()).items()}


def run_args(prompt=PROMPT, drafter="eagle3.1", k=4, temperature=0.0, top_p=1.0, max_tokens=40,
             backend="reference"):
    return (prompt, "", "model", drafter, k, temperature, top_p, max_tokens, backend)


def run_settings(**changed) -> dict:
    """/run's every control by name (RunSettings, its defaults included), a greedy EAGLE 3.1 chain on PROMPT
    but where `changed` says."""
    return dataclasses.asdict(RunSettings(**{"prompt": PROMPT, "system": "", "template": "model", "drafter": "eagle3.1", "k": 4,
                                 "temperature": 0.0, "top_p": 1.0, "max_tokens": 40, "backend_name": "reference",
                                 "draft": "chain", "tree_top_k": 4, "tree_depth": 5, "tree_nodes": 16, **changed}))


def compare_settings(**changed) -> dict:
    """/compare's every control by name (CompareSettings, its defaults included), EAGLE 3 against EAGLE 3.1
    but where `changed` says."""
    return dataclasses.asdict(CompareSettings(**{"prompt": PROMPT, "system": "", "template": "model", "k": 4, "temperature": 0.0,
                                     "top_p": 1.0, "max_tokens": 24, "with_none": True, "backend_name": "reference",
                                     "draft": "chain", "tree_top_k": 4, "tree_depth": 5, "tree_nodes": 16,
                                     "compare": "drafters", "drafter": "eagle3.1", **changed}))


def test_playground_streams_and_ends_with_the_cli_text(client):
    expected = cli_text(PROMPT, 40)
    job = client.submit(*run_args(), api_name="/run")
    updates = [named(out) for out in job]
    final = named(job.result())
    partial = [u["text"] for u in updates if u["text"] and u["text"] != final["text"]]
    assert len(partial) >= 2, "the answer should arrive in several updates"
    assert all(expected.startswith(p) for p in partial)
    assert final["text"] == expected
    assert 'class="tok tgt"' in final["answer"]
    paths = final["files"]
    assert [p.rsplit(".", 1)[-1] for p in paths] == ["json", "csv", "html"]
    exported = json.loads(open(paths[0]).read())
    assert list(exported) == ["eagle3.1", "eagle3"]   # EAGLE 3 ran beside it, for the plots
    assert [run["summary"]["text"] for run in exported.values()] == [expected, expected]
    assert exported["eagle3.1"]["steps"][0]["step"] == 0
    assert "EAGLE 3.1 " in final["cards"] and "EAGLE 3 " in final["cards"]   # the line comparing the two
    alone = named(client.predict(*run_args(), "chain", 2, 2, 4, -1, False, api_name="/run"))
    assert list(json.loads(open(alone["files"][0]).read())) == ["eagle3.1"] and alone["text"] == expected


def test_tree_mode_gives_the_chains_text_and_draws_its_tree(client):
    expected = cli_text(PROMPT, 40)   # greedy decoding: the same tokens, whichever way they were drafted
    final = named(client.predict(*run_args(), "tree", 4, 5, 16, api_name="/run"))
    assert final["text"] == expected
    # the last step's tree; it has a target token only if max_tokens left room for one (test_tree checks both)
    assert "<svg" in final["tree"] and 'class="node acc"' in final["tree"]
    for args, message in [((*run_args(), "tree", 4, 5, 0), "tree nodes must be between 1 and 64, got 0"),
                          ((*run_args(), "bush", 4, 5, 16), "draft must be 'chain' or 'tree', got 'bush'")]:
        with pytest.raises(Exception, match=message):
            client.predict(*args, api_name="/run")


def test_k_by_this_hosts_costs_runs_the_chosen_k_and_says_why(client, engine, step_costs):   # the page reads them
    from playground.engines.request import GenerationRequest
    from playground.evaluation import k_choice

    request = GenerationRequest(prompt=PROMPT, max_tokens=24)
    picked = k_choice.choice_for(engine, "eagle3.1", len(engine.prompt_ids(request)), request.max_tokens)
    final = named(client.predict(**run_settings(max_tokens=24, beside=False, k_auto=True), api_name="/run"))
    assert html.escape(f"k by this host's costs: {picked.reason}.") in final["answer"]
    assert final["text"] == cli_text(PROMPT, 24)   # greedy: the same answer at whatever k
    with pytest.raises(Exception, match="chooses a chain's k on the embedded engine"):
        client.predict(**run_settings(max_tokens=8, draft="tree", tree_top_k=2, tree_depth=2, tree_nodes=4, k_auto=True),
                       api_name="/run")


@pytest.mark.slow
def test_comparison_streams_both_drafters_side_by_side(client):
    expected = cli_text(PROMPT, 24)
    job = client.submit(PROMPT, "", "model", 4, 0.0, 1.0, 24, True, "reference", api_name="/compare")
    updates = [named(out, COMPARE_OUTPUTS) for out in job]
    final = named(job.result(), COMPARE_OUTPUTS)
    growing_together = [u for u in updates if all(column_texts(u)) and column_texts(u)[0] != column_texts(final)[0]]
    assert growing_together, "both columns should stream before either finishes"
    assert column_texts(final) == (expected, expected, expected)
    for slot in ("first", "second"):   # two drafters differ from their first draft on: no step outlined as if odd
        assert 'class="step diverged"' not in final[column(slot, "answer")]
    assert "Step by step" not in final["note"]
    table = final["table"]["data"]
    assert [row[0] for row in table] == ["EAGLE 3", "EAGLE 3.1", "no speculation"]
    assert table[2][3] == "1.00x"


@pytest.mark.slow
def test_comparison_runs_one_drafters_chain_against_its_tree(client):
    expected = cli_text(PROMPT, 24)
    final = named(client.predict(**compare_settings(with_none=False, tree_top_k=2, tree_depth=4, tree_nodes=8,
                                                    compare="chain-vs-tree", drafter="eagle3"), api_name="/compare"),
                  COMPARE_OUTPUTS)
    assert column_texts(final) == (expected, expected, "")   # greedy: one answer however drafted
    assert [row[0] for row in final["table"]["data"]] == ["EAGLE 3 · chain k=4", "EAGLE 3 · tree 2/4/8"]
    assert [final[column(slot, "heading")] for slot in SLOTS] == [
        "#### EAGLE 3 · chain k=4", "#### EAGLE 3 · tree 2/4/8", "#### not run"]
    assert 'class="tok acc"' in final["answer_second"]   # the tree column colours its accepted drafts
    with pytest.raises(Exception, match="chain vs tree needs a drafter"):
        client.predict(PROMPT, "", "model", 4, 0.0, 1.0, 8, False, "reference", "chain", 2, 4, 8,
                       "chain-vs-tree", "none", api_name="/compare")


# gradio_client callers (docker/probe.py, the memory benchmark, the vLLM tests) pass values by position:
# the order is the API's contract, and new inputs go at the end
ASKED = {"prompt": "Name a colour.", "system": "Answer in one word.", "template": "model", "temperature": 0.5,
         "top_p": 0.9, "max_tokens": 6}
TREE_SHAPE = {"top_k": 3, "depth": 2, "nodes": 5}


def api_parameters(client, endpoint: str) -> list[str]:
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    return [p["parameter_name"] for p in api[endpoint]["parameters"]]


def test_run_and_inspect_take_their_values_in_a_fixed_order(client):
    assert api_parameters(client, "/run") == ["prompt", "system", "template", "drafter", "k", "temperature", "top_p",
                                              "max_tokens", "backend_name", "draft", "tree_top_k", "tree_depth",
                                              "tree_nodes", "seed", "beside", "draft_stop", "k_auto"]
    assert api_parameters(client, "/inspect") == ["i"]
    run = named(client.predict("Name a colour.", "Answer in one word.", "model", "eagle3", 3, 0.5, 0.9, 6,
                               "reference", "tree", 3, 2, 5, api_name="/run"))
    request = exported_requests(run)["eagle3"]
    assert request.items() >= {**ASKED, "drafter": "eagle3", "k": 3, "tree": TREE_SHAPE}.items()
    assert "step 1 ·" in client.predict(1, api_name="/inspect")   # a step of the run this session just made


def test_compare_takes_its_values_in_a_fixed_order(client):
    assert api_parameters(client, "/compare") == ["prompt", "system", "template", "k", "temperature", "top_p",
                                                  "max_tokens", "with_none", "backend_name", "draft", "tree_top_k",
                                                  "tree_depth", "tree_nodes", "compare", "drafter", "seed",
                                                  "first", "second", "baseline", "draft_stop"]
    drafters = named(client.predict("Name a colour.", "Answer in one word.", "model", 3, 0.5, 0.9, 6, False,
                                    "reference", "tree", 3, 2, 5, "drafters", "eagle3", api_name="/compare"),
                     COMPARE_OUTPUTS)
    requests = exported_requests(drafters)
    assert {name: (r["drafter"], r["tree"]) for name, r in requests.items()} == {
        "eagle3": ("eagle3", TREE_SHAPE), "eagle3.1": ("eagle3.1", TREE_SHAPE)}   # no run without speculation
    assert all(r.items() >= {**ASKED, "k": 3}.items() for r in requests.values())
    chain_vs_tree = named(client.predict("Name a colour.", "Answer in one word.", "model", 3, 0.5, 0.9, 6, True,
                                         "reference", "chain", 3, 2, 5, "chain-vs-tree", "eagle3",
                                         api_name="/compare"), COMPARE_OUTPUTS)
    assert [chain_vs_tree[column(slot, "heading")] for slot in SLOTS] == [
        "#### EAGLE 3 · chain k=3", "#### EAGLE 3 · tree 3/2/5", "#### no speculation"]
    settings = ("Name a colour.", "Answer in one word.", "model", 3, 0.5, 0.9, 6, True, "reference", "chain", 3, 2, 5,
                "chain-vs-stop", "eagle3", 0, "", "", "")
    against_rule = named(client.predict(*settings, "probability<0.5", api_name="/compare"), COMPARE_OUTPUTS)
    assert [against_rule[column(slot, "heading")] for slot in SLOTS] == [
        "#### EAGLE 3 · chain k=3", "#### EAGLE 3 · chain k<=3 until probability<0.5", "#### no speculation"]
    assert [r["draft_stop"] for r in exported_requests(against_rule).values()] == [None, "probability<0.5", None]
    with pytest.raises(Exception, match="fixed k vs a stop rule needs a rule"):
        client.predict(*settings, " ", api_name="/compare")
    with pytest.raises(Exception, match="unknown signal 'entropy'"):
        client.predict(*settings, "entropy>1", api_name="/compare")


def test_compare_runs_the_two_drafters_it_names_in_its_order(client):
    """Named runs (the trailing first, second and baseline): EAGLE 3.1 first, and no speculation
    against EAGLE 3 with no baseline column."""
    common = ("Name a colour.", "Answer in one word.", "model", 3, 0, 1, 6)
    named_pair = named(client.predict(*common, True, "reference", "chain", 3, 2, 5, "drafters", "eagle3", 0,
                                      "eagle3.1", "eagle3", "", api_name="/compare"), COMPARE_OUTPUTS)
    assert [named_pair[column(slot, "heading")] for slot in SLOTS] == [
        "#### EAGLE 3.1", "#### EAGLE 3", "#### no speculation"]
    assert [row[0] for row in named_pair["table"]["data"]] == ["EAGLE 3.1", "EAGLE 3", "no speculation"]
    against_none = named(client.predict(*common, False, "reference", "chain", 3, 2, 5, "drafters", "eagle3", 0,
                                        "none", "eagle3", "", api_name="/compare"), COMPARE_OUTPUTS)
    assert [against_none[column(slot, "heading")] for slot in SLOTS] == [
        "#### no speculation", "#### EAGLE 3", "#### not run"]
    assert against_none[column("first", "text")] == against_none[column("second", "text")]   # greedy: lossless


@pytest.mark.parametrize("names, message", [
    (("eagle3", "eagle3", ""), "the first and second runs are both 'eagle3'"),
    (("k3", "eagle3", ""), "unknown first run 'k3'; this backend runs eagle3, eagle3.1, none"),
    (("eagle3", "/etc", ""), "unknown second run '/etc'"),
    (("eagle3", "eagle3.1", "eagle3"), "the baseline 'eagle3' is already a column"),
    (("eagle3", "eagle3.1", "plain"), "unknown baseline 'plain'"),
])
def test_compare_refuses_names_it_cannot_run(client, names, message):
    with pytest.raises(Exception, match=message):
        client.predict("Name a colour.", "", "model", 3, 0, 1, 6, True, "reference", "chain", 3, 2, 5, "drafters",
                       "eagle3", 0, *names, api_name="/compare")


def test_a_seed_repeats_a_sampled_run_and_minus_one_draws_a_new_one(client):
    sampled = lambda seed: named(client.predict(*run_args(prompt="Tell me a story.", temperature=1.0, max_tokens=24),
                                                "chain", 2, 4, 8, seed, api_name="/run"))
    first, again = sampled(1234), sampled(1234)
    assert first["text"] == again["text"] and exported_requests(first)["eagle3.1"]["seed"] == 1234
    assert "Sampled with seed 1234." in first["answer"]
    drawn = [exported_requests(sampled(-1))["eagle3.1"]["seed"] for _ in range(2)]
    assert all(0 <= seed < 2**31 for seed in drawn) and drawn[0] != drawn[1]


@pytest.mark.parametrize("args, message", [
    (run_args(prompt="   "), "prompt is empty"),
    (run_args(prompt="x" * 25_000), "characters"),
    (run_args(prompt="x" * 100_000), "100,000 characters"),
    (run_args(k=11), "k must be between 1 and 10, got 11"),
    (run_args(temperature=9), "temperature must be between 0 and 5"),
    (run_args(top_p=0), r"top-p must be in \(0, 1\]"),
    (run_args(max_tokens=5000), "max tokens is limited to 512, got 5000"),
    (run_args(k=2.5), "k must be a whole number, got 2.5"),
    (run_args(drafter="/etc"), "unknown drafter '/etc'"),   # no path reaches the loader
    (run_args(backend="nope"), "unknown backend 'nope'"),
    ((*run_args(), "chain", 2, 4, 8, -2), "the seed must be between -1"),
])
def test_bad_input_gets_a_clear_message(client, args, message):
    with pytest.raises(Exception, match=message):
        client.predict(*args, api_name="/run")


def test_prompt_past_the_context_is_refused(client):
    with pytest.raises(Exception, match="context holds"):
        client.predict(*run_args(prompt="0123456789" * 900), api_name="/run")   # one token per digit


@pytest.mark.parametrize("prompt", [
    "\x00\x07 bell \x1b[31m red \x7f del \u200b zero-width",   # control characters
    "ما هي عاصمة فرنسا؟ שלום",                                     # right-to-left scripts
    "Tell me about 🐍 and 🦀 🧑‍💻",                                 # emoji, a ZWJ sequence
])
def test_odd_prompts_stream_an_answer(client, prompt):
    out = named(client.predict(*run_args(prompt=prompt, max_tokens=8), api_name="/run"))
    assert out["text"] and 'class="finish"' in out["answer"]


# Values JSON carries that no control of the page sends: NaN as Python's json writes it, a lone UTF-16 surrogate,
# an integer of 401 digits.
ODD_VALUES = {"null": None, "list": [1], "object": {"a": 1}, "surrogate": "\ud800", "huge": 10**400,
              "nan": math.nan, "text": "x"}


def joined(url: str, fn_index: int, data: list) -> tuple[int, str]:
    """Raw HTTP as any API caller may send it: the status of queue/join and the message the call ends with
    ("" when it succeeds)."""
    session = uuid.uuid4().hex[:10]
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session}, allow_nan=True)
    joined = httpx.post(f"{url}/gradio_api/queue/join", content=body, timeout=30,
                        headers={"content-type": "application/json"})
    if joined.status_code == 422:   # the validator: one message at the control at fault
        return 422, next(d["message"] for d in joined.json()["detail"] if not d["is_valid"])
    if joined.status_code != 200:
        return joined.status_code, joined.text
    with httpx.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}, timeout=60) as events:
        for line in events.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("msg") == "process_completed":
                return 200, "" if message["success"] else (message.get("output") or {}).get("error") or "no message"
    return 200, "the stream ended without an answer"


@pytest.mark.parametrize("api_name, valid", [
    ("/run", ["Hi", "", "model", "eagle3.1", 2, 0.0, 1.0, 1, "reference", "chain", 2, 2, 4, -1, True, "", False]),
    ("/compare", ["Hi", "", "model", 2, 0.0, 1.0, 1, False, "reference", "chain", 2, 2, 4, "drafters", "eagle3.1",
                  -1, "", "", "", ""]),
    ("/study", [None, "Hi", "reference", ["eagle3"], 2, "chain", 1, 0]),
])
def test_any_value_in_any_field_gets_an_answer_or_one_line_message(client, app_url, api_name, valid):
    """No bare HTTP 400 and no Python internals: every value is run or refused in one line. The file of /study is
    left out: Gradio itself refuses a file that is not its FileData, naming the field it needs."""
    fn_index = client._infer_fn_index(api_name, None)
    assert joined(app_url, fn_index, valid) == (200, "")
    fields = range(1, len(valid)) if api_name == "/study" else range(len(valid))
    if api_name == "/compare":   # the fields it shares with /run go through the same checks: the prompt will do
        shared = {f.name for f in dataclasses.fields(RunSettings)}
        fields = [i for i, f in enumerate(dataclasses.fields(CompareSettings)) if i == 0 or f.name not in shared]
    refused = {}
    for i, value in ((i, v) for i in fields for v in ODD_VALUES.values()):
        status, message = joined(app_url, fn_index, [*valid[:i], value, *valid[i + 1:]])
        assert status in (200, 422) and "\n" not in message and "Error" not in message, (i, value, status, message)
        refused[i, repr(value)[:12]] = message
    print(api_name, sum(bool(m) for m in refused.values()), "of", len(refused), "refused")
    text_field = "the pasted prompts" if api_name == "/study" else "the prompt"
    assert refused[1 if api_name == "/study" else 0, repr("\ud800")] == (
        f"{text_field} holds a character that is not valid Unicode (a lone surrogate at character 0)")


@pytest.mark.slow
def test_sixteen_clients_at_once_all_finish(app_url):
    expected = cli_text(PROMPT, 8)
    results, errors = [], []

    def one():
        try:
            results.append(named(api_client(app_url).predict(*run_args(max_tokens=8), api_name="/run"))["text"])
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors
    assert results == [expected] * 16


def test_tokens_are_shown_as_text_never_markup():
    hostile = ("<script>alert(1)</script>", " **bold**", "<b>x</b>", "&amp;", "\n")
    event = StepEvent(step=1, position=10, token_ids=(1, 2, 3, 4, 5), token_texts=hostile,
                      draft_ids=(1, 2, 9), draft_texts=("<script>alert(1)</script>", " **bold**", "<img src=x>"),
                      drafted=3, accepted=2)
    html = render.answer_html([event])
    assert "<script" not in html and "<b>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&amp;amp;" in html
    assert '<span class="rej-text">&lt;img·src=x&gt;</span>' in html   # shown on hover, as text
    assert "<script" not in render.inspector_html(event)


def test_plots_name_each_drafter_once_and_hover_names_the_trace():
    from playground import plots
    from playground.engines.stats import summarize

    events = [StepEvent(step=0, position=10, token_ids=(1,), token_texts=("a",)),
              StepEvent(step=1, position=11, token_ids=(2, 3), token_texts=("b", "c"), draft_ids=(2, 7),
                        draft_texts=("b", "x"), drafted=2, accepted=1,
                        sink_attention=(0.1, 0.2), self_attention=(0.0, 0.3), hidden_norm=(1.0, 2.0))]
    plots = plots.all_figures({"eagle3": summarize(events), "eagle3.1": summarize(events)})
    for fig in plots:
        assert [t.name for t in fig.data if t.showlegend is not False] == ["EAGLE 3", "EAGLE 3.1"]
    acceptance, attention, _ = plots
    hovers = [t.hovertemplate.split("<br>")[0] for t in acceptance.data + attention.data]
    assert hovers == ["EAGLE 3 · accepted ≥ d drafts", "EAGLE 3 · given depth d-1 accepted",
                      "EAGLE 3.1 · accepted ≥ d drafts", "EAGLE 3.1 · given depth d-1 accepted",
                      "EAGLE 3 · sink tokens", "EAGLE 3 · own drafts", "EAGLE 3 · rest of the context",
                      "EAGLE 3.1 · sink tokens", "EAGLE 3.1 · own drafts", "EAGLE 3.1 · rest of the context"]


def test_a_mean_over_no_steps_is_a_gap_in_its_plot_not_a_zero():
    from playground import plots
    from playground.engines.stats import summarize

    step = lambda i, accepted: StepEvent(step=i, position=10 + i, token_ids=(1,) * (accepted + 1),
                                         token_texts=("a",) * (accepted + 1), draft_ids=(1, 1, 1), drafted=3,
                                         accepted=accepted, hidden_norm=(1.0, 2.0, 3.0))
    summary = summarize([StepEvent(step=0, position=9, token_ids=(1,), token_texts=("a",)),
                         step(1, 0), step(2, 1), step(3, 0)])
    assert summary.conditional_acceptance_steps == (3, 1, 0)
    dashed = plots.acceptance({"eagle3": summary}).data[1]
    assert list(dashed.y) == [summary.per_position_acceptance_conditional[0], 0.0, None]   # 0 of 1, then none


def test_the_first_screen_is_a_stored_run_of_the_prefilled_example_that_a_live_run_repeats(engine, app_url):
    from playground.ui import first_screen

    stored = first_screen.load()
    assert stored is not None, "assets/first_screen.json is missing or no longer matches the page's defaults"
    runs, source = stored
    assert list(runs) == ["eagle3.1", "eagle3"] and "recorded on" in source
    for name, run in runs.items():   # lossless: the stored answer is the target's, whichever drafter drafted
        assert run.summary.token_ids == summarize_live(engine, first_screen.example_request(name))
    page = httpx.get(app_url, timeout=30).text
    assert "A stored run of this example" in page and "Tokens per target pass on this prompt" in page


def summarize_live(engine, request) -> tuple[int, ...]:
    from playground.engines.stats import summarize

    return summarize(list(engine.generate(request))).token_ids


def test_container_health_check_sees_the_page_and_a_dead_port(app_url, dead_port, tmp_path):
    def health(port, **env) -> int:
        return subprocess.run([sys.executable, "-m", "playground.healthcheck"], cwd=ROOT, capture_output=True,
                              env={"PATH": "/usr/bin:/bin", "PLAYGROUND_PORT": str(port), **env}).returncode

    assert health(app_url.rsplit(":", 1)[1]) == 0
    assert health(dead_port) == 1
    assert health(dead_port, PLAYGROUND_PORT="", GRADIO_SERVER_PORT=app_url.rsplit(":", 1)[1]) == 0
    # the GPU image's setting: launched vLLM servers must answer too (none runs here)
    assert health(app_url.rsplit(":", 1)[1], PLAYGROUND_BACKEND="vllm", PLAYGROUND_VLLM_LAUNCH="1",
                  TMPDIR=str(tmp_path)) == 1


def test_stored_benchmark_and_rejection_study_are_offered_on_the_comparison_tab(app_url):
    import urllib.request

    from playground.ui.compare_tab import STORED_BENCHMARK

    assert STORED_BENCHMARK.exists(), "the repository ships the stored benchmark's table"
    row = next(line for line in STORED_BENCHMARK.read_text().splitlines() if line.startswith("| chat |"))
    page = json.loads(urllib.request.urlopen(app_url + "/config").read())
    shown = [str(c.get("props", {}).get("value")) for c in page["components"]]
    assert any(row in value for value in shown), "the stored benchmark's rows are on the Comparison tab"
    plot = next(c for c in page["components"] if c.get("props", {}).get("elem_id") == "rejection-plot")
    assert "What predicts a rejection" in json.dumps(plot["props"]["value"]), "the rejection study is drawn there"


def wait_for(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not true after {timeout_s} s"
        time.sleep(0.01)


def test_backend_that_is_still_starting_answers_with_its_status_then_runs(engine):
    from playground.engines.request import GenerationRequest
    from playground.engines.vllm.backend import StartingBackend
    from playground.errors import PlaygroundError

    release = threading.Event()

    def start(status):
        status("vLLM for eagle3.1 is loading")
        release.wait(30)
        return engine

    starting = StartingBackend(start, ("eagle3.1",))
    request = GenerationRequest(prompt="Hi", max_tokens=4)
    wait_for(lambda: "loading" in starting.lines[-1])
    with pytest.raises(PlaygroundError, match="still starting.*eagle3.1 is loading"):
        starting.generate(request)
    release.set()
    wait_for(lambda: starting.engine is not None)
    assert [t for e in starting.generate(request) for t in e.token_ids]

    def fail(status):
        raise PlaygroundError("the vLLM server for eagle3 exited with code 1")

    failed = StartingBackend(fail, ("eagle3",))
    wait_for(lambda: failed.error is not None)
    with pytest.raises(PlaygroundError, match="failed to start: the vLLM server for eagle3 exited"):
        failed.drafter_info("eagle3")


def test_exports_older_than_their_keep_time_are_removed(tmp_path):
    import os

    from playground.engines.request import GenerationRequest
    from playground.ui.runs import RunLog, export

    runs = {"none": RunLog(GenerationRequest(prompt="hi", drafter="none"))}
    old = export(runs, root=tmp_path, keep_s=60)
    os.utime(os.path.dirname(old[0]), (1, 1))   # as if written long ago
    new = export(runs, root=tmp_path, keep_s=60)
    assert not os.path.exists(old[0]) and all(os.path.exists(p) for p in new)
    assert len(list(tmp_path.iterdir())) == 1


@pytest.mark.slow
def test_streamed_runs_do_not_pile_up_components_in_the_session(engine):
    """Gradio keeps a new component in the session for every gr.skip() or prop update; the page
    sends values instead, so a run adds at most one (the step slider's new range)."""
    from playground.local_server import pick_port
    from playground.ui.app import create_ui, launch

    demo = create_ui({"reference": engine})
    port = pick_port()
    launch(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        client = api_client(f"http://127.0.0.1:{port}/")
        sizes = []
        for drafter in ("eagle3.1", "eagle3", "none", "eagle3.1"):
            client.predict(*run_args(drafter=drafter, max_tokens=24), api_name="/run")
            session = next(iter(demo.state_holder.session_data.values()))
            sizes.append(len(session.blocks_config.blocks))
        assert sizes[-1] - sizes[0] <= len(sizes) - 1, sizes
    finally:
        demo.close()


def test_the_address_comes_from_flags_then_playground_then_gradio_variables(monkeypatch):
    import app

    for name in ("PLAYGROUND_HOST", "PLAYGROUND_PORT", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    address = lambda *argv: (lambda a: (a.host, a.port))(app.parse_args(list(argv)))
    assert address() == ("0.0.0.0", 7860)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "127.0.0.1")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7000")
    assert address() == ("127.0.0.1", 7000)
    monkeypatch.setenv("PLAYGROUND_PORT", "7100")
    assert address() == ("127.0.0.1", 7100)
    assert address("--host", "::1", "--port", "7200") == ("::1", 7200)
    monkeypatch.setenv("PLAYGROUND_PORT", "seventy")
    with pytest.raises(SystemExit):
        address()


def test_a_page_run_ends_with_its_runs_after_stop_and_past_a_run_beside_that_failed_alone(engine):
    """streams.follow, the Playground's and the Comparison's run loop, on the real engine's streams."""
    from playground.engines.request import GenerationRequest
    from playground.errors import PlaygroundError
    from playground.ui.playground_tab import beside_events
    from playground.ui.runs import RunLog
    from playground.ui.streams import STOPPED, follow

    class DiesMidAnswer:   # the real engine, whose stream breaks off after two steps as a dying server's does
        def generate(self, request):
            for step, event in enumerate(engine.generate(request)):
                if step == 2:
                    raise PlaygroundError("the vLLM server at http://127.0.0.1:1 closed the connection mid-stream")
                yield event

    requests = {name: GenerationRequest(prompt=PROMPT, drafter=name, max_tokens=24) for name in ("eagle3.1", "eagle3")}

    def run(streams: dict, stop_at_events: int | None = None):
        logs = {name: RunLog(requests[name]) for name in streams}
        stop = lambda: stop_at_events is not None and sum(len(log.events) for log in logs.values()) >= stop_at_events
        return logs, list(follow(streams, logs, stop))

    logs, frames = run({name: engine.generate(r) for name, r in requests.items()})
    assert frames[-1].final and frames[-1].redraw and not any(f.final for f in frames[:-1])
    assert all(log.finished and log.events[-1].finish_reason != STOPPED for log in logs.values())

    failed = {}
    logs, frames = run({"eagle3.1": engine.generate(requests["eagle3.1"]),
                        "eagle3": beside_events(DiesMidAnswer(), requests["eagle3"], failed)})
    assert frames[-1].final and logs["eagle3.1"].finished and len(logs["eagle3"].events) == 2
    assert "closed the connection mid-stream" in failed["eagle3"]

    logs, frames = run({name: engine.generate(r) for name, r in requests.items()}, stop_at_events=3)
    assert frames[-1].final and sum(len(log.events) for log in logs.values()) == 3
    assert [log.events[-1].finish_reason for log in logs.values()] == [STOPPED, STOPPED]

    with pytest.raises(PlaygroundError, match="mid-stream"):   # a run that fails on its own ends the page's run
        run({"eagle3": DiesMidAnswer().generate(requests["eagle3"])})

    # a page that never catches up gets the last frame alone, and its runs go on to their ends
    logs = {name: RunLog(r) for name, r in requests.items()}
    frames = list(follow({name: engine.generate(r) for name, r in requests.items()}, logs, lambda: False,
                         page_behind=lambda: True))
    assert frames == [frames[-1]] and frames[-1].final and all(log.finished for log in logs.values())


def test_a_page_that_draws_behind_gets_no_updates_until_it_has_drawn_those_sent():
    """frames.DrawnFrames: an update unseen for MAX_LAG_S holds back the next ones, a page that tells what it drew
    catches up, and a consumer that never tells (an API client) is never held back."""
    from playground.ui.frames import DrawnFrames

    now = [0.0]
    frames = DrawnFrames(max_lag_s=1.0, clock=lambda: now[0])
    with frames.event() as api, frames.event() as page:
        assert api.run != page.run
        for _ in range(3):
            frames.send(api), frames.send(page)
        now[0] = 5.0
        assert not frames.behind(api) and not frames.behind(page)   # neither has told anything yet
        frames.tell(page.run, 1)
        assert frames.behind(page) and not frames.behind(api)       # updates 2 and 3 unseen for 5 s
        frames.tell(page.run, 3)
        assert not frames.behind(page)
        assert frames.send(page) == 4
        now[0] = 5.9
        assert not frames.behind(page)
        now[0] = 6.0
        assert frames.behind(page)
        frames.tell("0" * 32, 9)   # another event's id, or one that never was
        assert frames.behind(page)
    frames.tell(page.run, 4)   # after its event ended: nothing kept, nothing raised
    assert frames._events == {}


def test_the_page_tells_what_it_drew_and_a_bad_telling_gets_a_clear_refusal(app_url):
    from playground.ui.frames import DRAWN_PATH

    url = app_url.rstrip("/") + DRAWN_PATH
    assert httpx.post(url, json={"run": "0" * 32, "frame": 3}).status_code == 204   # an event that has ended
    for body in (b"not json", b'{"run": 1, "frame": 2}', b'{"run": "a", "frame": "2"}', b'{"run": "a"}',
                 b'{"run": "a", "frame": true}', b"[]", b"x" * 10_000):
        answer = httpx.post(url, content=body)
        assert answer.status_code == 400 and "Traceback" not in answer.text, body[:40]
    assert httpx.get(url).status_code == 405


@pytest.mark.slow
def test_a_run_beside_another_visitors_study_says_its_speeds_are_shared(client, app_url):
    """A study runs in its own queue, beside the Playground's: the run that overlapped it says so beside
    its speeds, and the study's last line says so too; a run alone says nothing of the kind."""
    from playground.app_process import api_client
    from playground.ui.streams import SHARED_NOTE

    pasted = "\n".join(f"Describe the colour number {i} of a rainbow in two sentences." for i in range(8))
    study = api_client(app_url).submit(None, pasted, "reference", ["eagle3"], 5, "chain", 48, 0, api_name="/study")
    deadline = time.monotonic() + 120
    while not study.outputs() and time.monotonic() < deadline:   # its first update: the study has begun
        time.sleep(0.1)
    assert study.outputs(), "the study did not start"
    shared = named(client.predict(*run_args(max_tokens=24), api_name="/run"))
    assert html.escape(SHARED_NOTE) in shared["answer"]
    assert html.escape("another visitor's job shared the CPU") in study.result()[0]
    alone = named(client.predict(*run_args(max_tokens=8), api_name="/run"))
    assert html.escape(SHARED_NOTE) not in alone["answer"]


def test_a_page_job_learns_whether_another_ran_beside_it_at_any_moment_and_the_last_one_frees_memory():
    from playground.ui.streams import SharedCpu

    idle = []
    cpu = SharedCpu(on_idle=lambda: idle.append(True))
    with cpu.job() as alone:
        pass
    assert not alone() and len(idle) == 1
    with cpu.job() as first:
        assert not first()
        with cpu.job() as second:
            assert second()
        assert first() and second()   # the first learns of the second, which has ended since
        assert len(idle) == 1         # the page is idle only when its last job ends
    assert len(idle) == 2
    with cpu.job() as later:
        assert not later()
