"""A vLLM stream's steps stamped when they arrive, however slowly the page reads them (arrivals.py;
tests/test_vllm.py has the same on a real server, read beside a slower column)."""

import itertools
import threading
import time

import pytest

from playground.engines.vllm.arrivals import stamped
from playground.errors import PlaygroundError


def test_a_stream_read_slowly_is_stamped_as_it_arrived_and_raises_its_error_where_it_is_read():
    def server():   # three items 0.05 s apart, then the connection drops
        for item in range(3):
            time.sleep(0.05)
            yield item
        raise PlaygroundError("closed mid-stream")

    started, seen = time.perf_counter(), []
    with pytest.raises(PlaygroundError, match="closed mid-stream"):
        for arrived, item in stamped(server()):
            seen.append((arrived - started, item))
            time.sleep(0.3)   # a reader far slower than the stream
    assert [item for _, item in seen] == [0, 1, 2]
    assert seen[-1][0] < 0.25   # all three had arrived before the reader took the second


def test_closing_the_stream_has_closed_what_it_reads_when_it_returns():
    """Whoever closes a stream (a page that stopped reading) then drops the request's records in the
    probe: by then the response must be closed, or the server would go on stepping a request the probe forgot."""
    closed = threading.Event()

    def server():
        try:
            for item in itertools.count():
                time.sleep(0.05)
                yield item
        finally:
            closed.set()   # where the HTTP response is closed, and the server stops the request

    stream = stamped(server())
    next(stream)
    stream.close()
    assert closed.is_set()
