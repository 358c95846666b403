"""The eagle_probe plugin (probe/) as the vLLM backend reads it: whether a server runs it and what it
measures there, and one request's records fetched while it streams.

A server with the plugin records the requests that set `vllm_xargs.eagle_probe` to a key of their
own: per verify step the drafts the target verified, how many it accepted, the tokens the step
committed, the RMS of the state fed into each draft depth and the drafter's attention on the sink
tokens and on its own drafts by depth (EAGLE-3 drafters). A request is recorded only under a key
made with the server's API key (eagle_probe/keys.py), whichever route it came through. Records leave
the server as they are fetched (the key in the body, never in a URL); the last fetch, after the
stream ends (or is abandoned), also releases the request there.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import httpx
from eagle_probe.keys import key_for, secret_of

from playground.engines.vllm.api import ServerAnswered, call_json
from playground.errors import PlaygroundError

FIELD = "eagle_probe"
PREFIX = "/v1/eagle_probe"
FETCH_EVERY_S = 0.2   # a fetch waits for the engine's current step, so not after every chunk
OLDEST_READ = (0, 4)  # the probe's first release that proves keys and takes them in a body
BUSY_WAITS_S = (0.1, 0.2, 0.4, 0.8)   # a fetch the probe answers 503 (too many waiting) is asked again after each


@dataclass(frozen=True)
class ProbeStatus:
    version: str | None   # None: the server does not run the probe
    off: str = ""         # why it records no drafts in this server, where it runs but cannot
    config: dict | None = None   # the server's configuration as the probe publishes it (server_config)
    sampling_fault: str = ""     # why the server samples speculative requests wrongly, where the probe found it does
    sampling_unchecked: str = ""  # why the probe could not check how the server samples them, where it could not


def probe_key(api_key: str | None) -> str:
    """A new key for one request to a server with `api_key` (None: a server without one)."""
    return key_for(secret_of(api_key), uuid.uuid4().hex)


def fetch_records(client: httpx.Client, url: str, key: str, request: str, final: bool,
                  timeout: float | None = None) -> dict:
    """The records made since the last fetch of the request whose stream carries the id `request`,
    recorded under `key` (`final`: this is the last fetch). A 503 (the probe busy) is asked again after each of BUSY_WAITS_S; a ServerAnswered
    carries any other refusal (404: nothing recorded under the key)."""
    asked = {"json": {"key": key, "request": request, "final": final}, **({"timeout": timeout} if timeout else {})}
    for wait_s in BUSY_WAITS_S + (None,):
        try:
            return call_json(client, "POST", url, f"{PREFIX}/records", **asked)
        except ServerAnswered as e:
            if e.status_code != 503 or wait_s is None:
                raise
            time.sleep(wait_s)


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
    version = str(answer.get("version"))
    if tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) < OLDEST_READ:
        return ProbeStatus(version, f"its eagle_probe {version} is older than this playground reads "
                                    f"({'.'.join(map(str, OLDEST_READ))} or newer): reinstall probe/ in the server")
    drafts = str((answer.get("measures") or {}).get("drafts", "yes"))
    config = answer.get("server_config")
    sampling = str(answer.get("speculative_sampling", "yes"))   # published since eagle_probe 0.4.1
    return ProbeStatus(version, "" if drafts == "yes" else drafts.removeprefix("no: "),
                       config if isinstance(config, dict) else None, *sampling_verdict(sampling))


def sampling_verdict(published: str) -> tuple[str, str]:
    """(fault, unchecked) from the probe's `speculative_sampling`: "yes", "no: why" or "unknown: why"."""
    if published.startswith("no: "):
        return published.removeprefix("no: "), ""
    if published.startswith("unknown: "):
        return "", published.removeprefix("unknown: ")
    return "", ""


class ProbedRequest:
    """One request the probe records, and its records as they arrive (oldest first). `error` says why
    the records stopped before the request's end, once they have."""

    def __init__(self, client: httpx.Client, url: str, api_key: str | None):
        self.client, self.url, self.key = client, url, probe_key(api_key)
        self.request = ""   # the id the stream carries, once a chunk has come: the records asked for are its own
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
        if not self.request:
            self.error = "the server's stream carried no request id" if final else ""
            return self.records
        self.fetched_at = time.monotonic()
        try:
            answer = fetch_records(self.client, self.url, self.key, self.request, final)
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
        if not self.finished and self.request:
            try:
                fetch_records(self.client, self.url, self.key, self.request, final=True, timeout=5.0)
            except PlaygroundError:
                pass   # the server drops them itself when the request ends, after EAGLE_PROBE_IDLE_TTL_S
