"""A server's stream read as it arrives: each item stamped with the moment it came in, by a thread
of its own.

A consumer that reads several streams in turn (the Comparison tab, one step of each column after
the other) would otherwise stamp a fast server's steps when it got round to them, so that every
column's time followed the slowest column's. Stamped on arrival, a run's `elapsed_s` is its own
server's time, however the page reads it.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator, TypeVar

T = TypeVar("T")
_END = object()
CLOSE_WAIT_S = 5.0   # how long closing waits for the reader to close the response (it does at the next item)


def stamped(items: Iterator[T]) -> Iterator[tuple[float, T]]:
    """(time.perf_counter() when the item arrived, item) for each item of `items`, which a reader thread
    drains; its exception is raised here, in order. Closing this generator stops the reader at its
    next item, which closes `items` (and with it the server's response), and waits for that, up to
    CLOSE_WAIT_S: whoever closes the stream may then count on the server having seen it go."""
    arrived: queue.SimpleQueue = queue.SimpleQueue()
    closed = threading.Event()

    def read() -> None:
        try:
            for item in items:
                arrived.put((time.perf_counter(), item))
                if closed.is_set():
                    break
            arrived.put(_END)
        except BaseException as error:   # handed to the consumer, who raises it where the stream is read
            arrived.put(error)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    reader = threading.Thread(target=read, name="stream-reader", daemon=True)
    reader.start()
    try:
        while (entry := arrived.get()) is not _END:
            if isinstance(entry, BaseException):
                raise entry
            yield entry
    finally:
        closed.set()
        reader.join(CLOSE_WAIT_S)
