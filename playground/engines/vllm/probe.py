"""The eagle_probe plugin (probe/) as the vLLM backend reads it: whether a server runs it, and one
request's records fetched while it streams.

A server with the plugin records the requests that set `vllm_xargs.eagle_probe` to an id of their
own: per verify step the drafts the target verified, how many it accepted, the tokens the step
committed, the RMS of the state fed into each draft depth and the drafter's attention on the sink
tokens and on its own drafts by depth (EAGLE-3 drafters). Records leave the
server as they are fetched; the last fetch, after the stream ends, also drops the request there.
"""

from __future__ import annotations

import time
import uuid

import httpx

from playground.engines.vllm.api import call_json
from playground.errors import PlaygroundError

FIELD = "eagle_probe"
PREFIX = "/eagle_probe/v1"
FETCH_EVERY_S = 0.2   # a fetch waits for the engine's current step, so not after every chunk


def probe_version(client: httpx.Client, url: str) -> str | None:
    """The probe's version in the server at `url`, or None where it does not run (not installed, not in
    VLLM_PLUGINS, or off because the server's vLLM is not the one it was written for)."""
    try:
        return str(call_json(client, "GET", url, f"{PREFIX}/status").get("version"))
    except PlaygroundError:
        return None


class ProbedRequest:
    """One request the probe records, and its records as they arrive (oldest first)."""

    def __init__(self, client: httpx.Client, url: str):
        self.client, self.url, self.key = client, url, uuid.uuid4().hex
        self.records: list[dict] = []
        self.fetched_at = float("-inf")
        self.finished = False   # the probe said the request finished and gave its last records: it holds none now

    @property
    def body(self) -> dict:
        """What the completion request adds to its body to be recorded: its id, and a cache salt of its
        own so that no key of its prompt comes from another request's cached prefix (the probe
        measures attention over the keys it saw computed)."""
        return {"vllm_xargs": {FIELD: self.key}, "cache_salt": self.key}

    def fetch(self, final: bool = False) -> list[dict]:
        """The records made so far; at most every FETCH_EVERY_S while streaming, always when final."""
        if not self.finished and (final or time.monotonic() - self.fetched_at >= FETCH_EVERY_S):
            self.fetched_at = time.monotonic()
            answer = call_json(self.client, "GET", self.url, f"{PREFIX}/records/{self.key}",
                               params={"final": "true"} if final else None)
            errors = [answer.get("error"), *(r.get("error") for r in answer.get("records") or [])]
            if any(errors):   # refused (the probe is full), or the server schedules asynchronously
                raise PlaygroundError(f"the probe in the vLLM server at {self.url}: {next(filter(None, errors))}")
            self.records += answer.get("records") or []
            self.finished = bool(answer.get("finished"))
        return self.records
