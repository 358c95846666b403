"""Controls whose values reach the endpoint as sent, for the settings' own validation to check.

Gradio checks a slider's range and a dropdown's choices before any function runs, and when the
endpoint has a validator (endpoints.input_validator) a failed check reaches an API caller as a bare
HTTP 400 with no message. These controls leave the check to streams.make_request, which names the
setting at fault: the page shows its message at the control, an API caller gets it as the error.
Each is drawn as the Gradio control it extends.
"""

from __future__ import annotations

from typing import Any

import gradio as gr


class AsSent:
    """Mixed in before a Gradio control: its value passes as sent, and it is drawn as that control."""

    def preprocess(self, payload: Any) -> Any:
        return payload

    def get_block_name(self) -> str:
        return type(self).__mro__[2].__name__.lower()   # the class, this mixin, then the Gradio control


class Slider(AsSent, gr.Slider):
    pass


class Number(AsSent, gr.Number):
    pass


class Dropdown(AsSent, gr.Dropdown):
    pass


class Radio(AsSent, gr.Radio):
    pass


class CheckboxGroup(AsSent, gr.CheckboxGroup):
    pass
