"""The real playground app in a subprocess: for the memory benchmark and the client and browser tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def api_client(url: str):
    """A gradio_client for the app at `url`. The client fetches a run's files with httpx's default
    5 s timeout, which a busy 2-core machine (vLLM servers beside the app) can exceed; a minute
    still fails a page that hangs."""
    from gradio_client import Client

    return Client(url, verbose=False, httpx_kwargs={"timeout": 60})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`python app.py ARGS` on a free local port; the constructor returns once the page answers."""

    def __init__(self, *args: str, timeout_s: float = 240, log_dir: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if log_dir:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(log_dir / f"app-{self.port}.log", "w") if log_dir else subprocess.DEVNULL
        self.process = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1",
                                         "--port", str(self.port), *args], cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the app exited with code {self.process.returncode}")
            try:
                urllib.request.urlopen(self.url, timeout=2)
                return
            except OSError:
                time.sleep(1)
        self.stop()
        raise TimeoutError(f"the app did not answer on {self.url} within {timeout_s} s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
