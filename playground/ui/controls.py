"""The controls both tabs share: the prompt with its counter, presets, the settings panel, the answer's
colour key, and the note above an answer."""

from __future__ import annotations

from typing import Callable, Mapping

import gradio as gr

from playground import plots
from playground.engines.chat import TEMPLATES
from playground.engines.protocol import Engine
from playground.engines.request import K_RANGE, MAX_TEMPERATURE, GenerationRequest
from playground.engines.tree import LIMITS, TreeShape
from playground.model.variants import EAGLE3, EAGLE31, NONE
from playground.ui import render, unchecked
from playground.ui.presets import PRESETS
from playground.ui.streams import NEW_SEED, Limits

TEMPLATE_CHOICES = [(f"{name}: {description}", name) for name, description in TEMPLATES.items()]
FIRST_PRESET = "Code"   # a fresh page can run at once, on a prompt where drafts are often accepted
DEFAULT_MAX_TOKENS = 128
DEFAULT_K = 5


def run_note(engine: Engine, request: GenerationRequest) -> str:
    """What the page says above a run's answer: an untrained drafter, what the engine cannot show, the seed."""
    notes = []
    info = engine.drafter_info(request.drafter)
    if info.variant != NONE:
        if not info.trained:
            notes.append(f"{plots.label(request.drafter)} is a randomly initialised drafter: expect almost every "
                         "draft to be rejected.")
        if engine.limitations(request.drafter):
            notes.append(engine.limitations(request.drafter))
    if request.temperature > 0:
        notes.append(f"Sampled with seed {request.seed}.")
    return " ".join(notes)


def drafter_label(name: str) -> str:
    return f"none ({plots.label(NONE)})" if name == NONE else plots.label(name)


def drafter_choices(engine: Engine) -> list[tuple[str, str]]:
    """What a drafter control offers for `engine`: every name it runs, labelled."""
    return [(drafter_label(name), name) for name in engine.drafter_names]


def default_drafter(names: tuple[str, ...]) -> str:
    return EAGLE31 if EAGLE31 in names else names[0]


def default_pair(names: tuple[str, ...]) -> tuple[str, str]:
    """The two runs a comparison shows unless it names them: EAGLE 3 and EAGLE 3.1 where both run, else
    the first two names other than none."""
    if EAGLE3 in names and EAGLE31 in names:
        return EAGLE3, EAGLE31
    drafting = [n for n in names if n != NONE] + ["", ""]
    return drafting[0], drafting[1]


def beside_name(drafter: str, names: tuple[str, ...]) -> str:
    """The drafter the Playground runs beside `drafter` for its plots: the other one of the pair a
    comparison shows by default (EAGLE 3 beside EAGLE 3.1, and back); "" for a drafter outside it."""
    pair = default_pair(names)
    if drafter in pair and all(pair):
        return pair[1 - pair.index(drafter)]
    return ""


def beside_label(drafter: str, names: tuple[str, ...]) -> str:
    other = beside_name(drafter, names)
    return f"run {plots.label(other)} beside it, for the plots" if other else "nothing to run beside this drafter"


def with_default(choices: list[tuple[str, str]], resolved: str) -> list[tuple[str, str]]:
    """`choices` led by the empty value, labelled with the name it stands for on this backend (an API
    caller that leaves a setting out gets its control's initial value: the empty one, so that what
    it resolves to follows the backend)."""
    return [(f"default: {drafter_label(resolved) if resolved else 'not run'}", ""), *choices]


def keep_or(default: Callable[[tuple[str, ...]], str]) -> Callable[[tuple[str, ...], object], object]:
    """A `follow_backend` pick: the current value where the backend runs it, else `default(names)`."""
    return lambda names, current: current if current in names else default(names)


def follow_backend(c: dict, backends: Mapping[str, Engine], control: str,
                   pick: Callable[[tuple[str, ...], object], object],
                   choices: Callable[[Engine], list[tuple[str, str]]] = drafter_choices) -> None:
    """Keep `c[control]` offering `choices` of the backend chosen in `c["backend_name"]`; its value
    becomes `pick(names, current value)`."""
    def offer(name: str, current: object):
        if name not in backends:
            return gr.skip()
        engine = backends[name]
        return gr.update(choices=choices(engine), value=pick(engine.drafter_names, current))
    c["backend_name"].change(offer, [c["backend_name"], c[control]], c[control], api_name=False, queue=False)


def prompt_box(limits: Limits, prefix: str) -> gr.Textbox:
    """The prompt, with its character counter under it."""
    prompt = gr.Textbox(PRESETS[FIRST_PRESET].prompt, label="Prompt", lines=3, max_lines=12,
                        placeholder="Ask anything, or pick a preset", elem_id=f"{prefix}-prompt")
    counter = gr.HTML(elem_id=f"{prefix}-count", padding=False)
    # counted in the browser, on load and as the user types: the textarea has no maxlength, which would
    # cut a long paste silently; a prompt over the limit is refused with a message instead
    gr.on(None, None, prompt, counter, js=render.counter_js(limits.max_prompt_chars), api_name=False, queue=False)
    return prompt


