"""What the page's streaming endpoints take and give, by name.

A settings dataclass per endpoint names its controls; its field order is the endpoint's positional
order for `gradio_client` callers (`client.predict(prompt, system, ..., api_name="/run")`), so a new
control is a new field at the end. Outputs are named too: a handler yields {output name: value}, and
the name tuples below fix the order the API returns them in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import gradio as gr
from gradio.components import Component

from playground.errors import PlaygroundError

log = logging.getLogger("playground.ui")

SLOTS = ("first", "second", "none")   # the Comparison tab's columns; element ids end with the slot
COLUMN_PARTS = ("cards", "answer", "text")
PLOTS = ("acceptance_plot", "attention_plot", "norm_plot")   # in the order of plots.all_figures


@dataclass(frozen=True)
class RunSettings:
    """The Playground tab's controls: what /run takes, in its positional order."""
    prompt: str
    system: str
    template: str
    drafter: str
    k: float
    temperature: float
    top_p: float
    max_tokens: float
    backend_name: str
    draft: str            # "chain" or "tree"
    tree_top_k: float
    tree_depth: float
    tree_nodes: float
    seed: float = -1      # streams.NEW_SEED: a new seed every run
    beside: bool = True   # also run the drafter paired with this one (controls.beside_name), for the plots
    draft_stop: str = ""  # a chain ends at the first draft meeting this rule (engines/draft_stop.py); empty: none
    k_auto: bool = False  # k chosen by this host's measured costs (evaluation/k_choice.py), not the slider


@dataclass(frozen=True)
class CompareSettings:
    """The Comparison tab's controls: what /compare takes, in its positional order."""
    prompt: str
    system: str
    template: str
    k: float
    temperature: float
    top_p: float
    max_tokens: float
    with_none: bool       # also run without speculation
    backend_name: str
    draft: str
    tree_top_k: float
    tree_depth: float
    tree_nodes: float
    compare: str          # compare_tab.DRAFTERS, CHAIN_VS_TREE or CHAIN_VS_STOP
    drafter: str          # the drafter of chain vs tree, and of fixed k vs a stop rule
    seed: float = -1      # one seed for every column
    first: str = ""       # the two runs compared (by name; empty: EAGLE 3 and EAGLE 3.1 where the backend runs
    second: str = ""      # them, else its first two drafters)
    baseline: str = ""    # the run without speculation (empty: `none` where the backend runs it)
    draft_stop: str = ""  # the stop rule of every drafting column (of the second, comparing fixed k against it)

    def lane(self, drafter: str, draft: str, stop: bool = True) -> RunSettings:
        """One column: the run /run would make of these settings with this drafter, drafting this way
        (`stop` False: k drafts every step, whatever the stop rule)."""
        shared = {f.name: getattr(self, f.name) for f in fields(RunSettings)
                  if f.name not in ("drafter", "draft", "beside", "draft_stop", "k_auto")}
        return RunSettings(**shared, drafter=drafter, draft=draft, beside=False,
                           draft_stop=self.draft_stop if stop else "")


@dataclass(frozen=True)
class StudySettings:
    """The Your prompts tab's controls: what /study takes, in its positional order."""
    file: str | None      # an uploaded prompt file (its path on the server)
    pasted: str           # or the prompts pasted as text
    backend_name: str
    drafters: list[str]
    k: float
    draft: str            # "chain" or "tree"
    max_tokens: float
    sample: float         # 0: every prompt of the file; else that many drawn at random


def column(slot: str, part: str) -> str:
    """The output name of one part ("cards", "answer", "text", "heading") of a Comparison column."""
    return f"{part}_{slot}"


RUN_OUTPUTS = ("answer", "text", "cards", *PLOTS, "step", "inspector", "files", "tree")
COMPARE_OUTPUTS = (*(column(slot, part) for slot in SLOTS for part in COLUMN_PARTS), *PLOTS, "table", "files",
                   *(column(slot, "heading") for slot in SLOTS), "note", "step_plot")

STUDY_PLOTS = ("tau_plot", "length_plot", "per_prompt_plot", "study_acceptance_plot", "sink_plot", "rms_plot")
STUDY_OUTPUTS = ("progress", "report", *STUDY_PLOTS, "table", "files")

SettingsT = TypeVar("SettingsT")


def named_inputs(settings: type, controls: Mapping[str, Component]) -> dict[str, Component]:
    """The controls an endpoint takes, in its positional order: Gradio's `inputs_kwargs`."""
    return {f.name: controls[f.name] for f in fields(settings)}


