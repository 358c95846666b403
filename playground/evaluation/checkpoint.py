"""What a long measurement has done so far, saved so that the same command goes on after an interruption."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any


class Checkpoint:
    """A pickle at `path` of the state of one measurement, identified by `key` (its configuration):
    a saved state of another configuration is never loaded."""

    def __init__(self, path: Path, key: Any):
        self.path, self.key = Path(path), key

    def load(self) -> Any | None:
        """The saved state; None when there is none, it is another configuration's, or it cannot be read
        (written by another version of the code): the measurement then starts afresh."""
        try:
            saved = pickle.loads(self.path.read_bytes())
            return saved["state"] if saved.get("key") == self.key else None
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, KeyError, TypeError):
            return None

    def save(self, state: Any) -> None:
        """Written whole to a temporary file first, so that an interruption never leaves half a file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps({"key": self.key, "state": state}))
        os.replace(tmp, self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
