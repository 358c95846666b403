"""The Playground tab: one prompt, one drafter, the answer streaming with its plots and inspector."""

from __future__ import annotations

from typing import Iterator, Mapping

import gradio as gr

from playground import plots
from playground.engines.protocol import Engine
from playground.ui import render, tree_view, unchecked
from playground.ui.controls import (answer_header, default_drafter, drafter_choices, follow_backend, keep_or,
                                    preset_dropdown, prompt_box, run_note, settings_panel, wire_presets)
from playground.ui.endpoints import (PLOTS, RUN_OUTPUTS, RunSettings, input_validator, named_inputs, refusal,
                                     stream_handler)
from playground.ui.runs import LivePlots, Pacer, RunLog, export
from playground.ui.streams import Limits, StopRequests, backend, make_request, stop_handler, stopped

OUTPUTS = (*RUN_OUTPUTS, "events")   # the run's events also go to a gr.State, which the API does not return


def build(backends: Mapping[str, Engine], limits: Limits) -> dict:
    """The tab; returns its controls by name (the Your prompts tab opens a prompt in them)."""
    view = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            c = {"prompt": prompt_box(limits, "pg")}
            with gr.Row():
                c["preset"] = preset_dropdown("pg")
                first = next(iter(backends.values()))
                c["drafter"] = unchecked.Dropdown(drafter_choices(first), value=default_drafter(first.drafter_names),
                                                  label="Drafter", min_width=120, elem_id="pg-drafter")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run", min_width=80)
                stop = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
            c |= settings_panel(limits, backends, "pg")
            follow_backend(c, backends, "drafter", keep_or(default_drafter))
        with gr.Column(scale=3, min_width=300):
            answer_header("pg")
            view["answer"] = gr.HTML(render.answer_html([]), elem_id="answer",
                                     elem_classes=["answer-block", "answers-pg"])
            view["cards"] = gr.HTML(render.figures_html(None), elem_id="cards")
    view["tree"] = gr.HTML(tree_view.tree_html(None), elem_id="tree")
    with gr.Row():
        view["acceptance_plot"] = gr.Plot(label="acceptance by depth", elem_id="plot-acceptance")
        view["attention_plot"] = gr.Plot(label="attention by depth", elem_id="plot-attention")
        view["norm_plot"] = gr.Plot(label="fed-back RMS by depth", elem_id="plot-norm")
    with gr.Accordion("Step inspector: click a token of the answer to open its step", open=True):
        with gr.Row():
            previous = gr.Button("◀ previous step", size="sm", min_width=80, elem_id="step-previous")
            view["step"] = gr.Slider(0, 1, value=0, step=1, label="verify step", elem_id="step", scale=4)
            following = gr.Button("next step ▶", size="sm", min_width=80, elem_id="step-next")
        view["inspector"] = gr.HTML(render.inspector_html(None), elem_id="inspector")
    with gr.Accordion("Plain text and downloads", open=False):
        view["text"] = gr.Textbox(label="answer (plain text)", lines=6, buttons=["copy"], elem_id="answer-text")
        view["files"] = gr.File(label="run as JSON and CSV, plots as HTML", file_count="multiple")
    view["events"] = gr.State([])

    stops = StopRequests()

    def stream(settings: RunSettings, session: str | None) -> Iterator[dict]:
        stops.take(session)   # a Stop pressed before this run started is not for it
        try:
            engine = backend(backends, settings.backend_name)
            request = make_request(limits, settings, engine)
            note = run_note(engine, request)
            steps = engine.generate(request)
        except Exception as e:  # bad input: nothing ran
            raise refusal(e) from None
        run_log, pacer, live = RunLog(request), Pacer(), LivePlots()
        yield update(run_log, note or "waiting for the engine…", live, False, False)
        try:
            for event in steps:
                run_log.events.append(stopped(event) if stops.take(session) else event)
                final = run_log.finished
                if final or pacer.due("text"):
                    yield update(run_log, note, live, final or pacer.due("plots"), final)
                if final:
                    return
        except Exception as e:
            error = refusal(e)
            yield update(run_log, note, live, True, True, error.message)
            raise error from None

    def update(run_log: RunLog, note: str, live: LivePlots, redraw: bool, final: bool, error: str = "") -> dict:
        summary = run_log.summary
        runs = {run_log.request.drafter: summary}
        steps = run_log.steps   # what the answer's data-step numbers index, so a clicked token opens its step
        html = render.answer_html(steps, note) + (render.error_html(error) if error else "")
        last = len(steps) - 1
        return {"answer": html, "text": run_log.text, "cards": render.figures_html(summary),
                **dict(zip(PLOTS, live.get(lambda: plots.all_figures(runs), redraw))),
                "step": gr.update(maximum=max(1, last), value=last) if final else 0,
                "inspector": inspect(steps[-1] if final else None),
                "files": export({run_log.request.drafter: run_log}, plots.all_figures(runs)) if final else None,
                "events": steps,
                "tree": tree_view.tree_html(steps[-1] if steps else None)}

    handler = stream_handler(RunSettings, OUTPUTS, stream)
    def check(settings: RunSettings) -> None:
        engine = backend(backends, settings.backend_name)
        engine.check(make_request(limits, settings, engine))

    validator = input_validator(RunSettings, check)
    inputs, outputs = named_inputs(RunSettings, c), [view[name] for name in OUTPUTS]
    for trigger, api_name in ((run.click, "run"), (c["prompt"].submit, False), (wire_presets(c).then, False)):
        trigger(handler, inputs_kwargs=inputs, outputs=outputs, validator=validator, api_name=api_name,
                concurrency_id="engine", concurrency_limit=limits.concurrency)
        trigger(None, js=render.scroll_into_view_js("answer"), api_name=False, queue=False)
    stop.click(stop_handler(stops), None, None, queue=False, api_name=False)
    view["step"].input(lambda i, evs: inspect(evs[int(i)] if evs and 0 <= i < len(evs) else None),
                       [view["step"], view["events"]], view["inspector"], api_name="inspect", queue=False,
                       trigger_mode="always_last")
    for button, delta in ((previous, -1), (following, 1)):
        button.click(lambda i, evs, delta=delta: step_by(i, evs, delta), [view["step"], view["events"]],
                     [view["step"], view["inspector"]], api_name=False, queue=False)
    return c


def step_by(i: float, events: list, delta: int) -> tuple[int, str]:
    """The step `delta` away from step i (kept within the run), and its inspector."""
    if not events:
        return 0, inspect(None)
    step = min(max(int(i) + delta, 0), len(events) - 1)
    return step, inspect(events[step])


def inspect(event) -> str:
    return render.inspector_html(event) + (tree_view.tree_html(event) if event is not None and event.tree_ids else "")
