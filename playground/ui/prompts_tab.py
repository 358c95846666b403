"""The Your prompts tab: a prompt file through the drafters, the report filling in as prompts finish.

A study runs in a queue of its own (one at a time on the page), so that Playground and Comparison runs
keep being served beside it: the engine interleaves them step by step, and each run's time counts only
its own steps. Clicking a prompt of the report opens it in the Playground tab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Iterator, Mapping

import gradio as gr
import pandas as pd

from playground.engines.protocol import Engine
from playground.engines.request import K_RANGE, check_k, check_max_tokens
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation import prompt_report
from playground.evaluation.prompt_study import StudyConfig, measure
from playground.evaluation.runner import PromptResult
from playground.evaluation.study_report import StudyReport
from playground.plots import label
from playground.prompts.files import PromptFile, PromptFileError, PromptLimits, check_size, \
    read_prompt_file, read_prompts
from playground.ui import unchecked
from playground.ui.controls import default_pair, drafter_choices, follow_backend
from playground.ui.endpoints import (STUDY_OUTPUTS, STUDY_PLOTS, StudySettings, failure_message, input_validator,
                                     named_inputs, quiet_refusal, stream_handler, text, whole_number)
from playground.ui.runs import LivePlots, Pacer, export_folder
from playground.ui.streams import (SHARED_CPU, Limits, StopRequests, backend, draft_mode, stop_handler,
                                   unknown_drafter)

DEFAULT_MAX_TOKENS = 64
FIGURES = dict(zip(STUDY_PLOTS, ("tau", "length", "per_prompt", "acceptance", "sink", "rms")))
HELP = ("JSONL or JSON with OpenAI `messages`, `prompt` records (optional `system`, `category`, `id`, `document`: "
        "prompts about one document are resampled together) or ShareGPT "
        "`conversations`; CSV with a `prompt` column; or plain text with prompts separated by blank lines. "
        "Greedy: both drafters answer each prompt with the same tokens, so their tokens per target pass compare "
        "the same text.")
SAMPLES = Path(__file__).resolve().parents[2] / "assets" / "prompts"
NOT_YET = None   # a plot not drawn yet: the page hides an empty plot (render.CSS)


def prompt_limits(limits: Limits) -> PromptLimits:
    """What one prompt file of the tab may hold; its byte limit is the page's upload limit too."""
    return PromptLimits(max_prompts=limits.study_prompts, max_prompt_chars=limits.max_prompt_chars)


def study_config(limits: Limits, settings: StudySettings, engine: Engine) -> StudyConfig:
    """The study's configuration, and that it has prompts to read, without reading them: the checks of the
    validator, which runs outside the queue. Every problem is a PlaygroundError naming its control."""
    pasted = text(settings.pasted, "pasted")
    if not settings.file and (not pasted or pasted.isspace()):
        raise PlaygroundError("upload a prompt file or paste prompts", "file")
    if pasted and not settings.file:
        try:
            check_size(pasted, prompt_limits(limits))
        except PromptFileError as e:
            raise PlaygroundError(str(e), "pasted") from None
    sample = whole_number(settings.sample, "sample")
    if not 0 <= sample <= limits.study_prompts:
        raise PlaygroundError(f"sample must be 0 (every prompt) to {limits.study_prompts} prompts, got {sample:.6g}",
                              "sample")
    picked = settings.drafters or []
    if not isinstance(picked, list) or not all(isinstance(d, str) for d in picked):
        raise PlaygroundError("drafters must be a list of drafter names", "drafters")
    unknown = [d for d in picked if d not in engine.drafter_names]
    if unknown:
        raise unknown_drafter(unknown[0], engine, "drafters")
    drafters = tuple(d for d in engine.drafter_names if d in picked)
    if not drafters:
        raise PlaygroundError("pick at least one drafter", "drafters")
    draft = draft_mode(settings.draft)
    k = check_k(whole_number(settings.k, "k"))
    max_tokens = check_max_tokens(whole_number(settings.max_tokens, "max_tokens"), limits.max_tokens)
    tree = TreeShape() if draft == "tree" else None
    config = StudyConfig(drafters=drafters, k=k, max_tokens=max_tokens, tree=tree, backend=engine.name)
    return config.runnable_on(engine)


