"""The Comparison tab: one prompt through two runs streaming side by side (any two drafters or servers
by name, EAGLE 3 against EAGLE 3.1 by default, or one drafter's chain against its tree) and optionally
a baseline without speculation, with overlaid plots and a summary table."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Iterator, Mapping

import gradio as gr

from playground import plots
from playground.engines.protocol import Engine
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunSummary, first_difference, timed
from playground.engines.step_diff import Tolerance
from playground.errors import PlaygroundError
from playground.evaluation.machine import described
from playground.model.variants import NONE, run_name
from playground.studies import rejection_report
from playground.ui import explainer, render, unchecked
from playground.ui.controls import (DEFAULT_MAX_TOKENS, answer_header, default_drafter, default_pair, drafter_choices,
                                    follow_backend, keep_or, preset_dropdown, prompt_box, run_note, settings_panel,
                                    wire_presets, with_default)
from playground.ui.endpoints import (COMPARE_OUTPUTS, PLOTS, SLOTS, CompareSettings, RunSettings, column,
                                     input_validator, named_inputs, refusal, stream_handler)
from playground.ui.explainer import STORED_REJECTION, STORED_RESULTS, stored, stored_bench, stored_speedups
from playground.ui.presets import DRIFT_EXAMPLE
from playground.ui.runs import LivePlots, RunLog, export
from playground.ui.step_columns import ColumnsDiff, divergence_marks, step_diff, step_figure, step_note, step_tolerance
from playground.ui.streams import (MAX_SEED, NEW_SEED, SHARED_NOTE, Frame, Limits, StopRequests, backend,
                                   drive, make_request, stop_handler)

DRAFTERS, CHAIN_VS_TREE, CHAIN_VS_STOP = "drafters", "chain-vs-tree", "chain-vs-stop"
MODES = [("two drafters", DRAFTERS), ("chain vs tree, one drafter", CHAIN_VS_TREE),
         ("fixed k vs a stop rule, one drafter", CHAIN_VS_STOP)]
ONE_DRAFTER = (CHAIN_VS_TREE, CHAIN_VS_STOP)
STORED_BENCHMARK = STORED_RESULTS.with_name("results.md")   # the table of the results the explainer quotes
TABLE_HEADERS = ["run", "tokens/s", "decode tokens/s", "speedup vs none", "decode speedup", "tokens/pass",
                 "tau (vLLM's)", "draft ms/step", "verify ms/step", "steps", "tokens", "acceptance by depth"]


# what to watch after "See attention drift" (tests/test_explainer.py holds it to the first screen's runs of that example)
DRIFT_NOTE = ("*See attention drift* runs EAGLE 3 beside EAGLE 3.1 on the coding example at k=5. Where they differ: "
              "the plots' dotted lines (attention to a drafter's own drafts, by depth: EAGLE 3.1's runs higher from "
              "depth 2) and the fed-back RMS (EAGLE 3's grows with depth, EAGLE 3.1's stays near 2); the solid sink "
              "lines mostly overlap.")


def noise_note() -> str:
    """How far one run's speeds can be trusted, and what the stored benchmark measured over many."""
    results = stored_bench()
    speedups = stored_speedups(results) if results else ""
    return ("The speeds above are one run on a shared CPU, and noisy: the runs take turns step by step, and a slow "
            "first token lowers a whole run's rate (python -m playground bench measures over many prompts). "
            + speedups).strip()


