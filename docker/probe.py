"""Check a running playground: the page loads and a prompt streams through the API.

    python docker/probe.py http://127.0.0.1:7860 [backend]    # backend: reference (default) or vllm
"""

import sys
import time
import urllib.request

from gradio_client import Client


def main(url: str, backend: str = "reference", timeout_s: float = 900) -> None:
    start = time.time()
    while True:
        try:
            page = urllib.request.urlopen(url, timeout=5).read().decode()
            break
        except OSError:
            if time.time() - start > timeout_s:
                sys.exit(f"FAIL: no page at {url} after {timeout_s:.0f} s")
            time.sleep(2)
    assert "EAGLE 3.1 Playground" in page, "FAIL: the page is not the playground"
    print(f"page loaded after {time.time() - start:.0f} s")
    job = Client(url, verbose=False).submit("Write a haiku about the sea.", "", "model", "eagle3.1", 5, 0.0, 1.0, 32,
                                            backend, api_name="/run")
    updates = sum(1 for _ in job)
    text = job.result()[1]
    assert updates >= 2 and text, f"FAIL: {updates} updates, text {text!r}"
    print(f"OK: {updates} streamed updates, answer: {text!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
