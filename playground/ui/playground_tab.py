"""The Playground tab: one prompt, one drafter, the answer streaming with its plots and inspector."""

from __future__ import annotations

from typing import Iterator, Mapping

import gradio as gr

from playground import plots
from playground.engines.chat import TEMPLATES
from playground.engines.protocol import Engine
from playground.engines.request import K_RANGE, MAX_TEMPERATURE
from playground.engines.tree import LIMITS, TreeShape
from playground.model.variants import EAGLE3, EAGLE31, LABELS, NONE
from playground.ui import render, tree_view
from playground.ui.endpoints import PLOTS, RUN_OUTPUTS, RunSettings, named_inputs, stream_handler
from playground.ui.presets import PRESETS
from playground.ui.runs import LivePlots, Pacer, RunLog, export
from playground.ui.streams import (REPLAY_NOTE, Limits, StopRequests, backend, failure_message, make_request,
                                   stop_handler, stopped)

DRAFTER_CHOICES = [(LABELS[EAGLE31], EAGLE31), (LABELS[EAGLE3], EAGLE3), (f"none ({LABELS[NONE]})", NONE)]
TEMPLATE_CHOICES = [(f"{name}: {description}", name) for name, description in TEMPLATES.items()]
FIRST_PRESET = "Code"   # a fresh page can run at once, on a prompt where drafts are often accepted
DEFAULT_MAX_TOKENS = 128
OUTPUTS = (*RUN_OUTPUTS, "events")   # the run's events also go to a gr.State, which the API does not return


def drafter_note(engine: Engine, name: str) -> str:
    notes = []
    if name != NONE and not engine.drafter_info(name).trained:
        notes.append(f"{plots.label(name)} is a randomly initialised drafter: expect almost every draft "
                     "to be rejected.")
    if name != NONE and engine.limitations(name):
        notes.append(engine.limitations(name))
    return " ".join(notes)


def controls(limits: Limits, backends: Mapping[str, Engine], with_drafter: bool, prefix: str) -> dict:
    """The shared generation controls by their settings' field names (elem ids: `prefix-name`)."""
    c = {}
    eid = lambda name: f"{prefix}-{name}"
    with gr.Row():
        c["preset"] = gr.Dropdown(["(none)", *PRESETS], value=FIRST_PRESET, label="Preset", scale=1,
                                  elem_id=eid("preset"))
        c["template"] = gr.Dropdown(TEMPLATE_CHOICES, value="model", label="Prompt format", scale=2,
                                    elem_id=eid("template"))
        if with_drafter:
            c["drafter"] = gr.Dropdown(DRAFTER_CHOICES, value=EAGLE31, label="Drafter", scale=1,
                                       elem_id=eid("drafter"))
        c["backend_name"] = gr.Dropdown(list(backends), value=next(iter(backends)), label="Backend", scale=1,
                                        elem_id=eid("backend"))
    c["prompt"] = gr.Textbox(PRESETS[FIRST_PRESET].prompt, label="Prompt", lines=4, max_length=limits.max_prompt_chars,
                             placeholder="Ask anything, or pick a preset", elem_id=eid("prompt"))
    c["system"] = gr.Textbox(label="System prompt (empty: the model's default)", lines=1,
                             max_length=limits.max_prompt_chars, elem_id=eid("system"))
    with gr.Row():
        c["k"] = gr.Slider(K_RANGE[0], K_RANGE[1], value=5, step=1, label="k (drafts per step)", elem_id=eid("k"))
        c["temperature"] = gr.Slider(0, MAX_TEMPERATURE, value=0.0, step=0.05, label="temperature (0 = greedy)",
                                     elem_id=eid("temperature"))
        c["top_p"] = gr.Slider(0.01, 1.0, value=1.0, step=0.01, label="top-p", elem_id=eid("top-p"))
        c["max_tokens"] = gr.Slider(1, limits.max_tokens, value=min(DEFAULT_MAX_TOKENS, limits.max_tokens), step=1,
                                    label="max tokens", elem_id=eid("max-tokens"))
    with gr.Row():
        c["draft"] = gr.Radio(["chain", "tree"], value="chain", label="draft", elem_id=eid("draft"),
                              info="tree: EAGLE-2 dynamic trees, reference backend")
        c["tree_top_k"] = gr.Slider(*LIMITS["top_k"], value=TreeShape.top_k, step=1, label="tree top-k",
                                    elem_id=eid("tree-top-k"))
        c["tree_depth"] = gr.Slider(*LIMITS["depth"], value=TreeShape.depth, step=1, label="tree depth",
                                    elem_id=eid("tree-depth"))
        c["tree_nodes"] = gr.Slider(*LIMITS["nodes"], value=TreeShape.nodes, step=1, label="tree nodes",
                                    elem_id=eid("tree-nodes"))
    c["preset"].change(lambda name: _preset(name), c["preset"], [c["prompt"], c["system"], c["template"]],
                       api_name=False, queue=False)
    return c