def lanes(settings: CompareSettings, available: tuple[str, ...]) -> list[RunSettings | None]:
    """Each column's run; None leaves the column empty."""
    modes = dict((mode, label) for label, mode in MODES)
    if not isinstance(settings.compare, str) or settings.compare not in modes:
        raise PlaygroundError(f"compare must be one of {', '.join(map(repr, modes))}, got {settings.compare!r}",
                              "compare")
    if settings.compare in ONE_DRAFTER:
        drafter = settings.drafter
        if drafter == NONE or drafter not in available:
            raise PlaygroundError(f"{modes[settings.compare].partition(',')[0]} needs a drafter this backend runs "
                                  f"({', '.join(plots.label(n) for n in available if n != NONE)}), got {drafter!r}",
                                  "drafter")
        if settings.compare == CHAIN_VS_STOP and not str(settings.draft_stop or "").strip():
            raise PlaygroundError("fixed k vs a stop rule needs a rule: write one under Settings, e.g. "
                                  "probability<0.3", "draft_stop")
        second = settings.lane(drafter, "tree", stop=False) if settings.compare == CHAIN_VS_TREE else \
            settings.lane(drafter, "chain")
        pair, columns = [settings.lane(drafter, "chain", stop=False), second], ()
    else:
        defaults = default_pair(available)
        columns = (settings.first or defaults[0], settings.second or defaults[1])
        for slot, name in zip(("first", "second"), columns):
            if name and name not in available:
                raise PlaygroundError(f"unknown {slot} run {name!r}; this backend runs {', '.join(available)}", slot)
        if columns[0] and columns[0] == columns[1]:
            raise PlaygroundError(f"the first and second runs are both {columns[0]!r}: pick two", "second")
        pair = [settings.lane(name, settings.draft) if name else None for name in columns]
    baseline = baseline_name(settings, available, columns) if settings.with_none else ""
    return pair + [settings.lane(baseline, "chain", stop=False) if baseline else None]


def run_choices(engine: Engine, slot: str) -> list[tuple[str, str]]:
    """A run control's choices on `engine`: its default (what the empty value resolves to), then every name."""
    names = engine.drafter_names
    resolved = (NONE if NONE in names else "") if slot == "baseline" else default_pair(names)[slot == "second"]
    return with_default(drafter_choices(engine), resolved)


def baseline_name(settings: CompareSettings, available: tuple[str, ...], columns: tuple[str, ...]) -> str:
    """The baseline column's run: the one named, else none where the backend runs it and it is not
    already a column ("": no baseline)."""
    if not settings.baseline:
        return NONE if NONE in available and NONE not in columns else ""
    if settings.baseline not in available:
        raise PlaygroundError(f"unknown baseline {settings.baseline!r}; this backend runs {', '.join(available)}",
                              "baseline")
    if settings.baseline in columns:
        raise PlaygroundError(f"the baseline {settings.baseline!r} is already a column: pick another", "baseline")
    return settings.baseline


def one_seed(settings: CompareSettings) -> CompareSettings:
    """The settings with one seed for every column: a new one when they ask for a new one each run."""
    if settings.seed != NEW_SEED:
        return settings
    return replace(settings, seed=random.randint(0, MAX_SEED))


def lane_name(mode: str, request: GenerationRequest, baseline: bool) -> str:
    """What keys a run's log, plots and exports: the drafter, and how it drafted when that differs."""
    if mode not in ONE_DRAFTER or baseline:
        return request.drafter
    return run_name(request.drafter, request.drafting)


def summary_table(summaries: Mapping[str, RunSummary], baseline: str | None = NONE) -> list[list]:
    """A row per run under TABLE_HEADERS: rates as text in fixed decimals, counts as integers; the
    times per verify step are means (the prefill excluded), "–" where the engine times no step (a vLLM
    server); speedups are over the run `baseline`."""
    base = summaries.get(baseline) if baseline else None
    rows = []
    for name, s in summaries.items():
        speedup = f"{s.tokens_per_s / base.tokens_per_s:.2f}x" if base and base.tokens_per_s > 0 else "–"
        decode = f"{s.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x" if base and base.decode_tokens_per_s > 0 else "–"
        rows.append([plots.label(name), f"{s.tokens_per_s:.1f}", f"{s.decode_tokens_per_s:.1f}", speedup, decode,
                     f"{s.tokens_per_pass:.2f}", f"{s.mean_acceptance_length:.2f}",
                     f"{s.draft_ms_per_step:.1f}" if s.drafting_steps and timed(s.verify_ms_per_step) else "–",
                     f"{s.verify_ms_per_step:.1f}" if timed(s.verify_ms_per_step) else "–", s.steps, s.tokens,
                     " ".join(f"{a:.2f}" for a in s.per_position_acceptance) or "–"])
    return rows


