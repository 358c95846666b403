"""The probe's stores filled to their bounds, and the Python memory each holds then (tracemalloc): the
worker's store at EAGLE_PROBE_MAX_HELD requests with EAGLE_PROBE_MAX_RECORD_BYTES of records and
MAX_REFUSED refusals, and the API process's fetches at EAGLE_PROBE_MAX_WAITING keys not held, each with
MAX_WAITERS_PER_KEY waiting. Usage: python -m devtools.probe_bounds"""

from __future__ import annotations

import asyncio
import copy
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))

from eagle_probe.keys import key_for, rpc_token, secret_of  # noqa: E402
from eagle_probe.routes import MAX_WAITERS_PER_KEY, Fetches  # noqa: E402
from eagle_probe.settings import Settings  # noqa: E402
from eagle_probe.store import MAX_REFUSED, Store  # noqa: E402

SECRET = secret_of("an API key")
# one verify step's record as the hooks make it at k=5, per-head attention off
RECORD = {"request": "cmpl-0123456789abcdef0123456789abcdef-0-1a2b3c4d", "drafts": [1234] * 5, "accepted": 3,
          "tokens": [4321] * 4, "hidden_rms": [1.2345678] * 5, "draft_probs": [0.12345678] * 5, "probe_ms": 3.456,
          "sink_attention": [0.0123456] * 5, "self_attention": [0.123456] * 5, "rest_attention": [0.8765432] * 5}


def mib(bytes_: int) -> str:
    return f"{bytes_ / 2**20:.1f} MiB"


def store_at_bounds(settings: Settings) -> None:
    tracemalloc.start()
    store = Store(settings)
    store.configure([SECRET], rpc_token(["an API key"]))
    keys = [key_for(SECRET, f"{n:032x}") for n in range(settings.max_held + MAX_REFUSED)]
    for n, key in enumerate(keys[:settings.max_held]):
        assert store.admit(key, f"cmpl-{n}-0-1a2b3c4d") is None
        if n >= settings.max_requests - 1:
            store.finish(key, f"cmpl-{n}-0-1a2b3c4d")
    records = 0
    while store.held_bytes + 400 < settings.max_record_bytes:
        n = records % settings.max_held
        store.add(keys[n], f"cmpl-{n}-0-1a2b3c4d", copy.deepcopy(RECORD))   # its own lists, as the hooks make
        records += 1
    full = Store(Settings(max_requests=0))
    full.configure([SECRET], rpc_token(["an API key"]))
    for n, key in enumerate(keys[settings.max_held:]):
        full.admit(key, f"cmpl-r{n}")
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"worker store: {len(store)} requests held, {records:,} records = {mib(store.held_bytes)} of JSON, "
          f"{len(full._refused)} refusals: {mib(used)} of Python memory")


async def fetches_at_bounds(settings: Settings) -> None:
    tracemalloc.start()
    fetches = Fetches(probe=None, max_waiting=settings.max_waiting)
    fetches.held_at = float("inf")   # no call to the workers is due: the fetches only wait
    fetches.pump = asyncio.get_running_loop().create_future()   # a pump that never runs
    waits = [asyncio.ensure_future(fetches.fetch(key_for(SECRET, f"{n:032x}"), "cmpl-any", True))
             for n in range(settings.max_waiting) for _ in range(MAX_WAITERS_PER_KEY)]
    await asyncio.sleep(0)
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    for wait in waits:
        wait.cancel()
    print(f"API process: {len(fetches.waiting)} keys waiting, {len(waits)} fetches: {mib(used)} of Python memory "
          "(the fetches' HTTP connections come on top, as for any route)")


if __name__ == "__main__":
    settings = Settings()
    store_at_bounds(settings)
    asyncio.run(fetches_at_bounds(settings))
