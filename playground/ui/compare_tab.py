"""The Comparison tab: one prompt through two runs streaming side by side (EAGLE 3 against EAGLE 3.1,
or one drafter's chain against its tree) and optionally no speculation, with overlaid plots and a
summary table."""

from __future__ import annotations

from typing import Iterator, Mapping

import gradio as gr

from playground import plots
from playground.engines.protocol import Engine
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunSummary
from playground.errors import PlaygroundError
from playground.model.variants import EAGLE3, EAGLE31, LABELS, NONE, run_name
from playground.ui import render
from playground.ui.endpoints import (COMPARE_OUTPUTS, PLOTS, SLOTS, CompareSettings, RunSettings, column,
                                     named_inputs, stream_handler)
from playground.ui.playground_tab import DEFAULT_MAX_TOKENS, controls, drafter_note
from playground.ui.explainer import STORED_RESULTS
from playground.ui.presets import DRIFT_EXAMPLE
from playground.ui.runs import LivePlots, Pacer, RunLog, export
from playground.ui.streams import (REPLAY_NOTE, Limits, StopRequests, backend, failure_message, interleave,
                                   make_request, stop_handler, stopped)

DRAFTERS, CHAIN_VS_TREE = "drafters", "chain-vs-tree"
MODES = [(f"{LABELS[EAGLE3]} vs {LABELS[EAGLE31]}", DRAFTERS), ("chain vs tree, one drafter", CHAIN_VS_TREE)]
STORED_BENCHMARK = STORED_RESULTS.with_name("results.md")   # the table of the results the explainer quotes
TABLE_HEADERS = ["run", "tau", "tokens/s", "speedup vs none", "steps", "tokens", "acceptance by depth"]


def lanes(settings: CompareSettings, available: tuple[str, ...]) -> list[RunSettings | None]:
    """Each column's run; None leaves the column empty."""
    if settings.compare == CHAIN_VS_TREE:
        drafter = settings.drafter
        if drafter not in available:
            raise PlaygroundError(f"this backend has no {plots.label(drafter)} drafter to run chain vs tree with")
        pair = [settings.lane(drafter, "chain"), settings.lane(drafter, "tree")]
    else:
        pair = [settings.lane(name, settings.draft) if name in available else None for name in (EAGLE3, EAGLE31)]
    return pair + [settings.lane(NONE, "chain") if settings.with_none and NONE in available else None]


def lane_name(mode: str, request: GenerationRequest) -> str:
    """What keys a run's log, plots and exports: the drafter, and how it drafted when that differs."""
    if mode != CHAIN_VS_TREE or request.drafter == NONE:
        return request.drafter
    return run_name(request.drafter, str(request.tree) if request.tree else f"chain k={request.k}")


def summary_table(summaries: Mapping[str, RunSummary]) -> list[list]:
    base = summaries.get(NONE)
    rows = []
    for name, s in summaries.items():
        speedup = f"{s.tokens_per_s / base.tokens_per_s:.2f}x" if base and base.tokens_per_s > 0 else "–"
        rows.append([plots.label(name), round(s.mean_acceptance_length, 2), round(s.tokens_per_s, 1), speedup,
                     s.steps, s.tokens, " ".join(f"{a:.2f}" for a in s.per_position_acceptance) or "–"])
    return rows