def slower_reason(name: str, run: RunSummary, base: RunSummary) -> str:
    """Why a run with speculation came out slower than the baseline, in one sentence ("" where it did not):
    the prefill's share, which speculation cannot shorten, and what a decode step cost against a plain
    one on this CPU at this context, against the tokens each pass made."""
    if not base.tokens_per_s or run.tokens_per_s >= base.tokens_per_s or not run.steps or not base.steps:
        return ""
    parts = [f"{plots.label(name)} ran {run.tokens_per_s / base.tokens_per_s:.2f}x end to end"]
    prefill = run.time_to_first_token_s / run.elapsed_s if run.elapsed_s else 0.0
    if prefill >= 0.25:
        parts.append(f"the prefill ({run.time_to_first_token_s:.1f} s, {prefill:.0%} of the run) is the same work "
                     "with or without drafts")
    step_ms = (run.elapsed_s - run.time_to_first_token_s) * 1e3 / run.steps
    plain_ms = (base.elapsed_s - base.time_to_first_token_s) * 1e3 / base.steps
    if base.decode_tokens_per_s and run.decode_tokens_per_s < base.decode_tokens_per_s:
        parts.append(f"decoding alone {run.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x: a step took "
                     f"{step_ms:.1f} ms against {plain_ms:.1f} ms without speculation at this context on this CPU, "
                     f"so each pass had to make {step_ms / plain_ms:.2f} tokens to break even, and made "
                     f"{run.tokens_per_pass:.2f}")
    return "; ".join(parts) + ". "


def outputs_note(logs: Mapping[str, RunLog], steps: ColumnsDiff | None = None, baseline: str | None = None) -> str:
    """A line for under the table: whether the runs' answers are the same tokens (where not, from
    which token on, and why when a reason is known), where two drafting columns first differ step by
    step (`steps`, from `step_diff`), why a run came out slower than the `baseline` run, then how far one
    run's speeds can be trusted."""
    ran = [log for log in logs.values() if log.events]
    if len(ran) < 2:
        return noise_note()
    base = logs[baseline].summary if baseline in logs and logs[baseline].events else None
    slower = "".join(slower_reason(name, log.summary, base) for name, log in logs.items()
                     if base and name != baseline and log.events)
    answers = [log.summary.token_ids for log in ran]
    temperature = max(log.request.temperature for log in ran)
    if all(answer == answers[0] for answer in answers):
        runs = {2: "Both", 3: "All three"}.get(len(ran), f"All {len(ran)}")
        lossless = "" if temperature > 0 else " (greedy decoding is lossless)"
        return f"{runs} answers are identical token for token{lossless}. {step_note(steps)}{slower}{noise_note()}"
    differ = min(d for other in answers[1:] if (d := first_difference(answers[0], other)) is not None)
    why = (f": at temperature {temperature:g} each run samples its own tokens (speculative sampling keeps the "
           f"target's distribution, not its draws)" if temperature > 0
           else ": a run was stopped" if any(log.events[-1].finish_reason == "stopped" for log in ran) else "")
    return f"The answers differ from token {differ + 1} on{why}. {step_note(steps)}{slower}{noise_note()}"


@dataclass(frozen=True)
class Layout:
    """The tab's components: the comparison's settings (CompareSettings' inputs by name), what a run fills
    (COMPARE_OUTPUTS by name), and the buttons."""
    controls: dict[str, gr.components.Component]
    view: dict[str, gr.components.Component]
    run: gr.Button
    guided: gr.Button
    stop: gr.Button


