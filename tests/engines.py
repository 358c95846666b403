"""Engines for tests: the real engine, watched."""


class CountingEngine:
    """The real engine, counting its runs and interrupted (like Ctrl-C) at run number `stop_at`; it
    records whether each run's stream was closed or ran out."""

    def __init__(self, engine, stop_at: int | None = None):
        self.engine, self.stop_at, self.calls, self.ended = engine, stop_at, 0, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, request):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return self._watched(self.engine.generate(request), self.calls)

    def _watched(self, stream, call: int):
        try:
            yield from stream
        finally:
            self.ended.append(call)
