"""Local server ports: chosen outside the kernel's ephemeral range, and a server that loses its port
to another program is started again on another one (real subprocesses, real sockets)."""

import socket
import sys
from pathlib import Path

import pytest

from playground.errors import PlaygroundError
from playground.local_server import ServerProcess, answers, ephemeral_range, is_ephemeral, is_free, pick_port


def http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]


@pytest.fixture
def held_port():
    """A port outside the ephemeral range that the test listens on, as another program would."""
    with socket.socket() as s:
        port = pick_port()
        s.bind(("127.0.0.1", port))
        s.listen()
        yield port


def test_the_ephemeral_range_is_the_kernels():
    kernel = tuple(int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert ephemeral_range() == kernel
    low, high = kernel
    assert is_ephemeral(low) and is_ephemeral(high) and not is_ephemeral(low - 1) and not is_ephemeral(high + 1)


def test_picked_ports_are_free_and_outside_the_ephemeral_range():
    ports = {pick_port() for _ in range(20)}
    assert len(ports) > 1, "random, so that programs choosing at once rarely collide"
    assert all(is_free(p) and not is_ephemeral(p) for p in ports)


def test_a_preferred_port_is_kept_only_when_it_is_free_and_outside_the_range(held_port):
    free = pick_port()
    assert pick_port(free) == free
    assert pick_port(held_port) != held_port
    assert pick_port(ephemeral_range()[0]) != ephemeral_range()[0]
    assert pick_port(free, avoid=frozenset({free})) != free


def test_a_server_whose_port_was_taken_starts_again_on_another(held_port, tmp_path):
    lines = []
    server = ServerProcess("http", http_server, tmp_path, held_port, status=lines.append)
    try:
        server.wait_until(answers, timeout_s=30, interval_s=0.1)
        assert server.tried[0] == held_port and server.port != held_port and len(server.tried) == 2
        assert answers(server.url)
        assert "Address already in use" in (tmp_path / f"http-{held_port}.log").read_text()
        assert lines == [f"port {held_port} was taken before http could bind it; starting http again on port "
                         f"{server.port} (log: {tmp_path / f'http-{server.port}.log'})"]
    finally:
        server.stop(grace_s=5)
    assert server.process.poll() is not None


def test_retries_are_bounded(held_port, tmp_path):
    server = ServerProcess("http", lambda port: http_server(held_port), tmp_path, held_port, attempts=2,
                           status=lambda line: None)
    with pytest.raises(PlaygroundError, match=rf"(?s)exited with code 1 \(ports tried: {held_port}, \d+\).*"
                                              "Address already in use"):
        server.wait_until(answers, timeout_s=30, interval_s=0.1)
    assert len(server.tried) == 2


def test_a_server_that_fails_otherwise_is_not_retried(tmp_path):
    command = lambda port: [sys.executable, "-c", "raise SystemExit('error: no model at /nowhere')"]
    server = ServerProcess("vllm-eagle3", command, tmp_path, pick_port(), status=lambda line: None)
    with pytest.raises(PlaygroundError, match="(?s)vllm-eagle3 server exited with code 1.*no model at /nowhere"):
        server.wait_until(answers, timeout_s=30, interval_s=0.1)
    assert len(server.tried) == 1


@pytest.mark.slow
def test_the_app_whose_port_was_taken_starts_again_on_another(held_port, tmp_path):
    """Gradio words it its own way ("Cannot find empty port"); the app is retried all the same."""
    from playground.app_process import ROOT

    command = lambda port: [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port)]
    server = ServerProcess("app", command, tmp_path, held_port, cwd=ROOT, status=lambda line: None)
    try:
        server.wait_until(answers, timeout_s=240)
        assert server.tried[0] == held_port and server.port != held_port
    finally:
        server.stop(grace_s=20)
