"""The records of the requests being probed, in one worker process: bounded in requests, in bytes and
in time, each request's records under its own key and owned by the request admitted under it.

A request is admitted once, at its first step, or refused then and never recorded. A key that is not
a probe key made with the server's API key (keys.py) is refused without a trace: whoever reaches the
port without the key costs the store nothing. A proven key is refused when another request holds it,
or when the store holds as many requests as it may (live, or finished with records waiting); such a
refusal is kept, under the key's digest, a bounded number for a bounded time, so a fetch can say why.
Every call's work is bounded by the limits, never by how many requests were ever seen.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from eagle_probe.keys import digest, proven
from eagle_probe.settings import Settings

MAX_REFUSED = 256   # refusals kept for a fetch to read


def owned_by(internal_id: str, request: str) -> bool:
    """Whether vLLM's internal id of a request is that of the stream `request`: the stream's id, with the
    prompt's index for a completion (vllm/entrypoints/openai/completion/serving.py ~177: "-0" for one
    prompt), and 8 random characters vLLM adds (vllm/v1/engine/input_processor.py ~354-373)."""
    ids = (internal_id, internal_id.rsplit("-", 1)[0])
    return request in ids or f"{request}-0" in ids


class NotTheApiProcess(PermissionError):
    """A call to the workers without the API process's token (vLLM's development `/collective_rpc`)."""


@dataclass
class Entry:
    owner: str               # vLLM's internal id of the request admitted under the key: no other adds to it
    records: list[dict] = field(default_factory=list)
    finished: bool = False
    released: bool = False   # its client fetched for the last time: its records are no longer kept
    steps: int = 0           # records made so far, fetched or not
    dropped: int = 0         # records lost to the byte limit
    held_bytes: int = 0      # of the records not yet fetched
    turned_away: int = 0     # other requests that sent this key while it was held: not recorded
    touched: float = field(default_factory=time.monotonic)


class Store:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings.from_env()
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._waiting: OrderedDict[str, None] = OrderedDict()   # finished entries, least recently touched first
        self._refused: OrderedDict[str, tuple[float, str]] = OrderedDict()   # digest -> (when, why)
        self._live = 0
        self._secrets: list[bytes] | None = None   # what keys are proven against, from the API process
        self._token: str | None = None             # what the API process's calls carry
        self.held_bytes = 0
        self.fetch_calls = 0   # calls of fetch_many: how often the API process reached this worker for records
        self.unproven = 0      # requests that asked to be recorded without a proven key

    def configure(self, secrets: list[bytes], token: str) -> str | None:
        """Set once, by the API process before it serves: None when set (or set alike before), else why not."""
        with self._lock:
            if self._token is None:
                self._secrets, self._token = list(secrets), token
                return None
            if hmac.compare_digest(self._token, token) and sorted(self._secrets) == sorted(secrets):
                return None
            return "the probe's workers were configured with other keys"

    def check(self, token: object) -> None:
        """Refuse a call that does not carry the API process's token."""
        if self._token is None or not isinstance(token, str) or not hmac.compare_digest(self._token, token):
            raise NotTheApiProcess("eagle_probe: this call does not come from the server's API process")

    def admit(self, key: object, owner: str) -> str | None:
        """Start recording request `owner` under `key`; None when admitted, else why it is not (the request
        is never recorded)."""
        with self._lock:
            if self._secrets is None or not proven(key, self._secrets):
                self.unproven += 1
                return "not recorded: not a probe key made with this server's API key"
            self._expire()
            entry = self._entries.get(key)
            if entry is not None:
                entry.turned_away += 1
                return "not recorded: another request holds this key"
            if self._live >= self.settings.max_requests:
                why = (f"not recorded: the probe records at most {self.settings.max_requests} requests at once "
                       "(EAGLE_PROBE_MAX_REQUESTS)")
            elif len(self._entries) >= self.settings.max_held:
                why = (f"not recorded: the probe holds at most {self.settings.max_held} requests, live or with "
                       "records waiting for their fetch (EAGLE_PROBE_MAX_HELD)")
            else:
                self._entries[key] = Entry(owner)
                self._live += 1
                return None
            self._refused[digest(key)] = (time.monotonic(), why)
            self._refused.move_to_end(digest(key))
            while len(self._refused) > MAX_REFUSED:
                self._refused.popitem(last=False)
            return why

    def add(self, key: str, owner: str, record: dict) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.owner != owner or entry.released:
                return
            record["step"] = entry.steps
            entry.steps += 1
            size = len(json.dumps(record))
            if self.held_bytes + size <= self.settings.max_record_bytes:
                entry.records.append(record)
                entry.held_bytes += size
                self.held_bytes += size
            else:
                entry.dropped += 1
            entry.touched = time.monotonic()

    def finish(self, key: str, owner: str) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.owner != owner or entry.finished:
                return
            entry.finished, entry.touched = True, time.monotonic()
            self._live -= 1
            if entry.released:
                self._drop(key)
            else:
                self._waiting[key] = None

    def fetch(self, key: str, request: str, final: bool = False) -> dict | None:
        """The records made since the last fetch of the request `request` (the id its stream carries), or
        None for a key the store does not hold. The records leave the store. A finished request leaves with them; a live one
        whose client says this fetch is its last is released: it keeps its place until vLLM reports it
        finished, its records no longer kept. Another request's records under the key are never given."""
        with self._lock:
            self._expire()
            refused = self._refused.pop(digest(key), None)
            entry = self._entries.get(key)
            if entry is None:
                return None if refused is None else {"records": [], "finished": True, "error": refused[1]}
            if not owned_by(entry.owner, request):
                return {"records": [], "finished": True, "error": "not recorded: another request holds this key"}
            records, entry.records, entry.touched = entry.records, [], time.monotonic()
            self.held_bytes -= entry.held_bytes
            entry.held_bytes = 0
            if entry.finished:
                self._drop(key)
            else:
                entry.released = entry.released or final
            answer = {"records": records, "finished": entry.finished, "dropped": entry.dropped}
            if key in self._waiting:
                self._waiting.move_to_end(key)
            if entry.dropped:
                answer["dropped_why"] = (f"the probe holds at most {self.settings.max_record_bytes >> 20} MiB of "
                                         "unfetched records (EAGLE_PROBE_MAX_RECORD_BYTES)")
            if entry.turned_away:
                answer["turned_away"] = entry.turned_away
            return answer

    def fetch_many(self, token: object, asked: list[tuple[str, str, bool]]) -> dict:
        """Each asked key's answer, and the digests of the keys the store holds after them (the API process
        answers a fetch of any other key without calling the workers, until it asks again)."""
        self.check(token)
        answers = [self.fetch(key, request, bool(final)) for key, request, final in asked]
        with self._lock:
            self.fetch_calls += 1
            return {"answers": answers, "held": [digest(key) for key in self._entries]}

    def live(self) -> int:
        """Requests recorded now (finished ones whose records wait for their fetch do not count)."""
        return self._live

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._waiting.pop(key, None)
        self.held_bytes -= entry.held_bytes

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.settings.idle_ttl_s
        # a live request leaves when vLLM reports it finished (aborted ones too); a finished one when fetched
        while self._waiting and self._entries[next(iter(self._waiting))].touched < cutoff:
            self._drop(next(iter(self._waiting)))
        while self._refused and next(iter(self._refused.values()))[0] < cutoff:
            self._refused.popitem(last=False)
