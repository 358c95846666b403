"""The probe's limits, each from an environment variable of the server (defaults in brackets).

The defaults fit beside vLLM's own budget on a 24 GiB host and on an 80 GB GPU: the key copies
(EAGLE_PROBE_MAX_KEY_BYTES) are the only memory the probe takes on the device, outside
`gpu_memory_utilization`, and no copy is made or grown past them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class Settings:
    max_requests: int = 16               # EAGLE_PROBE_MAX_REQUESTS: requests recorded at once
    max_held: int = 64                   # EAGLE_PROBE_MAX_HELD: requests held, live or with records waiting
    max_positions: int = 32768           # EAGLE_PROBE_MAX_POSITIONS: positions of one request's key copy
    max_key_bytes: int = 512 * MiB       # EAGLE_PROBE_MAX_KEY_BYTES: all key copies of a worker together
    max_record_bytes: int = 64 * MiB     # EAGLE_PROBE_MAX_RECORD_BYTES: unfetched records of a worker (as JSON)
    max_waiting: int = 1024              # EAGLE_PROBE_MAX_WAITING: fetches of keys not held waiting at once (API
                                         # process)
    idle_ttl_s: float = 120.0            # EAGLE_PROBE_IDLE_TTL_S: a finished request's records wait this long
    status_memory: int = 0               # EAGLE_PROBE_STATUS_MEMORY=1: /status shows the probe's bytes, which
                                         # tell every caller how long the recorded prompts are

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        values = {}
        for name, default in cls().__dict__.items():
            given = env.get(f"EAGLE_PROBE_{name.upper()}")
            if given:
                try:
                    values[name] = type(default)(given)
                except ValueError:
                    raise ValueError(f"EAGLE_PROBE_{name.upper()}={given!r} is not a number") from None
        return cls(**values)

    @classmethod
    def read(cls) -> "Settings":
        """The server's settings; the defaults where one is not a number (said in the log)."""
        try:
            return cls.from_env()
        except ValueError as e:
            logging.getLogger("eagle_probe").warning("eagle_probe: %s; the defaults apply", e)
            return cls()

    def describe(self) -> dict:
        return dict(self.__dict__)
