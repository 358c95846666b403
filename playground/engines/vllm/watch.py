"""Live acceptance of vLLM deployments: each server's counters read every few seconds, and what they
say over a sliding window, for all the traffic the servers serve.

    python -m playground watch --vllm-url prod=http://10.0.0.5:8000 --vllm-url canary=http://10.0.0.6:8000

Every figure is a counter delta between the oldest and newest reading in the window. A counter
that goes down means the server restarted: the window starts again from that reading and the view
says so, rather than showing a negative rate. A server that does not answer, or answers with
something other than vLLM's metrics, keeps its readings and is marked so until it answers again.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from playground.engines.vllm.metrics import MetricsError, SpecCounters, read_counters
from playground.errors import PlaygroundError

LIVE = "live"
RESTARTED = "restarted"
UNREACHABLE = "unreachable"
BAD_METRICS = "bad metrics"
NO_SPECULATION = "no speculation"


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
        return {field: (list(value) if isinstance(value, tuple) else value) for field, value in vars(self).items()}


class ServerWindow:
    """The readings of one server over the last `window` seconds."""

    def __init__(self, name: str, url: str, window: float):
        self.name, self.url, self.window = name, url.rstrip("/"), window
        self.readings: deque[tuple[float, SpecCounters]] = deque()
        self.restarted_at: float | None = None

    def add(self, at: float, counters: SpecCounters) -> None:
        if self.readings and counters.went_back_from(self.readings[-1][1]):
            self.readings.clear()
            self.restarted_at = at
        self.readings.append((at, counters))
        while len(self.readings) > 1 and self.readings[1][0] <= at - self.window:
            self.readings.popleft()   # keep the last reading at or before the window's start
        if self.restarted_at is not None and self.restarted_at <= at - self.window:
            self.restarted_at = None

    def view(self, problem: tuple[str, str] | None = None) -> WindowView:
        """The window's figures; `problem` (state, note) when the last reading failed."""
        empty = dict(positions=0, seconds=0.0, drafts=None, tau=None, acceptance=None, drafted_per_s=None,
                     accepted_per_s=None, generation_per_s=None, running=None, waiting=None)
        if not self.readings:
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
        if problem:
            state, note = problem
        elif self.restarted_at is not None:
            state, note = RESTARTED, (f"counters reset {time.strftime('%H:%M:%S', time.localtime(self.restarted_at))}"
                                      ": the window starts there")
        elif not last.speculative:
            state, note = NO_SPECULATION, "the server does not speculate"
        else:
            state, note = LIVE, ""
        return WindowView(self.name, self.url, state, note, **figures)


class Watch:
    """Servers (name -> URL) watched together; `read()` reads each once and returns their views."""

    def __init__(self, servers: dict[str, str], window: float = 60.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time):
        if not servers:
            raise PlaygroundError("watch needs at least one server: --vllm-url NAME=URL")
        self.windows = [ServerWindow(name, url, window) for name, url in servers.items()]
        self.client = httpx.Client(timeout=timeout)
        self.clock = clock

    def read(self) -> list[WindowView]:
        views = []
        for window in self.windows:
            try:
                counters = read_counters(self.client, window.url)
            except MetricsError as e:
                views.append(window.view((BAD_METRICS, str(e))))
                continue
            except PlaygroundError as e:
                views.append(window.view((UNREACHABLE, str(e))))
                continue
            window.add(self.clock(), counters)
            views.append(window.view())
        return views

    def close(self) -> None:
        self.client.close()


def parse_servers(specs: list[str]) -> dict[str, str]:
    """NAME=URL pairs under any names; a bare URL is named by its host and port."""
    servers: dict[str, str] = {}
    for spec in specs:
        head, sep, rest = spec.partition("://")
        name, _, scheme = head.rpartition("=")
        url = (scheme + sep + rest).strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise PlaygroundError(f"bad --vllm-url {spec!r}: use NAME=URL, the URL starting with http:// or https://")
        name = name.strip() or url.split("://", 1)[1]
        if name in servers:
            raise PlaygroundError(f"--vllm-url names {name} twice")
        servers[name] = url
    return servers


def text_table(views: list[WindowView], at: float) -> str:
    """The views as aligned columns, a line under the table for each server not live."""
    depths = max((v.positions for v in views), default=0)
    header = ["server", "state", "tau", *(f"pos {d}" for d in range(depths)),
              "drafted/s", "accepted/s", "output tok/s", "running", "waiting", "window"]
    padded = lambda v: (v.acceptance or ()) + (None,) * (depths - len(v.acceptance or ()))
    rows = [[v.name, v.state, _figure(v.tau), *(_figure(a) for a in padded(v)),
             _figure(v.drafted_per_s, 1), _figure(v.accepted_per_s, 1), _figure(v.generation_per_s, 1),
             _figure(v.running, 0), _figure(v.waiting, 0), f"{v.seconds:.0f} s"] for v in views]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [time.strftime("%H:%M:%S", time.localtime(at))]
    aligned = lambda i, cell: str(cell).ljust(widths[i]) if i < 2 else str(cell).rjust(widths[i])
    lines += ["  ".join(aligned(i, cell) for i, cell in enumerate(row)) for row in [header, *rows]]
    lines += [f"  {v.name}: {v.note}" for v in views if v.note]
    return "\n".join(lines)


def _figure(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
