"""One thread for a server's engine arithmetic: the process's main thread, which loads the model and
then runs every step that the server's threads hand it.

PyTorch's CPU kernels (ours too, through at::parallel_for) run on OpenMP, GNU libgomp in PyTorch's
wheels, which keeps a team of worker threads for every thread that starts parallel work and counts
the main thread among them from the start. Once more threads belong to teams than there are CPUs,
libgomp's workers stop spinning between parallel regions almost at once and are woken from sleep
for each one, and a decode step is hundreds of regions. A web server calls the engine from a pool of
threads, so on a 2-core AVX-512 EPYC EAGLE 3.1 decoded the Code preset at 105 tokens/s from a pool
thread (verify 21.7 ms a step), 123-130 from a thread that had loaded the model itself, and 160 on
the main thread (14.6 ms). The app therefore serves its engine's work on the main thread
(`serve_forever`) and runs Gradio beside it; a command-line run computes on its main thread anyway.
Between calls it runs on the CPUs other processes leave it (cpu_share says why).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

from playground.engines.cpu_share import CpuShare

T = TypeVar("T")
WAKE_S = 0.5   # how often a waiting serve_forever lets Python run signal handlers (SIGTERM, Ctrl-C)


class ComputeThread:
    """The thread that creates it, running the calls other threads hand it once it serves them."""

    def __init__(self, share: CpuShare | None = None):
        """`share`: where given, the thread count follows the CPUs left free, measured between calls."""
        self._owner = threading.current_thread()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._share = share

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) on the owner thread (at once where the caller is the owner), its result or
        its exception returned to the caller."""
        if threading.current_thread() is self._owner:
            return fn(*args, **kwargs)
        done: Future = Future()
        self._work.put((done, fn, args, kwargs))
        return done.result()

    def serve_forever(self) -> None:
        """Run the calls handed over, one at a time in the order they came, until an exception (SystemExit,
        KeyboardInterrupt) ends it. On the owner thread."""
        if threading.current_thread() is not self._owner:
            raise RuntimeError("a ComputeThread serves on the thread that created it")
        while True:
            if self._share:
                self._share.adjust()
            try:
                done, fn, args, kwargs = self._work.get(timeout=WAKE_S)
            except queue.Empty:
                continue
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as e:   # the caller's to handle, on its own thread; an exit ends the serving too
                done.set_exception(e)
                if not isinstance(e, Exception):
                    raise
