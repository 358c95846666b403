"""What the target's projections are read from: float32 matrices (f32), or the embedded GGUF's own
Q4_1 / Q8_0 blocks (gguf), dequantized by our CPU kernels as they are read: the same numbers, so the
same tokens, from a fifth of the bytes (model/gguf_blocks.py); auto: the blocks wherever they can be
read (the embedded target, float32, on a CPU where our kernels run), else float32."""

from __future__ import annotations

import os

WEIGHTS = ("auto", "f32", "gguf")
WEIGHTS_ENV = "PLAYGROUND_WEIGHTS"


def default_weights() -> str:
    """$PLAYGROUND_WEIGHTS, else auto."""
    return os.environ.get(WEIGHTS_ENV) or "auto"