def study_prompts(limits: Limits, settings: StudySettings) -> PromptFile:
    """The prompts of the upload, else of the paste: read once per study, in the study's queue."""
    sample = whole_number(settings.sample, "sample") or None
    if settings.file:
        return read_prompt_file(settings.file, prompt_limits(limits), sample)
    return read_prompts(text(settings.pasted, "pasted"), prompt_limits(limits), sample)


@dataclass(frozen=True)
class Layout:
    """The tab's components: the study's settings (StudySettings' inputs by name), what a study fills
    (STUDY_OUTPUTS by name), the buttons, and the last study's prompts for the table's clicks."""
    controls: dict[str, gr.components.Component]
    view: dict[str, gr.components.Component]
    run: gr.Button
    stop: gr.Button
    opened: gr.State


def layout(backends: Mapping[str, Engine], limits: Limits) -> Layout:
    """The tab's components; the drafters offered follow the backend picked (their own wiring)."""
    view = {}
    with gr.Row(equal_height=False):
        with gr.Column(min_width=300):
            c = {"file": gr.File(label="Prompt file", file_types=[".jsonl", ".json", ".csv", ".txt"], type="filepath",
                                 elem_id="study-file"),
                 "pasted": gr.Textbox(label="…or paste prompts (any of the same formats)", lines=4, max_lines=10,
                                      elem_id="study-pasted")}
            gr.Markdown(HELP + f" At most {limits.study_prompts} prompts per file.", elem_classes=["study-help"])
            gr.Examples([[str(SAMPLES / "chat.jsonl")], [str(SAMPLES / "sharegpt.json")]], [c["file"]],
                        label="Samples")
        with gr.Column(min_width=300):
            with gr.Row():
                first = next(iter(backends.values()))
                c["drafters"] = unchecked.CheckboxGroup(drafter_choices(first), label="Drafters",
                                                        value=[n for n in default_pair(first.drafter_names) if n],
                                                        elem_id="study-drafters")
                c["backend_name"] = unchecked.Dropdown(list(backends), value=next(iter(backends)), label="Backend",
                                                       visible=len(backends) > 1, elem_id="study-backend")
            follow_backend(c, backends, "drafters", lambda names, current: [n for n in current or [] if n in names]
                           or [n for n in default_pair(names) if n])
            with gr.Row():
                c["k"] = unchecked.Slider(K_RANGE[0], K_RANGE[1], value=5, step=1, label="k (drafts per step)",
                                          elem_id="study-k")
                c["max_tokens"] = unchecked.Slider(1, limits.max_tokens, step=1, label="max tokens",
                                                   value=min(DEFAULT_MAX_TOKENS, limits.max_tokens),
                                                   elem_id="study-max-tokens")
            with gr.Row():
                c["draft"] = unchecked.Radio(["chain", "tree"], value="chain", label="draft", elem_id="study-draft",
                                             info="tree: each drafter drafts the default tree too")
                c["sample"] = unchecked.Number(0, precision=0, minimum=0, label="sample (0: every prompt)",
                                               elem_id="study-sample")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="study-run", min_width=80)
                stop = gr.Button("Stop", variant="secondary", elem_id="study-stop", min_width=80)
            view["progress"] = gr.HTML("<div class='study-line'>Upload a file or paste prompts, then press Run.</div>",
                                       elem_id="study-progress")
    view["report"] = gr.Markdown(elem_id="study-report", elem_classes=["report"])
    for row in (STUDY_PLOTS[:3], STUDY_PLOTS[3:]):
        with gr.Row():
            for name in row:
                view[name] = gr.Plot(NOT_YET, show_label=False, min_width=300,
                                     elem_id=f"study-{name.replace('_', '-')}")
    view["table"] = gr.Dataframe(label="Prompts (click one to open it in the Playground tab)", interactive=False,
                                 wrap=True, elem_id="study-table")
    view["files"] = gr.File(label="report: JSON, markdown, CSV per prompt, HTML (self-contained)",
                            file_count="multiple", elem_id="study-files")
    return Layout(c, view, run, stop, gr.State([]))


