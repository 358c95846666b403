"""The Comparison tab: one prompt through two runs streaming side by side (EAGLE 3 against EAGLE 3.1,
or one drafter's chain against its tree) and optionally no speculation, with overlaid plots and a
summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import gradio as gr

from playground import plots
from playground.engines.protocol import Engine
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunSummary
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.model.variants import EAGLE3, EAGLE31, LABELS, NONE, run_name
from playground.ui import render
from playground.ui.playground_tab import drafter_note, settings
from playground.ui.runs import LivePlots, Pacer, RunLog, export
from playground.ui.streams import REPLAY_NOTE, Limits, backend, failure_message, interleave, make_request

SLOTS = ("first", "second", "none")   # the columns; element ids end with the slot
DRAFTERS, CHAIN_VS_TREE = "drafters", "chain-vs-tree"
MODES = [(f"{LABELS[EAGLE3]} vs {LABELS[EAGLE31]}", DRAFTERS), ("chain vs tree, one drafter", CHAIN_VS_TREE)]
STORED_BENCHMARK = Path(__file__).resolve().parents[2] / "assets" / "benchmark" / "reference" / "results.md"
TABLE_HEADERS = ["run", "tau", "tokens/s", "speedup vs none", "steps", "tokens", "acceptance by depth"]


def lanes(mode: str, drafter: str, draft: str, with_none: bool, available: tuple[str, ...]
          ) -> list[tuple[str, str] | None]:
    """(drafter, "chain" or "tree") for each column; None leaves the column empty."""
    if mode == CHAIN_VS_TREE:
        if drafter not in available:
            raise PlaygroundError(f"this backend has no {plots.label(drafter)} drafter to run chain vs tree with")
        pair = [(drafter, "chain"), (drafter, "tree")]
    else:
        pair = [(name, draft) if name in available else None for name in (EAGLE3, EAGLE31)]
    return pair + [(NONE, "chain") if with_none and NONE in available else None]


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
    c = settings(limits, backends, with_drafter=False, prefix="cmp")
    with gr.Row():
        mode = gr.Radio(MODES, value=DRAFTERS, label="compare", elem_id="cmp-mode",
                        info="chain vs tree runs the drafter below both ways, whatever `draft` says")
        lane_drafter = gr.Dropdown([(LABELS[EAGLE31], EAGLE31), (LABELS[EAGLE3], EAGLE3)], value=EAGLE31,
                                   label="drafter for chain vs tree", elem_id="cmp-drafter")
        include_none = gr.Checkbox(value=True, label="also run without speculation (speedup baseline)")
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    gr.HTML(render.LEGEND)
    headings, answers, cards, texts = {}, {}, {}, {}
    with gr.Row(equal_height=False):
        for slot, name in zip(SLOTS, (EAGLE3, EAGLE31, NONE)):
            with gr.Column():
                headings[slot] = gr.Markdown(f"#### {plots.label(name)}", elem_id=f"heading-{slot}")
                cards[slot] = gr.HTML(render.figures_html(None), elem_id=f"cards-{slot}")
                answers[slot] = gr.HTML(render.answer_html([]), elem_id=f"answer-{slot}")
                texts[slot] = gr.Textbox(label="plain text", lines=3, buttons=["copy"], elem_id=f"text-{slot}")
    with gr.Row():
        accept_plot = gr.Plot(label="acceptance by depth", elem_id="compare-acceptance")
        attention_plot = gr.Plot(label="attention by depth", elem_id="compare-attention")
        norm_plot = gr.Plot(label="fed-back RMS by depth", elem_id="compare-norm")
    table = gr.Dataframe(headers=TABLE_HEADERS, label="summary", interactive=False, elem_id="compare-table")
    files = gr.File(label="runs as JSON and CSV, plots as HTML", file_count="multiple")

    def stream(prompt, system, template, k, temperature, top_p, max_tokens, with_none, backend_name, draft="chain",
               tree_top_k=TreeShape.top_k, tree_depth=TreeShape.depth, tree_nodes=TreeShape.nodes,
               compare=DRAFTERS, drafter=EAGLE31):
        try:
            engine = backend(backends, backend_name)
            slots = [make_request(limits, prompt, system, template, lane[0], k, temperature, top_p, max_tokens,
                                  draft=lane[1], tree=(tree_top_k, tree_depth, tree_nodes)) if lane else None
                     for lane in lanes(compare, drafter, draft, with_none, engine.drafter_names)]
            names = [lane_name(compare, r) if r else None for r in slots]
            requests = {n: r for n, r in zip(names, slots) if r}
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
                if event.finish_reason and probes.get(name) is not None:
                    logs[name].events, notes[name] = probes[name].replay(requests[name], logs[name].events), REPLAY_NOTE
                final = all(log.finished for log in logs.values())
                if final or pacer.due("text"):
                    yield update(logs, notes, names, live, final or pacer.due("plots"), final)
        except Exception as e:
            yield update(logs, notes, names, live, True, True)
            raise gr.Error(failure_message(e)) from None

    def update(logs: dict[str, RunLog], notes: dict[str, str], names: list[str | None], live: LivePlots,
               redraw: bool, final: bool):
        summaries = {n: log.summary for n, log in logs.items() if log.events}
        drafted = {n: s for n, s in summaries.items() if n != NONE}
        out = []
        for name in names:
            if name is None:
                out += [render.figures_html(None), render.answer_html([], "not run"), ""]
                continue
            waiting = "" if logs[name].events else "waiting for the engine…"
            out += [render.figures_html(summaries.get(name)),
                    render.answer_html(logs[name].events, notes[name] or waiting), logs[name].text]
        out += live.get(lambda: plots.all_figures(drafted), redraw)
        out.append(summary_table(summaries))
        out.append(export(logs, lambda path: plots.figures_file(drafted, path)) if final else None)
        out += [f"#### {plots.label(name) if name else 'not run'}" for name in names]
        return tuple(out)

    inputs = [c[n] for n in ("prompt", "system", "template", "k", "temperature", "top_p", "max_tokens")]
    inputs += [include_none, c["backend"], c["draft"], c["tree_top_k"], c["tree_depth"], c["tree_nodes"], mode,
               lane_drafter]
    outputs = [x for slot in SLOTS for x in (cards[slot], answers[slot], texts[slot])]
    outputs += [accept_plot, attention_plot, norm_plot, table, files] + [headings[slot] for slot in SLOTS]
    running = run.click(stream, inputs, outputs, api_name="compare", concurrency_id="engine",
                        concurrency_limit=limits.concurrency)
    stop.click(None, None, None, cancels=[running], api_name=False)
    stored_benchmark()


def stored_benchmark() -> None:
    """The last `python -m playground bench` result shipped with the app, if there is one."""
    if not STORED_BENCHMARK.exists():
        return
    with gr.Accordion("Stored benchmark: the prompt suite by category (python -m playground bench)", open=False,
                      elem_id="stored-benchmark"):
        gr.Markdown(STORED_BENCHMARK.read_text())
