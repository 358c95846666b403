"""A run as the page sees it: the events so far, their summary, exports, and update pacing."""

from __future__ import annotations

import csv
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from playground.engines.events import StepEvent
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunSummary, summarize

CSV_FIELDS = ("step", "position", "text", "token_ids", "drafted", "accepted", "draft_texts", "draft_probs",
              "sink_attention", "self_attention", "hidden_norm", "draft_ms", "verify_ms", "elapsed_s",
              "finish_reason", "backend")


@dataclass
class RunLog:
    request: GenerationRequest
    events: list[StepEvent] = field(default_factory=list)

    @property
    def summary(self) -> RunSummary | None:
        return summarize(self.events) if self.events else None

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.events[-1].finish_reason is not None

    def to_json(self) -> dict:
        summary = self.summary
        return {"request": asdict(self.request), "steps": [e.to_json() for e in self.events],
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


def export(runs: dict[str, RunLog], figures_writer=None, root: Path = EXPORTS_ROOT,
           keep_s: float = EXPORTS_KEEP_S) -> list[str]:
    """Write the runs as JSON and CSV (one row per verify step), and the plots as HTML, into a fresh
    folder under `root`; older export folders are removed."""
    root.mkdir(parents=True, exist_ok=True)
    _prune(root, keep_s)
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = folder / f"run-{stamp}.json"
    json_path.write_text(json.dumps({name: run.to_json() for name, run in runs.items()}, indent=1))
    csv_path = folder / f"run-{stamp}.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("drafter",) + CSV_FIELDS)
        for name, run in runs.items():
            for e in run.events:
                row = e.to_json()
                writer.writerow([name] + [_cell(row[k]) for k in CSV_FIELDS])
    paths = [str(json_path), str(csv_path)]
    if figures_writer is not None:
        html_path = folder / f"plots-{stamp}.html"
        figures_writer(html_path)
        paths.append(str(html_path))
    return paths


def _cell(value) -> str | int | float:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, tuple)) else value


class Pacer:
    """Decides when the page gets an update: text often, plots less often, the end always.

    A streamed update costs a render and a websocket message; pacing keeps the page fluid
    however fast the engine is, and the final state is always sent."""

    def __init__(self, text_every_s: float = 0.08, plots_every_s: float = 0.5):
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
    """A run's plots: rebuilt when due, otherwise the last ones sent again.

    Sending them again instead of gr.skip() is deliberate: Gradio turns every skip or prop
    update into a new component instance that it keeps in the session's config for the
    session's life, so skipping on every streamed step grows the server's memory run after run."""

    def __init__(self):
        self.last: tuple = (None, None, None)

    def get(self, build: Callable[[], tuple], due: bool) -> tuple:
        if due:
            self.last = tuple(build())
        return self.last
