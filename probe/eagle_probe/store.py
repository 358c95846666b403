"""The records of the requests being probed, in one worker process: bounded in number and in time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

MAX_REQUESTS = 64        # requests recorded at once; more are told so instead of recorded
MAX_STEPS = 8192         # records held per request between two fetches; later ones are dropped and counted
IDLE_TTL_S = 300.0       # a request neither updated nor fetched this long is dropped


@dataclass
class Entry:
    records: list[dict] = field(default_factory=list)
    finished: bool = False
    steps: int = 0           # records made so far, fetched or not
    dropped: int = 0         # records lost to MAX_STEPS
    touched: float = field(default_factory=time.monotonic)


class Store:
    def __init__(self, max_requests: int = MAX_REQUESTS, idle_ttl_s: float = IDLE_TTL_S):
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self.max_requests, self.idle_ttl_s = max_requests, idle_ttl_s
        self._refused: dict[str, float] = {}   # key -> when it was refused

    def open(self, key: str) -> bool:
        """Start recording `key` (a no-op if it is recorded); False when the store is full."""
        with self._lock:
            self._expire()
            if key in self._entries:
                return True
            if len(self._entries) >= self.max_requests:
                self._refused[key] = time.monotonic()
                return False
            self._entries[key] = Entry()
            return True

    def add(self, key: str, record: dict) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            record["step"] = entry.steps
            entry.steps += 1
            if len(entry.records) < MAX_STEPS:
                entry.records.append(record)
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
            if self._refused.pop(key, None) is not None:
                return {"records": [], "finished": True,
                        "error": f"not recorded: the probe records at most {self.max_requests} requests at once"}
            entry = self._entries.get(key)
            if entry is None:
                return None
            records, entry.records, entry.touched = entry.records, [], time.monotonic()
            if entry.finished or final:
                del self._entries[key]
            return {"records": records, "finished": entry.finished, "dropped": entry.dropped}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.idle_ttl_s
        for key in [k for k, e in self._entries.items() if e.touched < cutoff]:
            del self._entries[key]
        for key in [k for k, when in self._refused.items() if when < cutoff]:
            del self._refused[key]