class StudyShown:
    """One study as the tab shows it: its prompts and configuration, the prompts measured so far, and the
    plots drawn of them."""

    def __init__(self, config: StudyConfig, prompts: PromptFile, source: str):
        self.config, self.prompts, self.source = config, prompts, source
        self.results: list[PromptResult] = []
        self.live = LivePlots(len(STUDY_PLOTS))
        self.texts = [(p.prompt, p.system or "") for p in prompts.prompts]   # what a click on the table opens

    def report(self, intervals: bool) -> tuple[StudyReport, list[PromptResult]]:
        """The report of the prompts measured so far, with them: the table shows the same prompts."""
        measured = list(self.results)
        return prompt_report.results(self.config, self.prompts, self.source, measured, intervals), measured

    def update(self, shown: tuple[StudyReport, list[PromptResult]], progress: str, *, redraw: bool,
               files: list[str] | None = None, figures: dict | None = None) -> dict:
        res, measured = shown
        drawn = lambda: tuple((figures or prompt_report.figure_set(res)).get(kind, NOT_YET) for kind in FIGURES.values())
        ran = any(r.skipped is None for r in measured)
        return {"progress": progress, "report": prompt_report.markdown(res) if ran else "",
                **dict(zip(STUDY_PLOTS, self.live.get(drawn, redraw))), "files": files, "opened": self.texts,
                "table": table(measured, [m.name for m in self.config.methods()], self.prompts)}


class Studies:
    """The tab's handlers: a study checked before it queues, streamed prompt by prompt, and stopped."""

    def __init__(self, backends: Mapping[str, Engine], limits: Limits):
        self.backends, self.limits, self.stops = backends, limits, StopRequests()

    def check(self, settings: StudySettings) -> None:
        study_config(self.limits, settings, backend(self.backends, settings.backend_name))

    def stream(self, settings: StudySettings, session: str | None) -> Iterator[dict]:
        self.stops.take(session)
        try:
            engine = backend(self.backends, settings.backend_name)
            config = study_config(self.limits, settings, engine)
            prompts = study_prompts(self.limits, settings)
        except Exception as e:   # the file, read here in the queue: its message where the progress shows
            error = quiet_refusal(e)
            yield {"progress": progress_html(0, 0, "not run", error.message), "report": "",
                   **dict.fromkeys(STUDY_PLOTS), "table": None, "files": None, "opened": []}
            raise error from None
        study = StudyShown(config, prompts, Path(settings.file).name if settings.file else "pasted prompts")
        pacer, started = Pacer(text_every_s=0.5, plots_every_s=2.0), time.monotonic()
        interim = study.report(False)
        yield study.update(interim, progress_html(0, len(prompts.prompts), "starting"), redraw=True)
        updates, error, how = measure(engine, prompts, config), "", "finished"
        with SHARED_CPU.job() as overlapped:   # the runs of other tabs learn that this study shares their CPU
            try:
                for u in updates:
                    if u.result is not None:
                        study.results.append(u.result)
                    if self.stops.take(session):   # the engine is free at once; the report with its intervals follows
                        how = "stopped"
                        line = f"stopped · {_clock(started)} · writing the report"
                        yield study.update(interim, progress_html(u.done, u.total, line), redraw=False)
                        break
                    if pacer.due("text"):
                        redraw = pacer.due("plots")
                        interim = study.report(False) if redraw else interim
                        line = f"{u.current} · {_clock(started)}"
                        yield study.update(interim, progress_html(u.done, u.total, line), redraw=redraw)
            except Exception as e:
                error, how = failure_message(e), "failed"
            finally:
                updates.close()
        final = study.report(True)
        figures = prompt_report.figure_set(final[0])
        files = [str(p) for p in prompt_report.write(final[0], export_folder(), figures)] if study.results else None
        line = f"{how} · {_clock(started)}" + (" · another visitor's job shared the CPU: speeds are lower than "
                                                "alone" if overlapped() else "")
        yield study.update(final, progress_html(len(study.results), len(prompts.prompts), line, error), redraw=True,
                           files=files, figures=figures)


