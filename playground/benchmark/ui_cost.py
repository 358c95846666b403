"""`python -m playground bench ui`: server-side milliseconds of one page update, by run length."""

from __future__ import annotations

import time

from playground.engines.reference import ReferenceEngine
from playground.request import GenerationRequest
from playground.stats import summarize


def ui_update_cost(steps: tuple[int, ...] = (16, 64, 256), repeats: int = 20) -> list[tuple[int, float, float]]:
    """(steps, text update = answer HTML + figure cards, plot update = three plotly figures as JSON)."""
    from playground.ui import figures, render

    engine = ReferenceEngine.load()
    request = GenerationRequest(prompt="Tell me a long story about a lighthouse keeper.", max_tokens=max(steps) + 1,
                                k=5)
    events = list(engine.generate(request))
    rows = []
    for n in steps:
        part = events[:n + 1]
        t0 = time.perf_counter()
        for _ in range(repeats):
            render.answer_html(part), render.figures_html(summarize(part))
        t1 = time.perf_counter()
        for _ in range(repeats):
            [fig.to_json() for fig in figures.all_figures({"eagle3.1": summarize(part)})]
        t2 = time.perf_counter()
        rows.append((len(part) - 1, (t1 - t0) / repeats * 1e3, (t2 - t1) / repeats * 1e3))
    return rows
