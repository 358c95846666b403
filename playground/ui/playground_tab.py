"""The Playground tab: one prompt, one drafter's answer streaming with its inspector, and plots that draw the
drafter paired with it (EAGLE 3 beside EAGLE 3.1) run live on the same prompt."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Mapping

import gradio as gr

from playground import plots
from playground.engines.events import StepEvent
from playground.engines.protocol import Engine
from playground.engines.request import GenerationRequest
from playground.errors import PlaygroundError
from playground.evaluation import k_choice
from playground.evaluation.k_choice import KChoice
from playground.ui import first_screen, render, tree_view, unchecked
from playground.ui.controls import (answer_header, beside_label, beside_name, default_drafter, drafter_choices,
                                    follow_backend, keep_or, preset_dropdown, prompt_box, run_note, settings_panel,
                                    wire_presets)
from playground.ui.endpoints import (PLOTS, RUN_OUTPUTS, RunSettings, failure_message, input_validator,
                                     named_inputs, refusal, stream_handler)
from playground.ui.runs import LivePlots, RunLog, export
from playground.ui.streams import (SHARED_NOTE, Frame, Limits, StopRequests, backend, drive, make_request,
                                   stop_handler)

OUTPUTS = (*RUN_OUTPUTS, "events")   # the run's events also go to a gr.State, which the API does not return


@dataclass(frozen=True)
class Layout:
    """The tab's components: the run's settings (RunSettings' inputs by name), what a run fills (OUTPUTS by
    name, and the inspector's step slider), and the buttons."""
    controls: dict[str, gr.components.Component]
    view: dict[str, gr.components.Component]
    run: gr.Button
    stop: gr.Button
    previous: gr.Button
    following: gr.Button


def layout(backends: Mapping[str, Engine], limits: Limits) -> Layout:
    """The tab's components, showing the stored first screen where the first backend runs in this process;
    the drafters offered follow the backend picked (their own wiring)."""
    view = {}
    first = next(iter(backends.values()))
    stored = first_screen.load() if first.capabilities.in_process else None   # recorded in process
    initial = update(stored[0], first_screen.DRAFTERS[0], f"A stored run of this example ({stored[1]}). Press Run to "
                     "run it live.", LivePlots(), Frame(redraw=True, final=True), stored=True) if stored else {}
    shown_steps = len(initial.get("events", []))
    with gr.Row(equal_height=False, elem_id="pg-layout"):
        with gr.Column(scale=2, min_width=300, elem_id="pg-controls"):
            c = {"prompt": prompt_box(limits, "pg")}
            with gr.Row():
                c["preset"] = preset_dropdown("pg")
                drafter = default_drafter(first.drafter_names)
                c["drafter"] = unchecked.Dropdown(drafter_choices(first), value=drafter,
                                                  label="Drafter", min_width=120, elem_id="pg-drafter")
            c["beside"] = gr.Checkbox(True, label=beside_label(drafter, first.drafter_names), container=False,
                                      elem_id="pg-beside", elem_classes=["plain-check"])
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run", min_width=80)
                stop = gr.Button("Stop", variant="secondary", elem_id="stop", min_width=80)
            c |= settings_panel(limits, backends, "pg", k_auto=True)
            follow_backend(c, backends, "drafter", keep_or(default_drafter))
            with gr.Accordion("Step inspector: click a token of the answer to open its step", open=True,
                              elem_id="pg-inspector"):
                with gr.Row():
                    previous = gr.Button("◀ previous", size="sm", min_width=60, elem_id="step-previous")
                    view["step"] = gr.Slider(0, max(1, shown_steps - 1), value=0, step=1, label="verify step",
                                             elem_id="step", scale=4)
                    following = gr.Button("next ▶", size="sm", min_width=60, elem_id="step-next")
                view["inspector"] = gr.HTML(render.inspector_html(None), elem_id="inspector")
        with gr.Column(scale=3, min_width=300, elem_id="pg-output"):
            view["cards"] = gr.HTML(initial.get("cards", render.figures_html(None)), elem_id="cards")
            answer_header("pg")
            view["answer"] = gr.HTML(initial.get("answer", render.answer_html([])), elem_id="answer",
                                     elem_classes=["answer-block", "answers-pg"])
    view["tree"] = gr.HTML(tree_view.tree_html(None), elem_id="tree")
    with gr.Row():
        for name, elem_id in zip(PLOTS, ("plot-acceptance", "plot-attention", "plot-norm")):
            view[name] = gr.Plot(initial.get(name), show_label=False, min_width=300, elem_id=elem_id)
    with gr.Accordion("Plain text and downloads", open=False):
        view["text"] = gr.Textbox(label="answer (plain text)", lines=6, buttons=["copy"], elem_id="answer-text")
        view["files"] = gr.File(label="run as JSON and CSV, plots as HTML", file_count="multiple")
    view["events"] = gr.State(initial.get("events", []))
    return Layout(c, view, run, stop, previous, following)


class Runs:
    """The tab's handlers: a run checked before it queues, streamed, and stopped."""

    def __init__(self, backends: Mapping[str, Engine], limits: Limits):
        self.backends, self.limits, self.stops = backends, limits, StopRequests()

    def stream(self, settings: RunSettings, session: str | None) -> Iterator[dict]:
        self.stops.take(session)   # a Stop pressed before this run started is not for it
        try:
            engine = backend(self.backends, settings.backend_name)
            requests, picked = self.requests(settings, engine)
            chose = f"k by this host's costs: {picked.reason}." if picked else ""
            note = " ".join(filter(None, (chose, run_note(engine, requests[0]))))
            failed: dict[str, str] = {}
            streams = {requests[0].drafter: engine.generate(requests[0]),
                       **{r.drafter: beside_events(engine, r, failed) for r in requests[1:]}}
        except Exception as e:  # bad input: nothing ran
            raise refusal(e) from None
        logs, main, live = {r.drafter: RunLog(r) for r in requests}, requests[0].drafter, LivePlots()

        def draw(frame: Frame) -> dict:
            nonlocal note
            note = without_failed(logs, failed, note)
            waiting = render.PREFILL_NOTE if not logs[main].events and not frame.final else ""
            shared = SHARED_NOTE if frame.shared else ""
            return update(logs, main, " ".join(filter(None, (note or waiting, shared))), live, frame)

        yield from drive(streams, logs, lambda: self.stops.take(session), draw)

    def requests(self, settings: RunSettings, engine: Engine,
                 choose_k: bool = True) -> tuple[list[GenerationRequest], KChoice | None]:
        """The run the answer shows, then the one drawn beside it in the plots (when asked for and paired), and
        the k chosen for them where this host's costs choose it (`choose_k`: not when only checking)."""
        main = make_request(self.limits, settings, engine)
        if not isinstance(settings.beside, bool):
            raise PlaygroundError("beside must be true or false", "beside")
        if not isinstance(settings.k_auto, bool):
            raise PlaygroundError("k_auto must be true or false", "k_auto")
        picked = None
        if settings.k_auto and choose_k:   # measured on its first use on this host (about 25 s), then cached
            main, picked = k_choice.chosen(engine, main)
        other = beside_name(main.drafter, engine.drafter_names) if settings.beside else ""
        return [main, *([replace(main, drafter=other)] if other else [])], picked

    def check(self, settings: RunSettings) -> None:
        """What the validator refuses before the run queues (the run beside the answer may fail alone, at run
        time)."""
        engine = backend(self.backends, settings.backend_name)
        engine.check(self.requests(settings, engine, choose_k=False)[0][0])


def build(backends: Mapping[str, Engine], limits: Limits) -> dict:
    """The tab, wired; returns its controls by name (the Your prompts tab opens a prompt in them)."""
    tab, runs = layout(backends, limits), Runs(backends, limits)
    c, view = tab.controls, tab.view
    handler = stream_handler(RunSettings, OUTPUTS, runs.stream)
    validator = input_validator(RunSettings, runs.check)
    inputs, outputs = named_inputs(RunSettings, c), [view[name] for name in OUTPUTS]
    for trigger, api_name in ((tab.run.click, "run"), (c["prompt"].submit, False), (wire_presets(c).then, False)):
        trigger(handler, inputs_kwargs=inputs, outputs=outputs, validator=validator, api_name=api_name,
                concurrency_id="engine", concurrency_limit=limits.concurrency)
    tab.stop.click(stop_handler(runs.stops), None, None, queue=False, api_name=False)
    c["drafter"].change(lambda name, backend_name: gr.update(label=beside_label(
                            name, backends[backend_name].drafter_names)) if backend_name in backends else gr.skip(),
                        [c["drafter"], c["backend_name"]], c["beside"], api_name=False, queue=False)
    view["step"].input(lambda i, evs: render.inspector_html(event_at(i, evs)), [view["step"], view["events"]],
                       view["inspector"], api_name="inspect", queue=False, trigger_mode="always_last"
                       ).then(lambda i, evs: tree_view.tree_html(event_at(i, evs)), [view["step"], view["events"]],
                              view["tree"], api_name=False, queue=False)
    for button, delta in ((tab.previous, -1), (tab.following, 1)):
        button.click(lambda i, evs, delta=delta: step_by(i, evs, delta), [view["step"], view["events"]],
                     [view["step"], view["inspector"], view["tree"]], api_name=False, queue=False)
    return c


def beside_events(engine: Engine, request: GenerationRequest, failed: dict[str, str]) -> Iterator[StepEvent]:
    """The run drawn beside the answer: a failure (a server down) ends it with its reason in `failed`,
    and the answer's run goes on alone."""
    try:
        yield from engine.generate(request)
    except Exception as e:
        failed[request.drafter] = failure_message(e)


def without_failed(logs: dict[str, RunLog], failed: Mapping[str, str], note: str) -> str:
    """Drops the runs beside the answer that failed from `logs`; the note, with why for each."""
    for name in [n for n in failed if n in logs]:
        del logs[name]
        note = " ".join(filter(None, (note, f"{plots.label(name)} could not run beside it: {failed[name]}.")))
    return note


def update(logs: Mapping[str, RunLog], main: str, note: str, live: LivePlots, frame: Frame,
           stored: bool = False) -> dict:
    """The tab's outputs: the answer, text, cards, inspector and downloads of the run `main`, the plots of
    every run in `logs`."""
    run_log = logs[main]
    summaries = {name: log.summary for name, log in logs.items() if log.events}
    steps = run_log.steps   # what the answer's data-step numbers index, so a clicked token opens its step
    shown, waits = steps, [plots.label(name) for name, log in logs.items() if not log.finished]
    if run_log.finished and not frame.final:   # the answer ends with the run: the other drafter is still drafting
        shown = [*steps[:-1], replace(steps[-1], finish_reason=None)]
        note = " ".join(filter(None, (note, f"{' and '.join(waits)} is finishing beside it, for the plots…")))
    html = render.answer_html(shown, note, stored) + (render.error_html(frame.error) if frame.error else "")
    last = len(steps) - 1
    figures = live.get(lambda: plots.all_figures(summaries), frame.redraw)   # a final update always redraws
    return {"answer": html, "text": run_log.text,
            # the frame's mark goes in the small cards, which change with every step anyway
            "cards": render.figures_html(summaries.get(main)) + render.pair_html(summaries)
                     + render.frame_mark(frame.run, frame.number),
            **dict(zip(PLOTS, figures)),
            "step": gr.update(maximum=max(1, last), value=last) if frame.final else 0,
            "inspector": render.inspector_html(steps[-1] if frame.final else None),
            "files": export(logs, live.figures) if frame.final and not stored else None,
            "events": steps,
            "tree": tree_view.tree_html(steps[-1] if steps else None)}


def event_at(i: float, events: list):
    """The step event at slider position i; None outside the run."""
    return events[int(i)] if events and 0 <= i < len(events) else None


def step_by(i: float, events: list, delta: int) -> tuple[int, str, str]:
    """The step `delta` away from step i (kept within the run), its inspector and its draft tree (a tree
    is drawn once, full width under the answer, for the step the inspector shows)."""
    if not events:
        return 0, render.inspector_html(None), ""
    step = min(max(int(i) + delta, 0), len(events) - 1)
    return step, render.inspector_html(events[step]), tree_view.tree_html(events[step])
