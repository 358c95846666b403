"""Few malloc arenas, and freed memory handed back, for a server process that answers many visitors
from a pool of threads.

glibc gives a thread that allocates while the other arenas are busy an arena of its own, up to eight
per core, and each arena keeps the freed memory its threads left fragmented. Gradio runs each visitor's
handler on a pool of worker threads, so concurrent runs spread their freed tensors over up to sixteen
arenas on two cores: twenty visitors at once grew the app by 40-160 MiB a wave, eight waves on end.
With one arena per core the same waves grew it once (+27 to +84 MiB) and then by 14 MiB a wave at
most. Only as many threads run at once as there are cores, so more arenas buy no speed.

The free pages the arenas still hold go back to the system when the page falls idle (release_freed):
the warmed-up idle app measured 777-791 MiB that way, 854 without.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8   # glibc's malloc.h


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


_LIBC = _glibc()


def limit_arenas(arenas: int | None = None) -> bool:
    """Cap glibc's malloc arenas at `arenas` (default: the cores this process may run on) for the
    threads that start allocating from now on. Call it before the server starts its threads. A cap
    set in MALLOC_ARENA_MAX is left as it is. False where the C library is not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return True
    if _LIBC is None:
        return False
    return _LIBC.mallopt(M_ARENA_MAX, arenas or len(os.sched_getaffinity(0))) == 1


def release_freed() -> None:
    """Hand the free pages of every arena back to the system (glibc keeps them for later mallocs
    otherwise). A few milliseconds on a 1 GiB heap; a no-op where the C library is not glibc."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
