"""vLLM servers under any names: what --vllm-url and --vllm-drafter accept, the `vllm serve` command
each launch entry becomes, and how a server's drafter is told apart (EAGLE 3, EAGLE 3.1, n-gram).
tests/test_vllm.py runs such servers for real."""

import json
import os

import pytest

from playground.engines.vllm.backend import LaunchSpec, launch_entries, parse_launch_entry, parse_urls, planned_names
from playground.engines.vllm import cpu_binding
from playground.engines.vllm.cpu_binding import BIND_VARIABLE, launch_binds, physical_cores, server_binds
from playground.engines.vllm.introspect import ServerInfo, drafter_switches
from playground.engines.vllm.launch import LaunchConfig, ServerSpec, server_command
from playground.errors import PlaygroundError
from playground.model.drafter import DrafterConfig
from playground.model.variants import bad_name, shipped_path


def speculative_config(entry: str) -> dict | None:
    """The --speculative-config the launcher gives the server of `entry`."""
    name, spec = parse_launch_entry(entry, k=5)
    cmd = server_command(LaunchConfig(target="/models/t", servers={name: spec}), name, 8000)
    if "--speculative-config" not in cmd:
        return None
    assert cmd[cmd.index("--speculative-config") + 2:][:2] == ["--per-request-spec-decode-metrics", "detailed"]
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


def test_each_launch_entry_becomes_its_speculative_config():
    assert speculative_config("k3=/drafters/a:k=3") == {"method": "eagle3", "model": "/drafters/a",
                                                        "num_speculative_tokens": 3}
    assert speculative_config("big=org/drafter") == {"method": "eagle3", "model": "org/drafter",
                                                     "num_speculative_tokens": 5}
    assert speculative_config("lookup=ngram:k=4:lookup=2-6") == {"method": "ngram", "num_speculative_tokens": 4,
                                                                 "prompt_lookup_min": 2, "prompt_lookup_max": 6}
    assert speculative_config("ng=ngram") == {"method": "ngram", "num_speculative_tokens": 5}
    assert speculative_config("plain=none") is None


def test_a_speculative_config_in_the_server_arguments_adds_keys_to_each_servers_own():
    """vLLM takes the last --speculative-config whole: given as an argument of its own, it would drop the
    drafter; the launcher merges its keys instead."""
    extra = ("--max-num-batched-tokens", "512", "--speculative-config", '{"disable_padded_drafter_batch": true}')
    name, spec = parse_launch_entry("k3=/drafters/a:k=3", k=5)
    cmd = server_command(LaunchConfig(target="/models/t", servers={name: spec}, extra_args=extra), name, 8000)
    assert cmd.count("--speculative-config") == 1 and cmd[-2:] == ["--max-num-batched-tokens", "512"]
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "/drafters/a", "num_speculative_tokens": 3, "disable_padded_drafter_batch": True}
    plain = server_command(LaunchConfig(target="/models/t", servers={"none": ServerSpec(None)}, extra_args=extra),
                           "none", 8000)
    assert "--speculative-config" not in plain
    for bad in (("--speculative-config",), ("--speculative-config=[1]",), ("--speculative-config", "{")):
        with pytest.raises(PlaygroundError, match="--speculative-config in the vLLM arguments"):
            server_command(LaunchConfig(target="/models/t", servers={name: spec}, extra_args=bad), name, 8000)


def test_the_embedded_target_starts_the_shipped_pair_then_the_named_servers_then_none():
    assert planned_names(LaunchSpec()) == ("eagle3", "eagle3.1", "none")
    spec = LaunchSpec(drafters=("k3=eagle3.1:k=3", "ngram=ngram:k=4", "eagle3=/elsewhere"), k=6)
    entries = launch_entries(spec)
    assert list(entries) == ["eagle3.1", "k3", "ngram", "eagle3", "none"]
    assert entries["k3"] == ServerSpec("eagle3", "eagle3.1", 3)   # a shipped name: resolved when launched
    assert entries["eagle3.1"].k == 6 and entries["eagle3"].source == "/elsewhere"
    assert list(launch_entries(LaunchSpec(drafters=("plain=none",)))) == ["eagle3", "eagle3.1", "plain"]
    assert list(launch_entries(LaunchSpec(model="org/m", drafters=("a=org/d",)))) == ["a", "none"]


@pytest.mark.parametrize("entry, message", [
    ("k3", "use NAME=SOURCE"),
    ("k 3=ngram", "not allowed"),
    ("a/b=ngram", "not allowed"),
    ("k3=eagle3.1:k=0", "k is a whole number from 1 to 16"),
    ("k3=eagle3.1:k=x", "k is a whole number"),
    ("k3=eagle3.1:depth=3", "after the source come :k=N"),
    ("k3=eagle3.1:lookup=2-5", "lookup=MIN-MAX .* is for ngram"),
    ("ng=ngram:lookup=5-2", "lookup=MIN-MAX"),
    ("plain=none:k=3", "a server without speculation has no k"),
])
def test_a_bad_launch_entry_is_one_line(entry, message):
    with pytest.raises(PlaygroundError, match=message):
        parse_launch_entry(entry, k=5)


