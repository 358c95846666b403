"""The eagle_probe plugin (probe/) as the vLLM backend reads it: whether a server runs it and what it
measures there, and one request's records fetched while it streams.

A server with the plugin records the requests that set `vllm_xargs.eagle_probe` to a key of their
own: per verify step the drafts the target verified, how many it accepted, the tokens the step
committed, the RMS of the state fed into each draft depth and the drafter's attention on the sink
tokens and on its own drafts by depth (EAGLE-3 drafters). Records leave the server as they are
fetched; the last fetch, after the stream ends (or is abandoned), also drops the request there.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import httpx

from playground.engines.vllm.api import ServerAnswered, call, call_json
from playground.errors import PlaygroundError

FIELD = "eagle_probe"
PREFIX = "/v1/eagle_probe"
FETCH_EVERY_S = 0.2   # a fetch waits for the engine's current step, so not after every chunk


@dataclass(frozen=True)
class ProbeStatus:
    version: str | None   # None: the server does not run the probe
    off: str = ""         # why it records no drafts in this server, where it runs but cannot


def probe_status(client: httpx.Client, url: str) -> ProbeStatus:
    """The probe in the server at `url`: its version (None where it does not run: not installed, not in
    VLLM_PLUGINS, or off because the server's vLLM changed the code it hooks), and why it cannot
    record drafts there, if it cannot (another model runner, asynchronous scheduling)."""
    try:
        answer = call_json(client, "GET", url, f"{PREFIX}/status")
    except ServerAnswered as e:
        if e.status_code == 401:
            raise
        return ProbeStatus(None)
    except PlaygroundError:
        return ProbeStatus(None)
    drafts = str((answer.get("measures") or {}).get("drafts", "yes"))
    return ProbeStatus(str(answer.get("version")), "" if drafts == "yes" else drafts.removeprefix("no: "))


class ProbedRequest:
    """One request the probe records, and its records as they arrive (oldest first). `error` says why
    the records stopped before the request's end, once they have."""

    def __init__(self, client: httpx.Client, url: str):
        self.client, self.url, self.key = client, url, uuid.uuid4().hex
        self.records: list[dict] = []
        self.fetched_at = float("-inf")
        self.finished = False   # the probe gave the request's last records (or has none): it holds none now
        self.error = ""

    @property
    def body(self) -> dict:
        """What the completion request adds to its body to be recorded: its key, and a cache salt of its
        own so that no key of its prompt comes from another request's cached prefix (the probe
        measures attention over the keys it saw computed)."""
        return {"vllm_xargs": {FIELD: self.key}, "cache_salt": self.key}

    def fetch(self, final: bool = False) -> list[dict]:
        """The records made so far; at most every FETCH_EVERY_S while streaming, always when final. A
        request the probe does not hold yet has none (it is admitted at its first step); one it never
        held by the end, or one it refused or stopped recording, sets `error`."""
        if self.finished or self.error or not (final or time.monotonic() - self.fetched_at >= FETCH_EVERY_S):
            return self.records
        self.fetched_at = time.monotonic()
        try:
            answer = call_json(self.client, "GET", self.url, f"{PREFIX}/records/{self.key}",
                               params={"final": "true"} if final else None)
        except ServerAnswered as e:
            if e.status_code == 404 and not final:
                return self.records
            self.finished = e.status_code == 404
            self.error = "the probe holds no records of this request: its hooks did not run for it" \
                if self.finished else str(e)
            return self.records
        except PlaygroundError as e:
            self.error = str(e)
            return self.records
        for record in answer.get("records") or []:
            if record.get("error"):
                self.error = record["error"]
                break
            self.records.append(record)
        self.error = self.error or answer.get("error") or ""
        self.finished = final or bool(answer.get("finished"))   # a final fetch drops the request there
        return self.records

    def release(self) -> None:
        """The last fetch of a stream that ended early: the probe drops the request's records."""
        if not self.finished:
            try:
                call(self.client, "GET", self.url, f"{PREFIX}/records/{self.key}", params={"final": "true"},
                     timeout=5.0)
            except PlaygroundError:
                pass   # the server drops them itself when the request ends, after EAGLE_PROBE_IDLE_TTL_S