def layout(backends: Mapping[str, Engine], limits: Limits) -> Layout:
    """The tab's components, with their own wiring: the runs offered follow the backend picked, and the
    compare mode shows the controls it takes."""
    c = {"prompt": prompt_box(limits, "cmp")}
    with gr.Row(elem_id="cmp-choices"):
        c["preset"] = preset_dropdown("cmp")
        c["compare"] = unchecked.Radio(MODES, value=DRAFTERS, label="compare", elem_id="cmp-mode", min_width=200, scale=2)
        c["with_none"] = gr.Checkbox(value=True, label="also run without speculation (speedup baseline)",
                                     min_width=160)
    first_engine = next(iter(backends.values()))
    with gr.Row(elem_id="cmp-runs"):
        for slot in ("first", "second", "baseline"):
            c[slot] = unchecked.Dropdown(run_choices(first_engine, slot), value="", min_width=120,
                                         label="baseline (without speculation)" if slot == "baseline" else slot,
                                         elem_id=f"cmp-{slot}")
        c["drafter"] = unchecked.Dropdown(drafter_choices(first_engine), label="drafter (one drafter, two ways)",
                                          value=default_drafter(first_engine.drafter_names), visible=False,
                                          min_width=120, elem_id="cmp-drafter")
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run", min_width=80)
        guided = gr.Button("See attention drift", elem_id="see-drift", min_width=80)
        stop = gr.Button("Stop", variant="secondary", elem_id="compare-stop", min_width=80)
    gr.Markdown(DRIFT_NOTE, elem_id="see-drift-note", elem_classes=["note"])
    c |= settings_panel(limits, backends, "cmp")
    for slot in ("first", "second", "baseline"):
        follow_backend(c, backends, slot, keep_or(lambda names: ""), partial(run_choices, slot=slot))
    follow_backend(c, backends, "drafter", keep_or(default_drafter))
    # the mode needs the stop rule's box, which sits in Settings: open them to it when the mode is picked
    # (a message at a control in a closed panel opens it anyway, page-wide: render.PAGE_JS)
    c["compare"].change(lambda mode: (gr.update(visible=mode in ONE_DRAFTER),
                                      *[gr.update(visible=mode not in ONE_DRAFTER)] * 2,
                                      gr.update(open=True) if mode == CHAIN_VS_STOP else gr.skip()),
                        c["compare"], [c["drafter"], c["first"], c["second"], c["settings_panel"]], api_name=False,
                        queue=False)
    answer_header("cmp")
    view = {}
    with gr.Row(equal_height=False):
        for slot, name in zip(SLOTS, (*default_pair(first_engine.drafter_names), NONE)):
            with gr.Column():
                view[column(slot, "heading")] = gr.Markdown(f"#### {plots.label(name)}", elem_id=f"heading-{slot}")
                view[column(slot, "cards")] = gr.HTML(render.figures_html(None), elem_id=f"cards-{slot}")
                view[column(slot, "answer")] = gr.HTML(render.answer_html([]), elem_id=f"answer-{slot}",
                                                       elem_classes=["answer-block", "answers-cmp"])
                with gr.Accordion("plain text", open=False, elem_id=f"plain-{slot}"):
                    view[column(slot, "text")] = gr.Textbox(show_label=False, lines=3, buttons=["copy"],
                                                            elem_id=f"text-{slot}")
    with gr.Row():
        for name, elem_id in zip(PLOTS, ("compare-acceptance", "compare-attention", "compare-norm")):
            view[name] = gr.Plot(None, show_label=False, min_width=300, elem_id=elem_id)
    # empty outputs are hidden by the page's CSS (render.CSS) until a value fills them: no property changes,
    # which Gradio would keep in the session run after run (runs.LivePlots)
    view["table"] = gr.Dataframe(None, headers=TABLE_HEADERS, label="summary", interactive=False, elem_id="compare-table")
    view["note"] = gr.Markdown(elem_id="compare-note")
    view["step_plot"] = gr.Plot(None, show_label=False, elem_id="compare-steps")
    view["files"] = gr.File(label="runs as JSON and CSV, plots as HTML", file_count="multiple", elem_id="compare-files")
    return Layout(c, view, run, guided, stop)


