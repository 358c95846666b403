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
    in this process or another, reads the file this writes. Measured by a smaller plan (one round of the
    short runs, one of the long at a 2,000-token prompt: about a third of the time), and removed afterwards:
    the costs `--k auto` keeps are measured in full."""
    from playground.evaluation import k_choice

    path = k_choice.cache_path(engine)
    path.unlink(missing_ok=True)
    yield k_choice.costs(engine, k_choice.MeasurePlan(step_rounds=1, long_rounds=1, long_tokens=2000))
    path.unlink(missing_ok=True)


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
