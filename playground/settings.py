"""Where the page listens when no flag says: PLAYGROUND_* first, then Gradio's own GRADIO_SERVER_*
(what Spaces and other Gradio hosts set), then the defaults."""

from __future__ import annotations

import os

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 7860


def _setting(ours: str, gradio: str, default: str) -> str:
    return os.environ.get(ours) or os.environ.get(gradio) or default


def server_host() -> str:
    return _setting("PLAYGROUND_HOST", "GRADIO_SERVER_NAME", DEFAULT_HOST)


def server_port() -> int:
    return int(_setting("PLAYGROUND_PORT", "GRADIO_SERVER_PORT", str(DEFAULT_PORT)))
