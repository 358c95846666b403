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
    from playground.app_process import ROOT, AppServer

    server = AppServer("--max-tokens", "512", log_dir=ROOT / ".pytest_cache" / "app-logs")
    yield server.url
    server.stop()
