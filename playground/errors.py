"""The one exception type for bad input and unavailable resources.

Consumers (CLI, UI) show its message as-is; anything else is a bug and keeps its traceback.
"""


class PlaygroundError(ValueError):
    """A problem the user can fix: bad input, a missing file, an unreachable server. `setting` names the
    request field at fault, when one is (the page shows the message at that control)."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting
