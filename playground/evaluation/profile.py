"""`python -m playground bench profile`: where a verify step's time goes, from torch.profiler.

The reference engine labels each step's regions (draft, verify, event); the profile gives their
CPU time per step and the operators that dominate the whole run. A warm-up run comes first.

    python -m playground bench profile --drafters eagle3.1 --k 5 --max-tokens 128   # the last of --drafters
"""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile

from playground.engines.events import collect
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.evaluation.tables import markdown_table
from playground.prompts.sets import CODING

REGIONS = ("draft", "verify", "event")


def profile_run(engine: ReferenceEngine, request: GenerationRequest, top: int = 12) -> str:
    collect(engine.generate(request))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        events = collect(engine.generate(request))
    s = summarize(events)
    averages = {a.key: a for a in prof.key_averages()}
    wall_ms = s.elapsed_s * 1e3 - s.time_to_first_token_s * 1e3
    lines = [f"{request.drafter}, k={request.k}: {s.tokens} tokens in {s.steps} verify steps, tau "
             f"{s.mean_acceptance_length:.2f}, decode {wall_ms / max(1, s.steps):.1f} ms per step (profiled)", ""]
    ms = {region: averages[region].cpu_time_total / 1e3 if region in averages else 0.0 for region in REGIONS}
    lines.append(markdown_table(["region", "ms per step", "share of decode"],
                                ([r, f"{t / max(1, s.steps):.2f}", f"{t / wall_ms:.0%}"] for r, t in ms.items())))
    lines += ["", prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)]
    return "\n".join(lines)


def run(drafter: str, k: int, max_tokens: int, weights: str | None = None) -> str:
    """The profile of one coding prompt's run with `drafter` on the embedded engine."""
    request = GenerationRequest(prompt=CODING[0], drafter=drafter, k=k, max_tokens=max_tokens)
    return profile_run(ReferenceEngine.load(weights=weights), request)
