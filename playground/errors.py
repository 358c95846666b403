"""The one exception type for bad input and unavailable resources.

Consumers (CLI, UI) show its message as-is; anything else is a bug and keeps its traceback.
"""


class PlaygroundError(ValueError):
    """A problem the user can fix: bad input, a missing file, an unreachable server."""