def test_launch_refuses_a_name_twice_and_shipped_drafters_for_another_model():
    with pytest.raises(PlaygroundError, match="names a twice"):
        launch_entries(LaunchSpec(drafters=("a=ngram", "a=none")))
    with pytest.raises(PlaygroundError, match="the shipped drafters are the embedded target's"):
        launch_entries(LaunchSpec(model="org/m", drafters=("a=eagle3.1",)))


def test_urls_take_any_names_and_refuse_bad_ones():
    servers = parse_urls(["prod-eagle3.1_k5=http://10.0.0.2:8000/", "ngram=https://h"])
    assert [(s.drafter, s.url) for s in servers] == [("prod-eagle3.1_k5", "http://10.0.0.2:8000"),
                                                     ("ngram", "https://h")]
    for spec, message in (("=http://h", "use NAME=URL"), ("a b=http://h", "not allowed"),
                          ("x" * 41 + "=http://h", "not allowed"), ("a=ftp://h", "starting with http"), ("http://h:1", "with a name")):
        with pytest.raises(PlaygroundError, match=message):
            parse_urls([spec])
    assert bad_name("a · b") and bad_name("-a") and not bad_name("EAGLE3.1+ngram")


def info(config: dict | None, switches=None, speculative=True) -> ServerInfo:
    return ServerInfo(url="http://h", model="m", root="/m", max_model_len=8192, speculative=speculative,
                      k=5 if speculative else None, config=config, switches=switches)


def test_an_eagle_server_that_prefills_in_chunks_with_the_padded_batch_says_what_that_does():
    eagle = {"speculative_config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 5},
             "scheduler_config": {"max_num_batched_tokens": 2048, "max_num_scheduled_tokens": 2048}}
    assert info(eagle).prefill_chunk == 2048
    assert "longer than 2,048 tokens in chunks" in info(eagle).chunked_prefill_fault
    unpadded = {**eagle, "speculative_config": {**eagle["speculative_config"], "disable_padded_drafter_batch": True}}
    whole = {**eagle, "scheduler_config": {"max_num_batched_tokens": 8192}}
    ngram = {**eagle, "speculative_config": {"method": "ngram", "num_speculative_tokens": 5}}
    for config in (unpadded, whole, ngram, None):
        assert info(config).chunked_prefill_fault == ""
    assert info(None).prefill_chunk is None


def test_a_servers_variant_comes_from_its_method_and_its_drafters_switches():
    eagle = {"speculative_config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 5}}
    assert info(eagle, (True, True)).variant == "eagle3.1"
    assert info(eagle, (False, False)).variant == "eagle3"
    assert info(eagle, (True, False)).variant == "eagle3 (fc_norm=True, norm_output=False)"
    assert info(eagle).variant is None   # the drafter's config cannot be read here
    ngram = {"speculative_config": {"method": "ngram", "model": "ngram", "num_speculative_tokens": 4,
                                    "prompt_lookup_min": 2, "prompt_lookup_max": 5}}
    assert info(ngram).variant == "ngram" and info(ngram).drafter_source is None
    assert "n-gram prompt lookup (2-5 tokens), k = 5" in info(ngram).describe()
    assert info(None, speculative=False).variant == "none"


def test_switches_are_read_from_plain_and_speculators_checkpoints(tmp_path):
    assert drafter_switches(str(shipped_path("eagle3.1"))) == (True, True)
    assert drafter_switches(str(shipped_path("eagle3"))) == (False, False)
    config = DrafterConfig.from_vllm_json(json.loads((shipped_path("eagle3.1") / "config.json").read_text()))
    (tmp_path / "config.json").write_text(json.dumps(config.to_speculators_json("org/target", k=5)))
    assert drafter_switches(str(tmp_path)) == (True, True)
    assert drafter_switches(str(tmp_path / "missing")) is None
    assert drafter_switches("nobody/not-cached") is None


def test_servers_started_side_by_side_get_cores_of_their_own(monkeypatch):
    assert server_binds(1, [0, 1]) is None   # one server: vLLM's own binding (its last core left to the API server)
    assert server_binds(3, [0, 1]) == ["0", "1", "0"]
    assert server_binds(2, [0, 1]) == ["0", "1"]
    assert server_binds(3, list(range(16))) == ["0,1,2,3,4", "5,6,7,8,9", "10,11,12,13,14"]
    assert server_binds(2, [0, 2, 4, 6]) == ["0", "2"]
    cores = physical_cores(frozenset(os.sched_getaffinity(0)))
    assert cores and set(cores) <= os.sched_getaffinity(0)
    monkeypatch.delenv(BIND_VARIABLE, raising=False)
    assert launch_binds(2, ()) == server_binds(2, cores)
    assert launch_binds(2, ("--data-parallel-size", "2")) is None and launch_binds(2, ("-tp=2",)) is None
    monkeypatch.setenv(BIND_VARIABLE, "nobind")
    assert launch_binds(2, ()) is None


def test_a_physical_core_counts_once(tmp_path, monkeypatch):
    """Two logical CPUs of one core (SMT siblings): the server is bound to the first of them only."""
    for cpu, core in ((0, 0), (1, 1), (2, 0), (3, 1)):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(cpu_binding, "CPU_FOLDER", tmp_path)
    assert physical_cores({0, 1, 2, 3}) == [0, 1]
    assert sorted(physical_cores({2, 3, 5})) == [2, 3, 5]   # cpu5 has no topology: a core of its own
