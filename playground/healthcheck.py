"""Container health check: the page answers, and with the vLLM backend every launched server does.

    python -m playground.healthcheck     # exit 0 healthy, 1 not (used by the Dockerfile's HEALTHCHECK)
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

from playground.engines.vllm.launch import SERVERS_FILE
from playground.settings import server_port


def urls() -> list[str]:
    """The page, and the launched vLLM servers (their ports are known once they are healthy)."""
    found = [f"http://127.0.0.1:{server_port()}/"]
    if os.environ.get("PLAYGROUND_BACKEND") == "vllm" and os.environ.get("PLAYGROUND_VLLM_LAUNCH"):
        if not SERVERS_FILE.exists():
            raise OSError(f"the vLLM servers are not healthy yet (no {SERVERS_FILE})")
        found += [f"{url}/health" for url in json.loads(SERVERS_FILE.read_text()).values()]
    return found


def main() -> int:
    try:
        for url in urls():
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status != 200:
                    raise OSError(f"{url}: HTTP {response.status}")
    except OSError as e:
        print(f"unhealthy: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
