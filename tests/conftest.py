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
def app_url():
    from tests.app_server import AppServer

    server = AppServer("--max-tokens", "512")
    yield server.url
    server.stop()
