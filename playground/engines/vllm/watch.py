"""Live acceptance of vLLM deployments: each server's counters read every few seconds, and what they
say over a sliding window, for all the traffic the servers serve.

    python -m playground watch --vllm-url prod=http://10.0.0.5:8000 --vllm-url canary=http://10.0.0.6:8000

Every figure is a counter delta between the oldest and newest reading in the window. A server
that restarted (a counter went back, its process start time or its draft positions changed)
starts the window again from that reading, and the view says so, rather than showing a negative
rate; so does a reading after a gap longer than the window. A server that does not answer, or
answers with something other than vLLM's metrics, is marked so, without figures, until it
answers again; its earlier readings stay.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import httpx

from playground.engines.vllm.api import http_client
from playground.engines.vllm.metrics import MetricsError, SpecCounters, read_counters
from playground.engines.vllm.urls import server_urls
from playground.errors import PlaygroundError

LIVE = "live"
RESTARTED = "restarted"
UNREACHABLE = "unreachable"
BAD_METRICS = "bad metrics"
NO_SPECULATION = "no speculation"
MAX_NOTE = 200   # characters of a server's error shown: its own words, not a page of them


@dataclass(frozen=True)
class WindowView:
    """One server over the window. Rates are None until two readings span some time; acceptance
    figures are None while no drafts were verified in the window."""
    name: str
    url: str
    state: str                                  # LIVE, RESTARTED, UNREACHABLE, BAD_METRICS or NO_SPECULATION
    note: str                                   # why, for the states other than LIVE
    positions: int                              # draft positions the server counts (its k)
    seconds: float                              # the time the window's readings span
    drafts: float | None                        # verify steps with drafts in the window
    tau: float | None                           # 1 + accepted / drafts
    acceptance: tuple[float, ...] | None        # by draft position: accepted there / drafts
    drafted_per_s: float | None
    accepted_per_s: float | None
    generation_per_s: float | None
    running: float | None
    waiting: float | None

    def as_json(self) -> dict:
        return asdict(self)


class ServerWindow:
    """The readings of one server over the last `window` seconds."""

    def __init__(self, name: str, url: str, window: float):
        self.name, self.url, self.window = name, url.rstrip("/"), window
        self.readings: deque[tuple[float, SpecCounters]] = deque()
        self.restarted_at: float | None = None

    def add(self, at: float, counters: SpecCounters) -> None:
        if self.readings and at <= self.readings[-1][0]:
            return   # a reading already added (shared between watches)
        if self.readings and counters.went_back_from(self.readings[-1][1]):
            self.readings.clear()
            self.restarted_at = at
        elif self.readings and at - self.readings[-1][0] > self.window:
            self.readings.clear()   # figures over the gap would pass for the window's
        self.readings.append((at, counters))
        while len(self.readings) > 1 and self.readings[1][0] <= at - self.window:
            self.readings.popleft()   # keep the last reading at or before the window's start
        if self.restarted_at is not None and self.restarted_at <= at - self.window:
            self.restarted_at = None

    def view(self, problem: tuple[str, str] | None = None) -> WindowView:
        """The window's figures, or only `problem` (state, note) when the last reading failed."""
        empty = dict(positions=0, seconds=0.0, drafts=None, tau=None, acceptance=None, drafted_per_s=None,
                     accepted_per_s=None, generation_per_s=None, running=None, waiting=None)
        if problem or not self.readings:
            state, note = problem or (UNREACHABLE, "no reading yet")
            return WindowView(self.name, self.url, state, note, **empty)
        (first_at, first), (last_at, last) = self.readings[0], self.readings[-1]
        seconds = last_at - first_at
        rate = (lambda delta: delta / seconds) if seconds > 0 else (lambda delta: None)
        drafts = (last.drafts or 0.0) - (first.drafts or 0.0) if last.speculative else None
        figures = dict(positions=len(last.accepted_per_position), seconds=seconds,
                       drafts=drafts if seconds > 0 else None,
                       generation_per_s=rate(last.generation_tokens - first.generation_tokens),
                       running=last.running, waiting=last.waiting,
                       drafted_per_s=rate(last.draft_tokens - first.draft_tokens) if last.speculative else None,
                       accepted_per_s=rate(last.accepted - first.accepted) if last.speculative else None,
                       tau=None, acceptance=None)
        if drafts:
            figures["tau"] = 1 + (last.accepted - first.accepted) / drafts
            figures["acceptance"] = tuple((last.position(d) - first.position(d)) / drafts
                                          for d in range(len(last.accepted_per_position)))
        if self.restarted_at is not None:
            state, note = RESTARTED, (f"counters reset {time.strftime('%H:%M:%S', time.localtime(self.restarted_at))}"
                                      ": the window starts there")
        elif not last.speculative:
            state, note = NO_SPECULATION, "the server does not speculate"
        else:
            state, note = LIVE, ""
        return WindowView(self.name, self.url, state, note, **figures)


