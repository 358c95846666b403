"""Few malloc arenas for a server process that answers many visitors from a pool of threads.

glibc gives a thread that allocates while the other arenas are busy an arena of its own, up to eight
per core, and each arena keeps the freed memory its threads left fragmented. Gradio runs each visitor's
handler on a pool of worker threads, so concurrent runs spread their freed tensors over up to sixteen
arenas on two cores: twenty visitors at once grew the app by 40-160 MiB a wave, eight waves on end.
With one arena per core the same waves grew it once (+27 to +84 MiB) and then by 14 MiB a wave at
most. Only as many threads run at once as there are cores, so more arenas buy no speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8   # glibc's malloc.h


def limit_arenas(arenas: int | None = None) -> bool:
    """Cap glibc's malloc arenas at `arenas` (default: the cores this process may run on) for the
    threads that start allocating from now on. Call it before the server starts its threads. A cap
    set in MALLOC_ARENA_MAX is left as it is. False where the C library is not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return True
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return libc.mallopt(M_ARENA_MAX, arenas or len(os.sched_getaffinity(0))) == 1