def stream_handler(settings: type[SettingsT], outputs: Sequence[str],
                   stream: Callable[[SettingsT, str | None], Iterator[Mapping[str, Any]]]
                   ) -> Callable[..., Iterator[tuple]]:
    """`stream` as Gradio calls it: the controls' values arrive by name and become one `settings`,
    given with the page's session; each update `stream` yields by name goes out in the order of
    `outputs`. Every output gets a value (a missing name is a KeyError): see runs.LivePlots for why
    none is skipped."""
    def handler(request: gr.Request, **values: Any) -> Iterator[tuple]:
        for update in stream(settings(**values), request.session_hash):
            yield tuple(update[name] for name in outputs)
    return handler


LABELS = {"backend_name": "backend", "pasted": "the pasted prompts", "prompt": "the prompt",
          "servers": "the servers", "system": "the system prompt", "top_p": "top-p", "tree_top_k": "tree top-k"}
JSON_KINDS = {type(None): "nothing", bool: "true or false", int: "a number", float: "a number", list: "a list",
              dict: "an object"}


def label(setting: str) -> str:
    """How a message names a setting: "top_p" is "top-p", "tree_depth" is "tree depth"."""
    return LABELS.get(setting, setting.replace("_", " "))


def number(value: Any, setting: str) -> float:
    """A control's value as a number, or a PlaygroundError naming `setting`: API callers can send anything
    JSON holds (text, lists, integers of 400 digits)."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise PlaygroundError(f"{label(setting)} must be a number", setting) from None


def whole_number(value: Any, setting: str) -> int:
    """A control's value as a whole number (NaN and infinities are not), or a PlaygroundError naming `setting`."""
    as_float = number(value, setting)
    if not as_float.is_integer():
        raise PlaygroundError(f"{label(setting)} must be a whole number, got {as_float:g}", setting)
    return int(as_float)


def text(value: Any, setting: str) -> str:
    """A text control's value ("" for none) that a tokenizer can encode, or a PlaygroundError naming `setting`.
    JSON can carry a lone UTF-16 surrogate, which no UTF-8 tokenizer takes."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PlaygroundError(f"{label(setting)} must be text, got {JSON_KINDS.get(type(value), 'something else')}",
                              setting)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PlaygroundError(f"{label(setting)} holds a character that is not valid Unicode (a lone surrogate at "
                              f"character {e.start:,})", setting) from None
    return value


def choice(value: Any, setting: str) -> str:
    """A choice's value, which must be text before it is looked up among the choices."""
    if not isinstance(value, str):
        raise PlaygroundError(f"{label(setting)} must be one of the names offered, got "
                              f"{JSON_KINDS.get(type(value), 'something else')}", setting)
    return value


def input_validator(settings: type[SettingsT], check: Callable[[SettingsT], object]) -> Callable[..., list[dict]]:
    """Gradio's validator for an endpoint: `check` the settings before the run is queued, and show its
    PlaygroundError as one message at the control it names (the first control when it names none of them).
    The page then shows that message and nothing else; an API caller gets it as the call's error. The
    validator runs as the request arrives, outside the queue and its concurrency limits: `check` must be cheap."""
    names = [f.name for f in fields(settings)]

    def validate(**values: Any) -> list[dict]:
        try:
            check(settings(**values))
        except PlaygroundError as e:
            return _invalid_at(names, e.setting, str(e))
        except Exception as e:   # a value no check foresaw: still one message, never Gradio's bare 400
            log.warning("settings not checked: %s: %s", type(e).__name__, e)
            return _invalid_at(names, None, f"these settings could not be checked ({type(e).__name__}: {e})")
        return [gr.validate(True, "") for _ in names]
    return validate


def _invalid_at(names: list[str], setting: str | None, message: str) -> list[dict]:
    """Gradio's validation answer: `message` at the control of `setting`, else at the first control."""
    at = setting if setting in names else names[0]
    return [gr.validate(n != at, message if n == at else "") for n in names]


def failure_message(error: Exception) -> str:
    """The one line a person reads for a run refused or failed; an engine's failure is logged with its traceback."""
    if isinstance(error, PlaygroundError):
        return str(error)
    log.exception("engine failure", exc_info=error)
    return f"the engine failed: {type(error).__name__}: {error}"


def quiet_refusal(error: Exception) -> gr.Error:
    """refusal() for a handler that shows the message on the page itself, beside the control at fault (it yields
    it, then raises this): the API caller still gets it as the call's error, and the page no second one (no
    toast). Its event runs with show_progress="hidden", so that Gradio marks no output with its red error state."""
    loud = refusal(error)
    return gr.Error(loud.message, visible=False, print_exception=False)


def refusal(error: Exception) -> gr.Error:
    """What a handler raises for a request it refuses once queued, or whose engine fails: the one-line message for
    the page and the API caller. A refusal is one line in the log, a failure its traceback once (not Gradio's too)."""
    if isinstance(error, PlaygroundError):
        log.warning("refused: %s", error)
    return gr.Error(failure_message(error), print_exception=False)