class Runs:
    """The tab's handlers: a comparison checked before it queues, streamed column by column, and stopped."""

    def __init__(self, backends: Mapping[str, Engine], limits: Limits):
        self.backends, self.limits, self.stops = backends, limits, StopRequests()

    def column_requests(self, settings: CompareSettings) -> list[GenerationRequest | None]:
        engine = backend(self.backends, settings.backend_name)
        return [make_request(self.limits, lane, engine) if lane else None
                for lane in lanes(settings, engine.drafter_names)]

    def stream(self, settings: CompareSettings, session: str | None) -> Iterator[dict]:
        self.stops.take(session)   # a Stop pressed before this run started is not for it
        try:
            engine = backend(self.backends, settings.backend_name)
            columns = self.column_requests(one_seed(settings))
            names = [lane_name(settings.compare, r, slot == "none") if r else None for slot, r in zip(SLOTS, columns)]
            baseline = names[-1]
            requests = {n: r for n, r in zip(names, columns) if r}
            notes = {n: run_note(engine, r) for n, r in requests.items()}
            streams = {n: engine.generate(r) for n, r in requests.items()}
            tolerance = step_tolerance(engine)
        except Exception as e:
            raise refusal(e) from None
        logs, live = {name: RunLog(r) for name, r in requests.items()}, LivePlots()
        draw = lambda frame: update(logs, notes, names, baseline, tolerance, live, frame)
        yield from drive(streams, logs, lambda: self.stops.take(session), draw,
                         opening=Frame(redraw=True, final=False))   # before the first step: the plots cleared

    def check(self, settings: CompareSettings) -> None:
        engine = backend(self.backends, settings.backend_name)
        for request in filter(None, self.column_requests(settings)):
            engine.check(request)


def update(logs: dict[str, RunLog], notes: dict[str, str], names: list[str | None], baseline: str | None,
           tolerance: Tolerance, live: LivePlots, frame: Frame) -> dict:
    """The tab's outputs: each column's run (`names` by slot, None where a column does not run), the plots of
    the drafting runs, the table against `baseline`, and once the runs end, where they first differ."""
    summaries = {n: log.summary for n, log in logs.items() if log.events}
    drafted = {n: s for n, s in summaries.items() if n != baseline}
    steps = step_diff(logs, tolerance) if frame.final else None
    out, marks = {}, divergence_marks(steps)
    for slot, name in zip(SLOTS, names):
        out |= column_update(slot, name, logs.get(name), notes.get(name, ""), summaries.get(name), marks.get(name))
    shown = live.get(lambda: plots.all_figures(drafted), frame.redraw)   # a final update always redraws
    out |= dict(zip(PLOTS, shown))
    # the frame's mark goes in the small cards: a finished column's long answer is then not drawn again
    out[column(SLOTS[0], "cards")] += render.frame_mark(frame.run, frame.number)
    out["table"] = summary_table(summaries, baseline)
    out["note"] = outputs_note(logs, steps, baseline) if frame.final else ""
    if frame.shared:
        out["note"] = f"{SHARED_NOTE} {out['note']}"
    out["step_plot"] = step_figure(logs, steps)
    out["files"] = export(logs, (*live.figures, *((out["step_plot"],) if steps else ()))) if frame.final else None
    return out


