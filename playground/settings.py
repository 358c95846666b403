"""Where the page listens when no flag says: PLAYGROUND_* first, then Gradio's own GRADIO_SERVER_*
(what Spaces and other Gradio hosts set), then the defaults; and where the playground keeps what it
builds and measures once per machine (PLAYGROUND_CACHE)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 7860


def _setting(ours: str, gradio: str, default: str) -> str:
    return os.environ.get(ours) or os.environ.get(gradio) or default


def server_host() -> str:
    return _setting("PLAYGROUND_HOST", "GRADIO_SERVER_NAME", DEFAULT_HOST)


def server_port() -> int:
    return int(_setting("PLAYGROUND_PORT", "GRADIO_SERVER_PORT", str(DEFAULT_PORT)))


def cache_root() -> Path:
    """The model converted once, the CPU kernels, llama.cpp and each host's measured step costs."""
    return Path(os.environ.get("PLAYGROUND_CACHE", Path.home() / ".cache" / "eagle-playground"))
