"""What the target's projections are read from: float32 matrices (f32), or the embedded GGUF's own
Q4_1 / Q8_0 blocks (gguf), dequantized by our CPU kernels as they are read: the same numbers, so the
same tokens, from a fifth of the bytes (model/gguf_blocks.py)."""

from __future__ import annotations

import os

WEIGHTS = ("f32", "gguf")
WEIGHTS_ENV = "PLAYGROUND_WEIGHTS"


def default_weights() -> str:
    """$PLAYGROUND_WEIGHTS, else f32."""
    return os.environ.get(WEIGHTS_ENV) or "f32"
