"""A run as the page sees it: the events so far, their summary, exports, and update pacing."""

from __future__ import annotations

import csv
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from gradio.components.plot import PlotData

from playground import plots
from playground.engines.events import StepEvent, ended
from playground.engines.quantities import DEPTH_QUANTITIES
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunSummary, summarize

# one row per (run, verify step, draft depth); the step's own fields repeat on each of its depths
CSV_FIELDS = ("run", "step", "position", "depth", "draft_id", "draft_text", "draft_prob", "verdict",
              *(q.name for q in DEPTH_QUANTITIES), "accepted", "drafted", "committed_text",
              "draft_ms", "verify_ms", "elapsed_s", "finish_reason", "backend")
NAME_CHARS = 32   # the most characters of one run's name in a file name


@dataclass
class RunLog:
    request: GenerationRequest
    events: list[StepEvent] = field(default_factory=list)
    # the summary and the last event it was made with: a log read again without a new event is not summarised again
    _summarised: tuple[StepEvent, int, RunSummary] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self._end_stream()

    def add(self, event: StepEvent) -> None:
        """The stream's next event."""
        self.events.append(event)
        self._end_stream()

    def _end_stream(self) -> None:
        """At the stream's last event, the events become the exact verify steps (events.ended), once."""
        self.events = ended(self.events)

    @property
    def steps(self) -> list[StepEvent]:
        """The verify steps so far (exact once the stream has ended): what the answer, the inspector and the
        exports read."""
        return self.events

    @property
    def summary(self) -> RunSummary | None:
        """The run so far, summarised once per new event (a page's every update reads each of its runs)."""
        if not self.events:
            return None
        last, count = self.events[-1], len(self.events)
        if self._summarised is None or self._summarised[0] is not last or self._summarised[1] != count:
            self._summarised = (last, count, summarize(self.events))
        return self._summarised[2]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.events[-1].finish_reason is not None

    def to_json(self) -> dict:
        summary = self.summary
        return {"request": self.request.to_json(), "steps": [e.to_json() for e in self.steps],
                "summary": summary.to_json() if summary else None}


EXPORTS_ROOT = Path(tempfile.gettempdir()) / "eagle-playground-exports"
EXPORTS_KEEP_S = 600.0   # Gradio copies the files into its own cache at once; ours only need to outlive that


def _prune(root: Path, keep_s: float) -> None:
    """Remove export folders older than keep_s, so a long-running public app does not fill its disk."""
    cutoff = time.time() - keep_s
    for folder in root.glob("run-*"):
        try:
            if folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
        except FileNotFoundError:   # another request pruned it first
            pass


def export_folder(root: Path = EXPORTS_ROOT, keep_s: float = EXPORTS_KEEP_S) -> Path:
    """A fresh folder for one export under `root`; older export folders are removed."""
    root.mkdir(parents=True, exist_ok=True)
    _prune(root, keep_s)
    return Path(tempfile.mkdtemp(prefix="run-", dir=root))


def export(runs: Mapping[str, RunLog], figures: Sequence[go.Figure] = (), root: Path = EXPORTS_ROOT,
           keep_s: float = EXPORTS_KEEP_S) -> list[str]:
    """Write the runs as JSON and CSV (csv_rows), and `figures` as HTML under the prompt and settings,
    into a fresh folder under `root`, named after the runs and the time; older export folders are removed."""
    folder = export_folder(root, keep_s)
    stem = file_stem(runs, time.strftime("%Y%m%d-%H%M%S"))
    json_path, csv_path, html_path = (folder / f"{stem}.{ext}" for ext in ("json", "csv", "html"))
    json_path.write_text(json.dumps({name: run.to_json() for name, run in runs.items()}, indent=1))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        # by verify step: a backend whose stream merges steps (vLLM) has them re-split; the JSON keeps the stream
        writer.writerows(row for name, run in runs.items() for e in run.steps
                         for row in csv_rows(name, e))
    paths = [json_path, csv_path]
    if figures:
        plots.figures_file(figures, {name: run.request for name, run in runs.items()}, html_path)
        paths.append(html_path)
    return [str(path) for path in paths]


def file_stem(runs: Mapping[str, RunLog], stamp: str) -> str:
    """The runs' names made safe for a file name and joined, then the time: eagle3_vs_none-20261124-110512."""
    names = [re.sub(r"[^A-Za-z0-9.]+", "_", name)[:NAME_CHARS].strip("._") or "run" for name in runs]
    return "_vs_".join(names) + f"-{stamp}"


def csv_rows(run: str, event: StepEvent) -> list[dict]:
    """A verify step's CSV rows: one per draft depth, with its verdict (StepEvent.draft_verdicts), or
    a single row with the depth cells empty where nothing was drafted (the prefill, no speculation)."""
    step = {"run": run, "step": event.step, "position": event.position, "accepted": event.accepted,
            "drafted": event.drafted, "committed_text": event.text, "draft_ms": event.draft_ms,
            "verify_ms": event.verify_ms, "elapsed_s": event.elapsed_s, "finish_reason": event.finish_reason,
            "backend": event.backend}
    by_depth = {"draft_id": event.draft_ids, "draft_text": event.draft_texts, "draft_prob": event.draft_probs,
                **{q.name: event.by_depth(q) for q in DEPTH_QUANTITIES}}
    depths = [{"depth": d + 1, "verdict": verdict, **{k: v[d] for k, v in by_depth.items() if d < len(v)}}
              for d, verdict in enumerate(event.draft_verdicts)]
    return [step | depth for depth in depths] or [step]


TEXT_EVERY_S, PLOTS_EVERY_S = 0.08, 0.5   # one streaming column's updates of its text and of its plots


class Pacer:
    """Decides when the page gets an update: text often, plots less often, the end always.

    A streamed update costs a render and a websocket message; pacing keeps the page fluid
    however fast the engine is, and the final state is always sent."""

    def __init__(self, text_every_s: float = TEXT_EVERY_S, plots_every_s: float = PLOTS_EVERY_S):
        self.every = {"text": text_every_s, "plots": plots_every_s}
        self.last = {"text": float("-inf"), "plots": float("-inf")}

    def due(self, kind: str) -> bool:
        """Whether an update of `kind` ("text" or "plots") may be sent now; if so, it counts as sent."""
        now = time.perf_counter()
        if now - self.last[kind] >= self.every[kind]:
            self.last[kind] = now
            return True
        return False


class LivePlots:
    """A run's plots: rebuilt when due, otherwise the last ones sent again, serialized once.

    Sending them again instead of gr.skip() is deliberate: Gradio turns every skip or prop
    update into a new component instance that it keeps in the session's config for the
    session's life, so skipping on every streamed step grows the server's memory run after run.
    They are kept as Gradio's PlotData, the figure's JSON, which gr.Plot sends as it is: kept as
    figures, each text update serialized all three again (15-20 ms each), beside the engine, on
    the same two cores."""

    def __init__(self, count: int = 3):
        self.figures: tuple = (None,) * count   # the latest built, which the exports write
        self.last: tuple = (None,) * count      # the same, as sent

    def get(self, build: Callable[[], tuple], due: bool) -> tuple:
        """The plots to send: built again when `due`, else the last ones."""
        if due:
            self.figures = tuple(build())
            self.last = tuple(map(serialized, self.figures))
        return self.last


def serialized(figure: go.Figure | None) -> PlotData | None:
    """A plotly figure as gr.Plot sends it."""
    return None if figure is None else PlotData(type="plotly", plot=figure.to_json())
