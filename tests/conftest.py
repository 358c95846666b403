import pytest
import torch

from playground.engines.reference import ReferenceEngine


@pytest.fixture(scope="session")
def engine() -> ReferenceEngine:
    torch.manual_seed(0)
    return ReferenceEngine.load()


@pytest.fixture(scope="session")
def target(engine):
    return engine.target


@pytest.fixture(scope="session")
def step_costs(engine):
    """This host's step costs for `--k auto`, measured once a session, afresh: every test that runs k auto,
    in this process or another, reads the file this writes."""
    from playground.evaluation import k_choice

    k_choice.cache_path(engine).unlink(missing_ok=True)
    return k_choice.costs(engine)


@pytest.fixture(scope="session")
def app_url():
    from playground.app_process import AppServer

    server = AppServer("--max-tokens", "512", "--watch-any-url")
    yield server.url
    server.stop()


@pytest.fixture
def dead_port():
    """A local port that refuses connections for the whole test: bound by the test, never listening
    (a port that was merely free a moment ago could be taken by any socket meanwhile)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
