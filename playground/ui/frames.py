"""What a page has drawn of the runs it streams, so that a page slower than the server is not buried.

Each streamed update of a page event carries the event's id and its number (a hidden mark beside the
running figures, `render.frame_mark`); the page posts the number it has drawn to DRAWN_PATH once it is
on screen. While the oldest update the page has not drawn was sent MAX_LAG_S ago or longer, the event
sends no further ones: the runs' steps go on (no speed changes), and the next update, when the page has
caught up, shows them all; the last update is always sent. Without this a browser that draws slower than
the updates come (a slow phone, a host whose browser shares the CPU with the engine) queues them, draws
seconds behind the server, and its Stop button waits behind the queue. A consumer that never tells what
it drew (an API client) gets every update."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DRAWN_PATH = "/frame-drawn"
MAX_LAG_S = 1.0         # how long an update may wait to be drawn before the page gets no more
MAX_BODY_BYTES = 200    # what the page posts: {"run": "<32 hex digits>", "frame": <number>}


class PageFrames:
    """The updates of one page event: numbered as they are sent, and drawn as its page tells."""

    def __init__(self, run: str, clock: Callable[[], float]):
        self.run, self._clock = run, clock
        self._sent: deque[tuple[int, float]] = deque()   # (number, when) of the updates not yet drawn
        self._count = 0
        self._told = False   # whether the page ever said what it drew

    def send(self) -> int:
        """The next update's number; it counts as sent now."""
        self._count += 1
        self._sent.append((self._count, self._clock()))
        return self._count

    def drawn(self, number: int) -> None:
        self._told = True
        while self._sent and self._sent[0][0] <= number:
            self._sent.popleft()

    def behind(self, max_lag_s: float) -> bool:
        """Whether the page is too far behind for another update."""
        return self._told and bool(self._sent) and self._clock() - self._sent[0][1] >= max_lag_s


class DrawnFrames:
    """Every streaming page event's PageFrames, by its id, while it streams."""

    def __init__(self, max_lag_s: float = MAX_LAG_S, clock: Callable[[], float] = time.monotonic):
        self.max_lag_s, self._clock = max_lag_s, clock
        self._lock = threading.Lock()
        self._events: dict[str, PageFrames] = {}

    @contextmanager
    def event(self) -> Iterator[PageFrames]:
        frames = PageFrames(secrets.token_hex(16), self._clock)
        with self._lock:
            self._events[frames.run] = frames
        try:
            yield frames
        finally:
            with self._lock:
                del self._events[frames.run]

    def send(self, frames: PageFrames) -> int:
        with self._lock:
            return frames.send()

    def tell(self, run: str, number: int) -> None:
        """The page drew update `number` of event `run` (an event that has ended, or never was, is ignored)."""
        with self._lock:
            if run in self._events:
                self._events[run].drawn(number)

    def behind(self, frames: PageFrames) -> bool:
        with self._lock:
            return frames.behind(self.max_lag_s)


DRAWN_FRAMES = DrawnFrames()


async def frame_drawn(request: Request) -> Response:
    """POST DRAWN_PATH: the page drew an update. 204 whatever the event; 400 for a body that is not one."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return Response("too long", status_code=400)
    try:
        told = json.loads(body)
        run, number = told["run"], told["frame"]
    except (ValueError, TypeError, KeyError):
        return Response('expected {"run": ..., "frame": ...}', status_code=400)
    if not isinstance(run, str) or not isinstance(number, int) or isinstance(number, bool):
        return Response("run must be text and frame a whole number", status_code=400)
    DRAWN_FRAMES.tell(run, number)
    return Response(status_code=204)


ROUTES = [Route(DRAWN_PATH, frame_drawn, methods=["POST"])]