class RecentReadings:
    """The latest reading of each URL, shared by the watches of one process (a page's visitors), so
    that a server is read at most once per `fresh_s` however many watch it: its /metrics is
    rendered on the loop that streams its tokens."""

    def __init__(self, fresh_s: float):
        self.fresh_s = fresh_s
        self.lock = threading.Lock()
        self.url_locks: dict[str, threading.Lock] = {}
        self.latest: dict[str, tuple[float, SpecCounters | PlaygroundError]] = {}

    def read(self, client: httpx.Client, url: str, clock: Callable[[], float]) -> tuple[float, SpecCounters]:
        """(when, counters) of a recent reading or a new one; a failed reading raises its error. Readers of
        one URL take turns: one reads it, those who arrive meanwhile get that reading."""
        with self.lock:
            url_lock = self.url_locks.setdefault(url, threading.Lock())
        with url_lock:
            at, result = self.latest.get(url, (None, None))
            now = clock()
            if at is None or now - at >= self.fresh_s:
                try:
                    result = read_counters(client, url)
                except PlaygroundError as e:
                    result = e
                at = now
                self.latest[url] = (at, result)
        if isinstance(result, PlaygroundError):
            raise result
        return at, result


class Watch:
    """Servers (name -> URL) watched together; `read()` reads them all at once and returns their views."""

    def __init__(self, servers: dict[str, str], window: float = 60.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time, shared: RecentReadings | None = None,
                 api_key: str | None = None):
        if not servers:
            raise PlaygroundError("watch needs at least one server: NAME=URL")
        self.windows = [ServerWindow(name, url, window) for name, url in servers.items()]
        self.client = http_client(api_key, httpx.Timeout(timeout, connect=min(timeout, 2.0)))
        self.pool = ThreadPoolExecutor(len(self.windows), thread_name_prefix="watch")
        self.clock = clock
        self.readings = shared or RecentReadings(fresh_s=0.0)

    def read(self) -> list[WindowView]:
        return list(self.pool.map(self._read, self.windows))

    def _read(self, window: ServerWindow) -> WindowView:
        try:
            at, counters = self.readings.read(self.client, window.url, self.clock)
        except MetricsError as e:
            return window.view((BAD_METRICS, _short(str(e))))
        except PlaygroundError as e:
            return window.view((UNREACHABLE, _short(str(e))))
        window.add(at, counters)
        return window.view()

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()


def _short(message: str) -> str:
    """One line of at most MAX_NOTE characters."""
    line = " ".join(message.split())
    return line if len(line) <= MAX_NOTE else line[:MAX_NOTE - 1] + "…"


def parse_servers(specs: list[str], flag: str = "--vllm-url") -> dict[str, str]:
    """NAME=URL pairs under any names (a label here); a bare URL is named by its host and port."""
    return server_urls(specs, flag, lambda url: f"{url.host}:{url.port}" if url.port else url.host)


def text_table(views: list[WindowView], at: float) -> str:
    """The views as aligned columns, a line under the table for each server not live."""
    depths = max((v.positions for v in views), default=0)
    header = ["server", "state", "tau", *(f"pos {d}" for d in range(depths)),
              "drafted/s", "accepted/s", "output tok/s", "running", "waiting", "window"]
    padded = lambda v: (v.acceptance or ()) + (None,) * (depths - len(v.acceptance or ()))
    rows = [[v.name, v.state, figure_text(v.tau), *(figure_text(a) for a in padded(v)),
             figure_text(v.drafted_per_s, 1), figure_text(v.accepted_per_s, 1), figure_text(v.generation_per_s, 1),
             figure_text(v.running, 0), figure_text(v.waiting, 0), f"{v.seconds:.0f} s"] for v in views]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [time.strftime("%H:%M:%S", time.localtime(at))]
    aligned = lambda i, cell: str(cell).ljust(widths[i]) if i < 2 else str(cell).rjust(widths[i])
    lines += ["  ".join(aligned(i, cell) for i, cell in enumerate(row)) for row in [header, *rows]]
    lines += [f"  {v.name}: {v.note}" for v in views if v.note]
    return "\n".join(lines)


def figure_text(value: float | None, digits: int = 2) -> str:
    """A figure as shown, "–" where there is none."""
    return "–" if value is None else f"{value:.{digits}f}"