def build(backends: Mapping[str, Engine], limits: Limits) -> None:
    c = controls(limits, backends, with_drafter=False, prefix="cmp")
    with gr.Row():
        c["compare"] = gr.Radio(MODES, value=DRAFTERS, label="compare", elem_id="cmp-mode",
                                info="chain vs tree runs the drafter below both ways, whatever `draft` says")
        c["drafter"] = gr.Dropdown([(LABELS[EAGLE31], EAGLE31), (LABELS[EAGLE3], EAGLE3)], value=EAGLE31,
                                   label="drafter for chain vs tree", elem_id="cmp-drafter")
        c["with_none"] = gr.Checkbox(value=True, label="also run without speculation (speedup baseline)")
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        guided = gr.Button("See attention drift", elem_id="see-drift")
        stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    gr.HTML(render.LEGEND)
    view = {}
    with gr.Row(equal_height=False):
        for slot, name in zip(SLOTS, (EAGLE3, EAGLE31, NONE)):
            with gr.Column():
                view[column(slot, "heading")] = gr.Markdown(f"#### {plots.label(name)}", elem_id=f"heading-{slot}")
                view[column(slot, "cards")] = gr.HTML(render.figures_html(None), elem_id=f"cards-{slot}")
                view[column(slot, "answer")] = gr.HTML(render.answer_html([]), elem_id=f"answer-{slot}")
                view[column(slot, "text")] = gr.Textbox(label="plain text", lines=3, buttons=["copy"],
                                                        elem_id=f"text-{slot}")
    with gr.Row():
        view["acceptance_plot"] = gr.Plot(label="acceptance by depth", elem_id="compare-acceptance")
        view["attention_plot"] = gr.Plot(label="attention by depth", elem_id="compare-attention")
        view["norm_plot"] = gr.Plot(label="fed-back RMS by depth", elem_id="compare-norm")
    view["table"] = gr.Dataframe(headers=TABLE_HEADERS, label="summary", interactive=False, elem_id="compare-table")
    view["files"] = gr.File(label="runs as JSON and CSV, plots as HTML", file_count="multiple")

    stops = StopRequests()

    def stream(settings: CompareSettings, session: str | None) -> Iterator[dict]:
        stops.take(session)   # a Stop pressed before this run started is not for it
        try:
            engine = backend(backends, settings.backend_name)
            columns = [make_request(limits, lane) if lane else None for lane in lanes(settings, engine.drafter_names)]
            names = [lane_name(settings.compare, r) if r else None for r in columns]
            requests = {n: r for n, r in zip(names, columns) if r}
            notes = {n: drafter_note(engine, r.drafter) for n, r in requests.items()}
            streams = {n: engine.generate(r) for n, r in requests.items()}
            probes = {n: engine.replayer(r.drafter) for n, r in requests.items() if r.drafter != NONE}
        except Exception as e:
            raise gr.Error(failure_message(e)) from None
        logs = {name: RunLog(r) for name, r in requests.items()}
        pacer, live = Pacer(), LivePlots()
        yield update(logs, notes, names, live, True, False)
        try:
            for name, event in interleave(streams):
                logs[name].events.append(event)
                ending = [name] if event.finish_reason else []
                stopping = stops.take(session)
                if stopping:   # every run that has begun ends here; one that has not stays empty
                    running = [n for n, log in logs.items() if log.events and not log.finished]
                    for n in running:
                        logs[n].events[-1] = stopped(logs[n].events[-1])
                    ending += running
                for n in ending:
                    if probes.get(n) is not None:
                        logs[n].events, notes[n] = probes[n].replay(requests[n], logs[n].events), REPLAY_NOTE
                final = stopping or all(log.finished for log in logs.values())
                if final or pacer.due("text"):
                    yield update(logs, notes, names, live, final or pacer.due("plots"), final)
                if final:
                    return
        except Exception as e:
            yield update(logs, notes, names, live, True, True)
            raise gr.Error(failure_message(e)) from None

    def update(logs: dict[str, RunLog], notes: dict[str, str], names: list[str | None], live: LivePlots,
               redraw: bool, final: bool) -> dict:
        summaries = {n: log.summary for n, log in logs.items() if log.events}
        drafted = {n: s for n, s in summaries.items() if n != NONE}
        out = {}
        for slot, name in zip(SLOTS, names):
            out |= column_update(slot, name, logs.get(name), notes.get(name, ""), summaries.get(name))
        out |= dict(zip(PLOTS, live.get(lambda: plots.all_figures(drafted), redraw)))
        out["table"] = summary_table(summaries)
        out["files"] = export(logs, lambda path: plots.figures_file(drafted, path)) if final else None
        return out

    handler, inputs = stream_handler(CompareSettings, COMPARE_OUTPUTS, stream), named_inputs(CompareSettings, c)
    outputs = [view[name] for name in COMPARE_OUTPUTS]
    run.click(handler, inputs_kwargs=inputs, outputs=outputs, api_name="compare", concurrency_id="engine",
              concurrency_limit=limits.concurrency)
    # the settings the README's figures for the example were measured with
    example = {"prompt": DRIFT_EXAMPLE.prompt, "system": DRIFT_EXAMPLE.system, "template": DRIFT_EXAMPLE.template,
               "compare": DRAFTERS, "draft": "chain", "k": 5, "temperature": 0.0, "max_tokens": DEFAULT_MAX_TOKENS}
    guided.click(lambda: tuple(example.values()), None, [c[name] for name in example], queue=False,
                 api_name=False).then(
        handler, inputs_kwargs=inputs, outputs=outputs, api_name=False, concurrency_id="engine",
        concurrency_limit=limits.concurrency)
    stop.click(stop_handler(stops), None, None, queue=False, api_name=False)
    stored_benchmark()


def column_update(slot: str, name: str | None, log: RunLog | None, note: str, summary: RunSummary | None) -> dict:
    """One column's outputs: the run `name` (None: the column is not run this time)."""
    if name is None:
        return {column(slot, "cards"): render.figures_html(None),
                column(slot, "answer"): render.answer_html([], "not run"),
                column(slot, "text"): "", column(slot, "heading"): "#### not run"}
    waiting = "" if log.events else "waiting for the engine…"
    return {column(slot, "cards"): render.figures_html(summary),
            column(slot, "answer"): render.answer_html(log.events, note or waiting),
            column(slot, "text"): log.text, column(slot, "heading"): f"#### {plots.label(name)}"}


def stored_benchmark() -> None:
    """The last `python -m playground bench` result shipped with the app, if there is one."""
    if not STORED_BENCHMARK.exists():
        return
    with gr.Accordion("Stored benchmark: the prompt suite by category (python -m playground bench)", open=False,
                      elem_id="stored-benchmark"):
        gr.Markdown(STORED_BENCHMARK.read_text())
