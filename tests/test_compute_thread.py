"""The app's one compute thread: work handed over runs on the thread that made it, in order, and its
results and errors come back to the caller."""

import sys
import threading

import pytest

from playground.engines.compute_thread import ComputeThread


def test_work_from_other_threads_runs_on_the_owner_and_comes_back():
    compute = ComputeThread()
    owner = threading.current_thread()
    seen, answers = [], {}

    def where(i: int) -> int:
        seen.append((i, threading.current_thread() is owner))
        return i * i

    def caller(i: int) -> None:
        answers[i] = compute.call(where, i)
        with pytest.raises(ZeroDivisionError):
            compute.call(lambda: 1 / 0)

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in callers:
        t.start()

    def finish() -> None:
        for t in callers:
            t.join()
        with pytest.raises(SystemExit):   # the caller hears of the exit too
            compute.call(sys.exit, 0)

    finisher = threading.Thread(target=finish)
    finisher.start()
    with pytest.raises(SystemExit):
        compute.serve_forever()
    finisher.join(timeout=10)
    assert not finisher.is_alive()
    assert answers == {i: i * i for i in range(4)}
    assert sorted(seen) == [(i, True) for i in range(4)]
    assert compute.call(where, 5) == 25 and seen[-1] == (5, True)   # the owner's own call runs at once


def test_only_the_owner_serves():
    compute = ComputeThread()
    failed = []
    worker = threading.Thread(target=lambda: failed.append(pytest.raises(RuntimeError, compute.serve_forever)))
    worker.start()
    worker.join()
    assert failed
