"""Server subprocesses on local ports: port choice that cannot race the kernel, and a retry when it
loses to another program all the same.

The kernel hands out ephemeral ports (`net.ipv4.ip_local_port_range`, 32768-60999 by default) for
every outgoing connection and every `bind(port 0)`: a port picked inside that range and bound a
moment later can be taken in between by any socket on the machine (vLLM's own ZMQ sockets, the
test's HTTP connections). Ports outside it are only ever taken by a program that names them, so
`pick_port` chooses there, and `ServerProcess` restarts a server that still dies at start-up with
"Address already in use" on another port.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Mapping

from playground.errors import PlaygroundError

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
LOWEST_PORT = 10000          # below lie well-known and registered services' ports
# what a server prints when its port is taken: the OS's words (uvicorn, http.server, vLLM), Gradio's
PORT_TAKEN = ("Address already in use", "Cannot find empty port")
START_ATTEMPTS = 3


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive)."""
    try:
        low, high = RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL


def is_ephemeral(port: int) -> bool:
    low, high = ephemeral_range()
    return low <= port <= high


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind `port` now (with SO_REUSEADDR, as uvicorn and http.server do)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int | None = None, avoid: frozenset[int] = frozenset()) -> int:
    """`preferred` if it is free and outside the ephemeral range, else a random free port outside it
    (random, so that two programs choosing at once rarely pick the same one)."""
    if preferred and not is_ephemeral(preferred) and preferred not in avoid and is_free(preferred):
        return preferred
    low, high = ephemeral_range()
    candidates = [p for p in (*range(LOWEST_PORT, low), *range(high + 1, 65536)) if p not in avoid]
    for port in random.sample(candidates, min(len(candidates), 200)):
        if is_free(port):
            return port
    raise PlaygroundError(f"no free local port outside the ephemeral range {low}-{high}")


def answers(url: str) -> bool:
    """Whether `url` answers with a success now."""
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False


def died_of_port_clash(log: Path) -> bool:
    text = log.read_text(errors="replace") if log.exists() else ""
    return any(words in text for words in PORT_TAKEN)


def last_error(log: Path, lines: int = 3) -> str:
    """The last lines of a server log that name an error (or simply its last lines)."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [line for line in text if "Error" in line or "error" in line]
    return "\n".join((errors or text)[-lines:])


class ServerProcess:
    """One server subprocess listening on a local port.

    `port` is the caller's choice (see `pick_port`); `command(port)` gives the command line, whose
    output goes to `log_dir/{name}-{port}.log`. If the process exits while starting and its log says
    the port was taken, `poll` starts it again on another port (at most `attempts` starts in all)
    and reports that through `status`.
    """

    def __init__(self, name: str, command: Callable[[int], list[str]], log_dir: Path, port: int, *,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 attempts: int = START_ATTEMPTS, status: Callable[[str], None] = print,
                 new_session: bool = False):
        self.name, self.command, self.log_dir = name, command, Path(log_dir)
        self.env, self.cwd, self.attempts, self.status = env, cwd, attempts, status
        self.new_session = new_session
        self.tried: list[int] = []
        self._start(port)

    @property
    def port(self) -> int:
        return self.tried[-1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.name}-{self.port}.log"

    def _start(self, port: int) -> None:
        self.tried.append(port)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(self.command(port), env=self.env, cwd=self.cwd, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=self.new_session)

    def poll(self) -> None:
        """Raise if the server has exited (restarting it first if it lost its port to another program)."""
        code = self.process.poll()
        if code is None:
            return
        if died_of_port_clash(self.log) and len(self.tried) < self.attempts:
            port = pick_port(avoid=frozenset(self.tried))
            self.status(f"port {self.port} was taken before {self.name} could bind it; "
                        f"starting {self.name} again on port {port} (log: {self.log_dir / f'{self.name}-{port}.log'})")
            self._start(port)
            return
        raise PlaygroundError(f"the {self.name} server exited with code {code} "
                              f"(ports tried: {', '.join(map(str, self.tried))}); "
                              f"the end of its log ({self.log}):\n{last_error(self.log)}")

    def wait_until(self, ready: Callable[[str], bool], timeout_s: float, interval_s: float = 1.0) -> None:
        """Poll until `ready(url)` holds; raise if the server exits or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if ready(self.url):
                return
            if time.monotonic() > deadline:
                raise PlaygroundError(f"the {self.name} server did not answer on {self.url} within {timeout_s:.0f} s "
                                      f"(log: {self.log})")
            time.sleep(interval_s)

    def terminate(self) -> None:
        """Ask the server (its whole process group when it has one of its own) to exit."""
        self._signal(signal.SIGTERM)

    def reap(self, grace_s: float = 30) -> None:
        """Wait up to `grace_s` for a terminated server to exit, then kill what is left of it."""
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, grace_s: float = 30) -> None:
        self.terminate()
        self.reap(grace_s)

    def _signal(self, sig: int) -> None:
        try:
            if self.new_session:   # the server and the processes it started (vLLM's engine core)
                os.killpg(self.process.pid, sig)
            elif self.process.poll() is None:
                self.process.send_signal(sig)
        except ProcessLookupError:
            pass