def _preset(name: str):
    preset = PRESETS.get(name)
    if preset is None:
        return gr.skip(), gr.skip(), gr.skip()
    return preset.prompt, preset.system, preset.template


def build(backends: Mapping[str, Engine], limits: Limits) -> None:
    c = controls(limits, backends, with_drafter=True, prefix="pg")
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="run")
        stop = gr.Button("Stop", variant="stop", elem_id="stop")
    gr.HTML(render.LEGEND)
    view = {"answer": gr.HTML(render.answer_html([]), elem_id="answer"),
            "tree": gr.HTML(tree_view.tree_html(None), elem_id="tree"),
            "cards": gr.HTML(render.figures_html(None), elem_id="cards")}
    with gr.Row():
        view["acceptance_plot"] = gr.Plot(label="acceptance by depth", elem_id="plot-acceptance")
        view["attention_plot"] = gr.Plot(label="attention by depth", elem_id="plot-attention")
        view["norm_plot"] = gr.Plot(label="fed-back RMS by depth", elem_id="plot-norm")
    with gr.Accordion("Step inspector", open=True):
        view["step"] = gr.Slider(0, 1, value=0, step=1, label="verify step", elem_id="step")
        view["inspector"] = gr.HTML(render.inspector_html(None), elem_id="inspector")
    with gr.Accordion("Plain text and downloads", open=False):
        view["text"] = gr.Textbox(label="answer (plain text)", lines=6, buttons=["copy"], elem_id="answer-text")
        view["files"] = gr.File(label="run as JSON and CSV, plots as HTML", file_count="multiple")
    view["events"] = gr.State([])

    stops = StopRequests()

    def stream(settings: RunSettings, session: str | None) -> Iterator[dict]:
        stops.take(session)   # a Stop pressed before this run started is not for it
        try:
            request = make_request(limits, settings)
            engine = backend(backends, settings.backend_name)
            note = drafter_note(engine, request.drafter)
            probe = engine.replayer(request.drafter)
            steps = engine.generate(request)
        except Exception as e:  # bad input: nothing ran
            raise gr.Error(failure_message(e)) from None
        run_log, pacer, live = RunLog(request), Pacer(), LivePlots()
        yield update(run_log, note or "waiting for the engine…", live, False, False)
        try:
            for event in steps:
                run_log.events.append(stopped(event) if stops.take(session) else event)
                final = run_log.finished
                if final and probe is not None:
                    run_log.events, note = probe.replay(request, run_log.events), REPLAY_NOTE
                if final or pacer.due("text"):
                    yield update(run_log, note, live, final or pacer.due("plots"), final)
                if final:
                    return
        except Exception as e:
            yield update(run_log, note, live, True, True, failure_message(e))
            raise gr.Error(failure_message(e)) from None

    def update(run_log: RunLog, note: str, live: LivePlots, redraw: bool, final: bool, error: str = "") -> dict:
        summary = run_log.summary
        runs = {run_log.request.drafter: summary}
        html = render.answer_html(run_log.events, note) + (render.error_html(error) if error else "")
        last = len(run_log.events) - 1
        return {"answer": html, "text": run_log.text, "cards": render.figures_html(summary),
                **dict(zip(PLOTS, live.get(lambda: plots.all_figures(runs), redraw))),
                "step": gr.update(maximum=max(1, last), value=last) if final else 0,
                "inspector": inspect(run_log.events[-1] if final else None),
                "files": export({run_log.request.drafter: run_log},
                                lambda path: plots.figures_file(runs, path)) if final else None,
                "events": list(run_log.events),
                "tree": tree_view.tree_html(run_log.events[-1] if run_log.events else None)}

    handler = stream_handler(RunSettings, OUTPUTS, stream)
    inputs, outputs = named_inputs(RunSettings, c), [view[name] for name in OUTPUTS]
    run.click(handler, inputs_kwargs=inputs, outputs=outputs, api_name="run", concurrency_id="engine",
                        concurrency_limit=limits.concurrency)
    c["prompt"].submit(handler, inputs_kwargs=inputs, outputs=outputs, api_name=False, concurrency_id="engine",
                       concurrency_limit=limits.concurrency)
    stop.click(stop_handler(stops), None, None, queue=False, api_name=False)
    view["step"].input(lambda i, evs: inspect(evs[int(i)] if evs and 0 <= i < len(evs) else None),
                       [view["step"], view["events"]], view["inspector"], api_name="inspect", queue=False,
                       trigger_mode="always_last")


def inspect(event) -> str:
    return render.inspector_html(event) + (tree_view.tree_html(event) if event is not None and event.tree_ids else "")
