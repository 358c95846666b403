"""Container health check: the page answers, and with the vLLM backend every launched server does.

    python -m playground.healthcheck     # exit 0 healthy, 1 not (used by the Dockerfile's HEALTHCHECK)
"""

from __future__ import annotations

import os
import sys
import urllib.request

from playground.engines.vllm_launch import LaunchConfig

SERVERS = ("eagle3", "eagle3.1", "none")   # app.py launches these, on consecutive ports


def urls() -> list[str]:
    found = [f"http://127.0.0.1:{os.environ.get('PLAYGROUND_PORT', '7860')}/"]
    if os.environ.get("PLAYGROUND_BACKEND") == "vllm" and os.environ.get("PLAYGROUND_VLLM_LAUNCH"):
        found += [f"http://127.0.0.1:{LaunchConfig.base_port + i}/health" for i in range(len(SERVERS))]
    return found


def main() -> int:
    for url in urls():
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
        except OSError as e:
            print(f"unhealthy: {url}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
