"""The real playground app in a subprocess: for the memory benchmark and the client and browser tests."""

from __future__ import annotations

import sys
from pathlib import Path

from playground.local_server import ServerProcess, answers, pick_port

ROOT = Path(__file__).resolve().parents[1]


def api_client(url: str):
    """A gradio_client for the app at `url`. The client fetches a run's files with httpx's default
    5 s timeout, which a busy 2-core machine (vLLM servers beside the app) can exceed; a minute
    still fails a page that hangs."""
    from gradio_client import Client

    return Client(url, verbose=False, httpx_kwargs={"timeout": 60})


class AppServer:
    """`python app.py ARGS` on a free local port; the constructor returns once the page answers."""

    def __init__(self, *args: str, timeout_s: float = 240, log_dir: Path | None = None):
        command = lambda port: [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port),
                                *args]
        self.server = ServerProcess("app", command, log_dir or ROOT / ".cache" / "app-logs", pick_port(),
                                    cwd=ROOT)
        try:
            self.server.wait_until(answers, timeout_s)
        except Exception:
            self.stop()
            raise
        self.url = self.server.url

    @property
    def pid(self) -> int:
        """The app's process id (the latest start's, should a taken port have made it start again)."""
        return self.server.process.pid

    def stop(self) -> None:
        self.server.stop(grace_s=20)