def build(backends: Mapping[str, Engine], limits: Limits, tabs: gr.Tabs, playground: dict) -> None:
    """The tab, wired; `playground` holds the Playground tab's prompt, system and template controls, which a
    click on a prompt of the report fills before it switches to `tabs`' "playground" tab."""
    tab, studies = layout(backends, limits), Studies(backends, limits)
    outputs = [*(tab.view[name] for name in STUDY_OUTPUTS), tab.opened]
    handler = stream_handler(StudySettings, (*STUDY_OUTPUTS, "opened"), studies.stream)
    tab.run.click(handler, inputs_kwargs=named_inputs(StudySettings, tab.controls), outputs=outputs,
                  validator=input_validator(StudySettings, studies.check), api_name="study", concurrency_id="study",
                  concurrency_limit=1, show_progress="hidden")
    tab.stop.click(stop_handler(studies.stops), None, None, queue=False, api_name=False)
    tab.view["table"].select(open_prompt, tab.opened, [playground["prompt"], playground["system"],
                                                       playground["template"], tabs], api_name=False, queue=False)


def open_prompt(prompts: list, event: gr.SelectData) -> tuple:
    """The clicked prompt of the report's table, in the Playground tab's controls, and that tab."""
    row = event.row_value or []
    index = int(row[0]) - 1 if row and str(row[0]).isdigit() else -1   # the table counts from 1
    if not 0 <= index < len(prompts):
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    prompt, system = prompts[index]
    return prompt, system, "model", gr.Tabs(selected="playground")


def table(results: list[PromptResult], methods: list[str], prompts: PromptFile) -> pd.DataFrame:
    """A row per measured prompt, in the file's order: its place, id, category, length, each method's tokens
    per target pass, and the start of its text."""
    head = ["#", "id", "category", "prompt tokens", *(f"{label(m)} tokens/pass" for m in methods), "prompt"]
    rows = [[r.index + 1, r.id, r.category or "", r.prompt_tokens if not r.skipped else "–",
             *(f"{r.runs[m].tokens_per_pass:.2f}" if m in r.runs else "–" for m in methods),   # 1.70, not 1.7
             prompt_report.preview(prompts.prompts[r.index].prompt) if not r.skipped else f"skipped: {r.skipped}"]
            for r in sorted(results, key=lambda r: r.index)]
    return pd.DataFrame(rows, columns=head)


def progress_html(done: int, total: int, line: str, error: str = "") -> str:
    share = done / total if total else 0.0
    failed = f"<div class='study-error'>{escape(error)}</div>" if error else ""
    return (f"<div class='study-bar' role='progressbar' aria-valuemin='0' aria-valuemax='{total}' "
            f"aria-valuenow='{done}'><div style='width:{100 * share:.1f}%'></div></div>"
            f"<div class='study-line'>{done} of {total} prompts · {escape(line)}</div>{failed}")


def _clock(started: float) -> str:
    seconds = int(time.monotonic() - started)
    return f"{seconds // 60}:{seconds % 60:02d}"


CSS = (".study-bar { height: 10px; background: #e5e7eb; border-radius: 5px; overflow: hidden; } "
       ".study-bar > div { height: 100%; background: #1d4ed8; transition: width 0.3s; } "
       ".study-line { font-size: 13px; margin-top: 4px; } .study-error { color: #b91c1c; margin-top: 4px; }")
