"""The one loop that times a call for the benchmarks: warm it, then time each repeat alone."""

from __future__ import annotations

import time
from typing import Callable


def timings(call: Callable[[], object], repeats: int, setup: Callable[[], object] = lambda: None,
            warmup: int = 1) -> list[float]:
    """Seconds of each of `repeats` calls of `call`, each after `setup` (not timed: e.g. a cache cut back to
    its context), after `warmup` calls that are not timed either."""
    for _ in range(warmup):
        setup()
        call()
    seconds = []
    for _ in range(repeats):
        setup()
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds
