"""The records of the requests being probed, in one worker process: bounded in requests, in bytes and
in time, each request's records under its own key.

A request is admitted once, at its first step, or refused then and never recorded: its key too short
to be private, its key held by another request's records, or the store holding as many live requests
as it may. A refusal is kept (a bounded number, for a bounded time) so that a fetch can say why.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from eagle_probe.settings import Settings

MIN_KEY_CHARS = 32   # a key names its request's records, answer included: it must be as hard to guess as a uuid4
MAX_REFUSED = 1024   # refusals kept for a fetch to read


@dataclass
class Entry:
    records: list[dict] = field(default_factory=list)
    finished: bool = False
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
        self._refused: OrderedDict[str, tuple[float, str]] = OrderedDict()   # key -> (when, why)
        self.held_bytes = 0
        self.fetch_calls = 0   # calls of fetch_many: how often the API process reached this worker for records

    def admit(self, key: str) -> str | None:
        """Start recording `key`; None when admitted, else why it is not (the request is never recorded)."""
        with self._lock:
            self._expire()
            if len(key) < MIN_KEY_CHARS:
                why = (f"not recorded: the key is {len(key)} characters; the probe records keys of at least "
                       f"{MIN_KEY_CHARS} (a uuid4's hex), which no other client can guess")
            elif key in self._entries:
                self._entries[key].turned_away += 1
                return "not recorded: another request holds this key"
            elif sum(not e.finished for e in self._entries.values()) >= self.settings.max_requests:
                why = (f"not recorded: the probe records at most {self.settings.max_requests} requests at once "
                       "(EAGLE_PROBE_MAX_REQUESTS)")
            else:
                self._entries[key] = Entry()
                return None
            self._refused[key] = (time.monotonic(), why)
            self._refused.move_to_end(key)
            while len(self._refused) > MAX_REFUSED:
                self._refused.popitem(last=False)
            return why

    def add(self, key: str, record: dict) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
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

    def finish(self, key: str) -> None:
        with self._lock:
            if key in self._entries:
                self._entries[key].finished = True

    def fetch(self, key: str, final: bool = False) -> dict | None:
        """The records made since the last fetch (they leave the store), or None for a key it does not hold.
        The request leaves with them when it has finished, or when the caller says this fetch is its last."""
        with self._lock:
            self._expire()
            refused = self._refused.pop(key, None)
            entry = self._entries.get(key)
            if entry is None:
                return None if refused is None else {"records": [], "finished": True, "error": refused[1]}
            records, entry.records, entry.touched = entry.records, [], time.monotonic()
            self.held_bytes -= entry.held_bytes
            entry.held_bytes = 0
            if entry.finished or final:
                del self._entries[key]
            answer = {"records": records, "finished": entry.finished, "dropped": entry.dropped}
            if entry.dropped:
                answer["dropped_why"] = (f"the probe holds at most {self.settings.max_record_bytes >> 20} MiB of "
                                         "unfetched records (EAGLE_PROBE_MAX_RECORD_BYTES)")
            if entry.turned_away:
                answer["turned_away"] = entry.turned_away
            return answer

    def fetch_many(self, asked: list[tuple[str, bool]]) -> dict:
        """Each asked key's answer, and the keys the store holds after them (the API process answers a fetch
        of any other key without calling the workers, until it asks again)."""
        answers = [self.fetch(key, final) for key, final in asked]
        with self._lock:
            self.fetch_calls += 1
            return {"answers": answers, "held": list(self._entries)}

    def live(self) -> int:
        """Requests recorded now (finished ones whose records wait for their fetch do not count)."""
        with self._lock:
            return sum(not e.finished for e in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.settings.idle_ttl_s
        # a live request leaves when vLLM reports it finished (aborted ones too); a finished one when fetched
        for key in [k for k, e in self._entries.items() if e.finished and e.touched < cutoff]:
            self.held_bytes -= self._entries.pop(key).held_bytes
        while self._refused and next(iter(self._refused.values()))[0] < cutoff:
            self._refused.popitem(last=False)