def preset_dropdown(prefix: str) -> gr.Dropdown:
    return gr.Dropdown(list(PRESETS), value=FIRST_PRESET, label="Run an example", min_width=120,
                       elem_id=f"{prefix}-preset")


def settings_panel(limits: Limits, backends: Mapping[str, Engine], prefix: str, k_auto: bool = False) -> dict:
    """The generation settings a first run does not need, in a closed panel (elem ids: `prefix-name`; the
    panel itself is `c["settings_panel"]`); `k_auto`: with the box that lets this host's costs choose k."""
    c = {}
    eid = lambda name: f"{prefix}-{name}"
    with gr.Accordion("Settings", open=False, elem_id=eid("settings")) as c["settings_panel"]:
        with gr.Row():
            c["template"] = unchecked.Dropdown(TEMPLATE_CHOICES, value="model", label="Prompt format", elem_id=eid("template"))
            c["backend_name"] = unchecked.Dropdown(list(backends), value=next(iter(backends)), label="Backend",
                                            visible=len(backends) > 1, elem_id=eid("backend"))
        c["system"] = gr.Textbox(label="System prompt (empty: the model's default)", lines=1, elem_id=eid("system"))
        with gr.Row():
            c["max_tokens"] = unchecked.Slider(1, limits.max_tokens, value=min(DEFAULT_MAX_TOKENS, limits.max_tokens), step=1,
                                        label="max tokens", min_width=200, elem_id=eid("max-tokens"))
            c["k"] = unchecked.Slider(K_RANGE[0], K_RANGE[1], value=DEFAULT_K, step=1, label="k (drafts per step)",
                                      min_width=200, elem_id=eid("k"))
        if k_auto:   # under the sliders: beside them, a narrow column squeezes it a word a line
            c["k_auto"] = gr.Checkbox(False, label="k by this host's costs", elem_id=eid("k-auto"),
                                      info="the k its measured step costs and the drafter's stored acceptance "
                                           "expect to be fastest (embedded engine, chains)")
        with gr.Row():
            c["temperature"] = unchecked.Slider(0, MAX_TEMPERATURE, value=0.0, step=0.05, label="temperature (0 = greedy)",
                                         min_width=200, elem_id=eid("temperature"))
            c["top_p"] = unchecked.Slider(0.01, 1.0, value=1.0, step=0.01, label="top-p", min_width=200,
                                          elem_id=eid("top-p"))
            c["seed"] = unchecked.Number(NEW_SEED, precision=0, min_width=160,
                                  label="seed (-1: a new one each run)", elem_id=eid("seed"))
        c["draft"] = unchecked.Radio(["chain", "tree"], value="chain", label="draft", elem_id=eid("draft"),
                              info="tree: EAGLE-2 dynamic trees, reference backend; k then does not apply")
        with gr.Row(visible=False) as tree_row:
            c["tree_top_k"] = unchecked.Slider(*LIMITS["top_k"], value=TreeShape.top_k, step=1, label="tree top-k",
                                        elem_id=eid("tree-top-k"))
            c["tree_depth"] = unchecked.Slider(*LIMITS["depth"], value=TreeShape.depth, step=1, label="tree depth",
                                        elem_id=eid("tree-depth"))
            c["tree_nodes"] = unchecked.Slider(*LIMITS["nodes"], value=TreeShape.nodes, step=1, label="tree nodes",
                                        elem_id=eid("tree-nodes"))
        c["draft_stop"] = gr.Textbox("", label="stop a chain early at (embedded engine)", lines=1, max_lines=1,
                                     placeholder="e.g. probability<0.3 or self_attention>0.3; empty: k drafts "
                                                 "every step", elem_id=eid("draft-stop"))
    c["draft"].change(lambda draft: (gr.update(visible=draft == "tree"), gr.update(interactive=draft == "chain")),
                      c["draft"], [tree_row, c["k"]], api_name=False, queue=False)
    return c


def answer_header(prefix: str) -> None:
    """The colour key, and a switch that shows rejected drafts inline in the answers with class `answers-prefix`."""
    gr.HTML(render.LEGEND, padding=False)
    shown = gr.Checkbox(False, label="show rejected drafts inline", container=False, elem_id=f"{prefix}-show-rejected",
                        elem_classes=["plain-check"])
    shown.change(None, shown, None, js=render.show_rejected_js(prefix), api_name=False, queue=False)


def wire_presets(c: dict):
    """Picking an example fills the prompt, the system prompt and the format; the tab chains its run
    on the event this returns, so that an example runs at once. Editing the prompt empties the pick."""
    c["prompt"].input(lambda: None, None, c["preset"], api_name=False, queue=False)
    return c["preset"].input(_preset, c["preset"], [c["prompt"], c["system"], c["template"]], api_name=False,
                             queue=False)


def _preset(name: str):
    preset = PRESETS.get(name)
    if preset is None:
        return gr.skip(), gr.skip(), gr.skip()
    return preset.prompt, preset.system, preset.template
