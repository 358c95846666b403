"""Server-side milliseconds of one page update, by run length:

    python -m playground.ui.update_cost      # also `python -m playground bench ui`, which runs this
"""

from __future__ import annotations

import time

from playground import plots
from playground.engines.events import collect
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.model.variants import EAGLE31
from playground.ui import render


def ui_update_cost(steps: tuple[int, ...] = (16, 64, 256), repeats: int = 20) -> list[tuple[int, float, float]]:
    """(steps, text update = answer HTML + figure cards, plot update = three plotly figures as JSON)."""
    engine = ReferenceEngine.load()
    request = GenerationRequest(prompt="Tell me a long story about a lighthouse keeper.", max_tokens=max(steps) + 1,
                                k=5)
    events = collect(engine.generate(request))
    rows = []
    for n in steps:
        part = events[:n + 1]
        t0 = time.perf_counter()
        for _ in range(repeats):
            render.answer_html(part), render.figures_html(summarize(part))
        t1 = time.perf_counter()
        for _ in range(repeats):
            [fig.to_json() for fig in plots.all_figures({EAGLE31: summarize(part)})]
        t2 = time.perf_counter()
        rows.append((len(part) - 1, (t1 - t0) / repeats * 1e3, (t2 - t1) / repeats * 1e3))
    return rows


def main() -> None:
    print("| verify steps | text update (ms) | plot update (ms) |\n|---:|---:|---:|")
    for steps, text_ms, plot_ms in ui_update_cost():
        print(f"| {steps} | {text_ms:.2f} | {plot_ms:.2f} |")


if __name__ == "__main__":
    main()
