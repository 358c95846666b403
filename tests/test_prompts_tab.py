"""The Your prompts tab through the page's API: a prompt file's report as the engine measures it, and every
unreadable file a one-line message after which the page keeps serving."""

import json
import time
from urllib.parse import urlsplit

import httpx
import pytest
from gradio_client import handle_file

from playground.app_process import ROOT, api_client
from playground.evaluation.prompt_study import StudyConfig, measure
from playground.prompts.files import read_prompts
from playground.prompts.sets import ASSETS
from playground.ui.endpoints import STUDY_OUTPUTS

SHAREGPT = ASSETS / "prompts" / "sharegpt.json"


@pytest.fixture(scope="module")
def client(app_url):
    return api_client(app_url)


def study(client, file=None, pasted="", drafters=("eagle3", "eagle3.1"), k=5, draft="chain", max_tokens=8, sample=0):
    out = client.predict(handle_file(str(file)) if file else None, pasted, "reference", list(drafters), k, draft,
                         max_tokens, sample, api_name="/study")
    assert len(out) == len(STUDY_OUTPUTS)
    return dict(zip(STUDY_OUTPUTS, out))


def test_a_sample_of_a_file_reports_what_the_engine_measures(client, engine):
    out = study(client, SHAREGPT, sample=3)
    assert "aria-valuenow='3'" in out["progress"] and "finished" in out["progress"]
    assert out["report"].startswith("sharegpt.json (sharegpt): 3 of 3 prompts measured")
    assert [row[1] for row in out["table"]["data"]] == ["sg-1", "sg-4", "sg-6"]   # seed 0's sample, in file order
    assert all(out[name]["type"] == "plotly" for name in STUDY_OUTPUTS if name.endswith("_plot"))
    files = {path.rsplit("/", 1)[1]: path for path in out["files"]}
    assert set(files) == {"results.json", "results.md", "prompts.csv", "charts.html"}
    res = json.loads(open(files["results.json"]).read())
    prompts = read_prompts(SHAREGPT.read_bytes(), sample=3)
    expected = [u.result for u in measure(engine, prompts, StudyConfig(max_tokens=8)) if u.result]
    assert [[p["runs"][d]["mean_acceptance_length"] for d in ("eagle3", "eagle3.1")] for p in res["prompts"]] == [
        [r.runs[d].tau for d in ("eagle3", "eagle3.1")] for r in expected]


def test_pasted_prompts_run_with_trees_and_no_speculation(client):
    out = study(client, pasted="Name three colours.\n\nWhat is 2 + 2?", drafters=("eagle3.1", "none"), draft="tree",
                max_tokens=6)
    assert out["table"]["headers"][4:7] == ["EAGLE 3.1 tokens/pass", "no speculation tokens/pass",
                                             "EAGLE 3.1 · tree 2/4/8 tokens/pass"]
    assert "pasted prompts (text): 2 of 2 prompts measured" in out["report"] and "vs none" in out["report"]


@pytest.mark.parametrize("content, kwargs, message", [
    (None, {}, "upload a prompt file or paste prompts"),
    (b'{"prompt": "ok"}\n{"prompt": 3}\n', {}, "line 2: prompt is not text"),
    (b'{"prompt": "ok"}\n{oops\n', {}, "line 2: not JSON"),
    (b"", {}, "the file is empty"),
    ("caf\xe9".encode("latin-1"), {}, "not UTF-8"),
    (b'[{"text": "no prompt here"}]', {}, "record 1: no prompt"),
    (b"x" * 30_000, {}, "the limit is 20,000"),
    ("\n\n".join(f"p{i}" for i in range(201)).encode(), {}, "the file has more than 200 prompts; the limit is 200"),
    (b"x\n\n" * (19 * 2**20 // 3), {}, "the file has more than 200 prompts; the limit is 200"),
    (b"[" * 10_000 + b"]" * 10_000, {}, "record 1: JSON nested too deeply"),
    (b"prompt\n" + b"x" * 5_000_000, {}, "row 2: a cell holds more than 131,072 characters"),
    (b'{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', {}, "the id '1' names two prompts"),
    (b"Hi", {"drafters": ()}, "pick at least one drafter"),
    (b"Hi", {"k": 11}, "k must be between 1 and 10"),
    (b"Hi", {"max_tokens": 5000}, "max tokens is limited to 512"),
    (b"Hi", {"sample": 2.5}, "sample must be a whole number"),
    (b"Hi", {"sample": -1}, "sample must be 0 \\(every prompt\\) to 200 prompts, got -1"),
    (b"Hi", {"sample": 1e300}, "sample must be 0 \\(every prompt\\) to 200 prompts, got 1e\\+300"),
])
def test_an_unreadable_file_is_one_message_and_the_page_keeps_serving(client, tmp_path, content, kwargs, message):
    path = None
    if content is not None:
        path = tmp_path / "mine.txt"
        path.write_bytes(content)
    with pytest.raises(Exception, match=message):
        study(client, path, **kwargs)
    assert "finished" in study(client, pasted="Hi", drafters=("eagle3",), max_tokens=2)["progress"]


def test_a_paste_over_the_size_limit_is_refused_before_it_is_queued(client):
    started = time.monotonic()
    with pytest.raises(Exception, match="the pasted text is 47.7 MiB; the limit is 20 MiB"):
        study(client, pasted="x" * 50_000_000)
    assert time.monotonic() - started < 10


def test_an_upload_over_the_size_limit_is_refused_by_the_server(app_url):
    answer = httpx.post(f"{app_url}/gradio_api/upload", files={"files": ("big.txt", b"x" * (20 * 2**20 + 1))})
    assert answer.status_code == 413 and "maximum allowed size of 20971520 bytes" in answer.text


@pytest.mark.parametrize("args, message", [
    ((["reference"], ["eagle3"], 5), "backend must be one of the names offered, got a list"),
    (("reference", "eagle3", 5), "drafters must be a list of drafter names"),
    (("reference", [["eagle3"]], 5), "drafters must be a list of drafter names"),
    (("reference", ["eagle3"], [5]), "k must be a number"),
])
def test_settings_of_the_wrong_type_are_one_message(client, args, message):
    backend_name, drafters, k = args
    with pytest.raises(Exception, match=message):
        client.predict(None, "Hi", backend_name, drafters, k, "chain", 2, 0, api_name="/study")


def test_a_study_refused_once_queued_logs_one_line(client, app_url, tmp_path):
    log = ROOT / ".cache" / "app-logs" / f"app-{urlsplit(app_url).port}.log"   # where AppServer writes it
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 10_000 + b"]" * 10_000)
    before = log.stat().st_size
    with pytest.raises(Exception, match="record 1: JSON nested too deeply"):
        study(client, path)
    time.sleep(0.5)   # for the app to write its line
    with open(log) as f:
        f.seek(before)
        written = f.read()
    assert written == "refused: record 1: JSON nested too deeply\n", written


def test_the_playground_is_served_while_a_study_runs(client, app_url):
    from playground.app_process import api_client as new_client

    job = client.submit(None, "\n\n".join(f"Tell me about the number {i}." for i in range(6)), "reference",
                        ["eagle3", "eagle3.1"], 5, "chain", 48, 0, api_name="/study")
    while not job.outputs():   # the study has started
        time.sleep(0.2)
    run = new_client(app_url).predict("Say hi.", "", "model", "eagle3.1", 5, 0.0, 1.0, 8, "reference", api_name="/run")
    assert run[1].strip() and not job.done(), "the run waited for the whole study"
    assert "finished" in dict(zip(STUDY_OUTPUTS, job.result()))["progress"]
