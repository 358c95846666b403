"""What the Playground shows before a visitor runs anything: a stored run of its prefilled example by
EAGLE 3.1 with EAGLE 3 beside it, drawn by the same code as a live run and labelled as stored.

    python -m playground.ui.first_screen      # records it again: the real app on this machine, Run pressed

It is recorded the way a visitor's Run makes it: the app in its own process, /run at a fresh page's
settings, EAGLE 3 running beside EAGLE 3.1 step by step and the page drawn as they stream, so its
speeds are the ones a visitor on this kind of host sees (tests/test_explainer.py holds them to the
stored benchmark's row for the category).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from playground.engines.events import StepEvent
from playground.engines.request import GenerationRequest
from playground.model.variants import EAGLE3, EAGLE31
from playground.ui.controls import DEFAULT_MAX_TOKENS, DEFAULT_K, FIRST_PRESET
from playground.ui.presets import PRESETS
from playground.ui.runs import RunLog

STORED_RUN = Path(__file__).resolve().parents[2] / "assets" / "first_screen.json"
DRAFTERS = (EAGLE31, EAGLE3)   # the run the answer shows, then the one drawn beside it


def example_request(drafter: str) -> GenerationRequest:
    """The request a fresh page's Run makes with `drafter`: the prefilled example at the default settings."""
    preset = PRESETS[FIRST_PRESET]
    return GenerationRequest(prompt=preset.prompt, system=preset.system or None, template=preset.template,
                             drafter=drafter, k=DEFAULT_K, temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS)


def record(path: Path = STORED_RUN) -> dict:
    """Press Run on a fresh page of the real app (its own process, the reference engine) and write the
    runs its export holds, with the host."""
    from playground.app_process import AppServer, api_client
    from playground.engines.tree import TreeShape
    from playground.evaluation.machine import described, machine
    from playground.ui.endpoints import RUN_OUTPUTS

    request, server = example_request(EAGLE31), AppServer()
    try:
        out = api_client(server.url).predict(request.prompt, request.system or "", request.template, EAGLE31,
                                             request.k, 0.0, request.top_p, request.max_tokens, "reference", "chain",
                                             TreeShape.top_k, TreeShape.depth, TreeShape.nodes, request.seed, True, "",
                                             api_name="/run")
    finally:
        server.stop()
    exported = json.loads(Path(out[RUN_OUTPUTS.index("files")][0]).read_text())
    stored = {"host": described(machine()), "recorded": time.strftime("%Y-%m-%d"),
              "runs": {name: exported[name] for name in DRAFTERS}}
    path.write_text(json.dumps(stored))
    _stored.cache_clear()
    return stored


@functools.lru_cache(maxsize=2)
def _stored(path: Path) -> dict:
    """The stored file, read once per process (the Playground and the explainer both start from it);
    each `load` builds its own RunLogs from it, which the page then changes."""
    return json.loads(path.read_text())


def load(path: Path = STORED_RUN) -> tuple[dict[str, RunLog], str] | None:
    """The stored runs by drafter (the answer's first) and a line saying where they come from; None
    where none is stored or it no longer matches what a fresh page would run."""
    if not path.exists():
        return None
    stored = _stored(path)
    runs = {name: RunLog(GenerationRequest.from_json(run["request"]), [StepEvent.from_json(e) for e in run["steps"]])
            for name, run in stored["runs"].items()}
    if tuple(runs) != DRAFTERS or any(run.request != example_request(name) for name, run in runs.items()):
        return None
    return runs, f"recorded on {stored['host']}, {stored['recorded']}"


def main() -> None:
    stored = record()
    for name, run in stored["runs"].items():
        print(f"{name}: tau {run['summary']['mean_acceptance_length']:.2f}, {run['summary']['tokens']} tokens")
    print(f"wrote {STORED_RUN}")


if __name__ == "__main__":
    main()
