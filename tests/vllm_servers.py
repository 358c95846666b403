"""How the tests start vLLM servers.

tests/test_vllm.py's EAGLE 3.1 server serves the model as operators do, compiled by torch.compile, and
the module checks there that the probe sees what the embedded engine computes. Every other server runs
eagerly: a start takes about 30 s here where compiling takes 100-145 s, and what they check (keys,
limits, engines, formats, methods, releases) does not depend on how the model's forward is run."""

from playground.engines.vllm.client import Server
from playground.engines.vllm.launch import Launched

EAGER = ("--enforce-eager",)


class Launches:
    """Servers of several launches (compiled and eager ones, started at once), waited for and stopped as one."""

    def __init__(self, *launches: Launched):
        self.launches = launches
        self.processes = {name: p for launched in launches for name, p in launched.processes.items()}

    def wait_healthy(self, status) -> list[Server]:
        try:
            return [server for launched in self.launches for server in launched.wait_healthy(status=status)]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for launched in self.launches:
            launched.stop()
