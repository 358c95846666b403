"""The Comparison tab: one prompt through EAGLE 3 and EAGLE 3.1 (and optionally no speculation),
streaming side by side, with overlaid plots and a summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import gradio as gr

from playground import plots
from playground.engines.protocol import Engine
from playground.engines.stats import RunSummary
from playground.engines.tree import TreeShape
from playground.model.variants import NAMES, NONE
from playground.ui import render
from playground.ui.playground_tab import drafter_note, settings
from playground.ui.runs import LivePlots, Pacer, RunLog, export
from playground.ui.streams import REPLAY_NOTE, Limits, backend, failure_message, interleave, make_request

COLUMNS = NAMES
STORED_BENCHMARK = Path(__file__).resolve().parents[2] / "assets" / "benchmark" / "reference" / "results.md"
TABLE_HEADERS = ["drafter", "tau", "tokens/s", "speedup vs none", "steps", "tokens", "acceptance by depth"]


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
        include_none = gr.Checkbox(value=True, label="also run without speculation (speedup baseline)")
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    gr.HTML(render.LEGEND)
    answers, cards, texts = {}, {}, {}
    with gr.Row(equal_height=False):
        for name in COLUMNS:
            with gr.Column():
                gr.Markdown(f"#### {plots.label(name)}")
                cards[name] = gr.HTML(render.figures_html(None), elem_id=f"cards-{name.replace('.', '')}")
                answers[name] = gr.HTML(render.answer_html([]), elem_id=f"answer-{name.replace('.', '')}")
                texts[name] = gr.Textbox(label="plain text", lines=3, buttons=["copy"], elem_id=f"text-{name.replace('.', '')}")
    with gr.Row():
        accept_plot = gr.Plot(label="acceptance by depth", elem_id="compare-acceptance")
        attention_plot = gr.Plot(label="attention by depth", elem_id="compare-attention")
        norm_plot = gr.Plot(label="fed-back RMS by depth", elem_id="compare-norm")
    table = gr.Dataframe(headers=TABLE_HEADERS, label="summary", interactive=False, elem_id="compare-table")
    files = gr.File(label="runs as JSON and CSV, plots as HTML", file_count="multiple")

    def stream(prompt, system, template, k, temperature, top_p, max_tokens, with_none, backend_name, draft="chain",
               tree_top_k=TreeShape.top_k, tree_depth=TreeShape.depth, tree_nodes=TreeShape.nodes):
        try:
            engine = backend(backends, backend_name)
            names = [n for n in COLUMNS if (with_none or n != NONE) and n in engine.drafter_names]
            requests = {n: make_request(limits, prompt, system, template, n, k, temperature, top_p, max_tokens,
                                        draft=draft, tree=(tree_top_k, tree_depth, tree_nodes)) for n in names}
            notes = {n: drafter_note(engine, n) for n in names}
            streams = {n: engine.generate(r) for n, r in requests.items()}
            probes = {n: engine.replayer(n) for n in names if n != NONE}
        except Exception as e:
            raise gr.Error(failure_message(e)) from None
        logs = {n: RunLog(r) for n, r in requests.items()}
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

    def update(logs: dict[str, RunLog], notes: dict[str, str], names: list[str], live: LivePlots, redraw: bool,
               final: bool):
        summaries = {n: log.summary for n, log in logs.items() if log.events}
        drafted = {n: s for n, s in summaries.items() if n != NONE}
        out = []
        for name in COLUMNS:
            if name not in names:
                out += [render.figures_html(None), render.answer_html([], "not run"), ""]
                continue
            waiting = "" if logs[name].events else "waiting for the engine…"
            out += [render.figures_html(summaries.get(name)),
                    render.answer_html(logs[name].events, notes[name] or waiting), logs[name].text]
        out += live.get(lambda: plots.all_figures(drafted), redraw)
        out.append(summary_table(summaries))
        out.append(export(logs, lambda path: plots.figures_file(drafted, path)) if final else None)
        return tuple(out)

    inputs = [c[n] for n in ("prompt", "system", "template", "k", "temperature", "top_p", "max_tokens")]
    inputs += [include_none, c["backend"], c["draft"], c["tree_top_k"], c["tree_depth"], c["tree_nodes"]]
    outputs = [x for n in COLUMNS for x in (cards[n], answers[n], texts[n])]
    outputs += [accept_plot, attention_plot, norm_plot, table, files]
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
