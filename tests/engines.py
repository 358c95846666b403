"""Engines for tests: the real engine, watched."""

import threading


class CountingEngine:
    """The real engine, counting its runs and interrupted (like Ctrl-C) at run number `stop_at`; it
    records whether each run's stream was closed or ran out."""

    def __init__(self, engine, stop_at: int | None = None):
        self.engine, self.stop_at, self.calls, self.ended = engine, stop_at, 0, []
        self._counting = threading.Lock()   # studies run several prompts at once

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, request):
        with self._counting:
            self.calls += 1
            call = self.calls
        if call == self.stop_at:
            raise KeyboardInterrupt
        return self._watched(self.engine.generate(request), call)

    def _watched(self, stream, call: int):
        try:
            yield from stream
        finally:
            self.ended.append(call)