def build(backends: Mapping[str, Engine], limits: Limits) -> None:
    """The tab, wired, with the stored benchmark and rejection study under it."""
    tab, runs = layout(backends, limits), Runs(backends, limits)
    c = tab.controls
    handler, inputs = stream_handler(CompareSettings, COMPARE_OUTPUTS, runs.stream), named_inputs(CompareSettings, c)
    outputs = [tab.view[name] for name in COMPARE_OUTPUTS]
    validator = input_validator(CompareSettings, runs.check)

    def runs_from(trigger: Callable, api_name: str | bool) -> None:
        trigger(handler, inputs_kwargs=inputs, outputs=outputs, validator=validator, api_name=api_name,
                concurrency_id="engine", concurrency_limit=limits.concurrency)

    picked = wire_presets(c)
    runs_from(tab.run.click, "compare")
    runs_from(picked.then, False)
    # the settings the README's figures for the example were measured with
    example = {"prompt": DRIFT_EXAMPLE.prompt, "system": DRIFT_EXAMPLE.system, "template": DRIFT_EXAMPLE.template,
               "compare": DRAFTERS, "draft": "chain", "k": 5, "temperature": 0.0, "max_tokens": DEFAULT_MAX_TOKENS,
               "first": "", "second": "", "baseline": "", "draft_stop": ""}   # EAGLE 3 and 3.1, whatever was picked
    runs_from(tab.guided.click(lambda: tuple(example.values()), None, [c[name] for name in example], queue=False,
                               api_name=False).then, False)
    tab.stop.click(stop_handler(runs.stops), None, None, queue=False, api_name=False)
    stored_benchmark()
    stored_rejection_study()


def column_update(slot: str, name: str | None, log: RunLog | None, note: str, summary: RunSummary | None,
                  diverged: tuple[int, str] | None = None) -> dict:
    """One column's outputs: the run `name` (None: the column is not run this time); `diverged`: the
    step to outline as its first difference from the run beside it."""
    if name is None:
        return {column(slot, "cards"): render.figures_html(None),
                column(slot, "answer"): render.answer_html([], "not run"),
                column(slot, "text"): "", column(slot, "heading"): "#### not run"}
    waiting = "" if log.events else render.PREFILL_NOTE
    return {column(slot, "cards"): render.figures_html(summary),
            column(slot, "answer"): render.answer_html(log.steps, note or waiting, diverged=diverged),
            column(slot, "text"): log.text, column(slot, "heading"): f"#### {plots.label(name)}"}


def stored_benchmark() -> None:
    """The last `python -m playground bench` result shipped with the app, if there is one."""
    if not STORED_BENCHMARK.exists():
        return
    with gr.Accordion("Stored benchmark: the prompt suite by category (python -m playground bench)", open=False,
                      elem_id="stored-benchmark"):
        gr.Markdown(generate_note() + "\n\n" + STORED_BENCHMARK.read_text())


def stored_rejection_study() -> None:
    """What tells a rejected draft in advance, from the `bench rejection` report shipped with the app."""
    report = stored(STORED_REJECTION, rejection_report.RejectionReport)
    if report is None:
        return
    with gr.Accordion("What predicts a rejection: the drift signals draft by draft (python -m playground bench "
                      "rejection)", open=False, elem_id="stored-rejection"):
        gr.Plot(rejection_report.figure(report), show_label=False, elem_id="rejection-plot")
        gr.Markdown(f"{explainer.rejection(report)} {rejection_report.alone(report)} Measured on "
                    f"{described(report.machine)}; the method and the full table: docs/drift.md.")


def generate_note() -> str:
    """What the stored table's two kinds of speedup measure."""
    results = stored_bench()
    own = [row.vs_generate for row in results.of_method(NONE) if row.vs_generate] if results else []
    engine = f" (without speculation it runs {min(own):.1f}x to {max(own):.1f}x as fast)" if own else ""
    return ("*vs none* is the gain from speculation alone: the same engine without a drafter. *vs generate* is "
            f"against transformers' `generate()`, and counts this engine's own kernels too{engine}.")
