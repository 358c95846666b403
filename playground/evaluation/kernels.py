"""`python -m playground bench kernels`: the embedded engine on our CPU kernels against PyTorch's,
and against llama.cpp where scripts/build-llama-cpp.sh has built it.

Two engines in one process, one built on playground/model/kernels (the default where they run),
one on PyTorch's own (oneDNN's linear, the op-by-op stack), and llama.cpp's server on the same
float32 weights, run interleaved on the same prompts (chat and code, greedy): decode tokens/s and
tau of each method, whether every run emitted the same tokens, and the target's forward for 1 and
k + 1 tokens against the roofline floor.

    python -m playground bench kernels --drafters none eagle3 eagle3.1 --k 5 --max-tokens 128
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.evaluation import ceiling, llama_cpp
from playground.evaluation.tables import markdown_table
from playground.model import kernels
from playground.model.variants import EAGLE3, NONE
from playground.prompts.sets import CHAT, CODING

SYSTEMS = ("ours", "pytorch", "llama.cpp")


@dataclass(frozen=True)
class Row:
    system: str          # our kernels, PyTorch's, or llama.cpp
    drafter: str
    tokens_per_s: float  # decode (after the first token), mean over the runs
    tau: float           # mean over the runs
    draft_ms: float | None   # per verify step, mean over the runs (our engines)
    verify_ms: float | None


@dataclass(frozen=True)
class Result:
    rows: list[Row]
    same_tokens: bool                # both engines, every method, every run
    llama_same: tuple[int, int]      # llama.cpp runs whose tokens equal ours, of all its runs
    forward_ms: dict[str, dict[int, float]]  # engine -> tokens in the forward -> median ms
    roof: ceiling.Ceiling


def _engines(drafters: list[str]) -> dict[str, ReferenceEngine]:
    """Both engines with their drafters loaded."""
    if not kernels.status().loaded:
        raise SystemExit(f"bench kernels: our kernels do not run here: {kernels.status().note}")
    ours, pytorch = ReferenceEngine.load(kernels=True), ReferenceEngine.load(kernels=False)
    for drafter in drafters:
        ours.drafters.get(drafter)
        pytorch.drafters.get(drafter)
    assert ours.target.stack_weights is not None and pytorch.target.stack_weights is None
    return {"ours": ours, "pytorch": pytorch}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def run(drafters: list[str], k: int, max_tokens: int, prompts_per_kind: int = 2, rounds: int = 2) -> Result:
    engines = _engines(drafters)
    peers = [d for d in (NONE, EAGLE3) if d in drafters] if llama_cpp.available() else []
    prompts = CHAT[:prompts_per_kind] + CODING[:prompts_per_kind]
    runs: dict[tuple[str, str], list] = {}
    llama_same = [0, 0]
    with contextlib.ExitStack() as stack:
        servers = {}
        for drafter in peers:
            servers[drafter] = llama_cpp.LlamaServer(None if drafter == NONE else k)
            stack.callback(servers[drafter].close)
        for _ in range(rounds):
            for prompt in prompts:
                for drafter in drafters:
                    request = GenerationRequest(prompt=prompt, drafter=drafter, k=k, max_tokens=max_tokens)
                    for name, engine in engines.items():
                        summary = summarize(list(engine.generate(request)))
                        runs.setdefault((name, drafter), []).append(summary)
                    if drafter in servers:
                        peer = servers[drafter].complete(engines["ours"].prompt_ids(request), max_tokens)
                        runs.setdefault(("llama.cpp", drafter), []).append(peer)
                        llama_same[0] += peer.token_ids[:len(summary.token_ids)] == summary.token_ids
                        llama_same[1] += 1
    ours_tokens = {tuple(s.token_ids for s in runs[(name, d)]) for name in engines for d in drafters}
    rows = [Row(name, drafter, _mean(s.decode_tokens_per_s for s in summaries),
                _mean(s.mean_acceptance_length for s in summaries),
                *((_mean(s.draft_ms_per_step for s in summaries), _mean(s.verify_ms_per_step for s in summaries))
                  if name in engines else (None, None)))
            for (name, drafter), summaries in runs.items()]
    forwards = {name: ceiling.measure(engine.target, (1, k + 1)) for name, engine in engines.items()}
    return Result(rows, len(ours_tokens) == 1, tuple(llama_same), {n: c.measured_ms for n, c in forwards.items()},
                  forwards["ours"])


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(result: Result) -> str:
    rows = sorted(result.rows, key=lambda r: (SYSTEMS.index(r.system), r.drafter))
    plain = {row.system: row.tokens_per_s for row in rows if row.drafter == NONE}
    pytorch = {row.drafter: row.tokens_per_s for row in rows if row.system == "pytorch"}
    llama = {row.drafter: row.tokens_per_s for row in rows if row.system == "llama.cpp"}
    ratio = lambda value, base: f"{value / base:.2f}x" if base else "-"
    head = ["system", "method", "decode tok/s", "tau", "draft ms/step", "verify ms/step", "vs none, same system",
            "vs PyTorch's kernels", "vs llama.cpp none", "vs llama.cpp eagle3"]
    lines = [markdown_table(head, ([row.system, row.drafter, f"{row.tokens_per_s:.1f}", f"{row.tau:.2f}",
                                    _ms(row.draft_ms), _ms(row.verify_ms), ratio(row.tokens_per_s, plain.get(row.system)),
                                    ratio(row.tokens_per_s, pytorch.get(row.drafter)),
                                    ratio(row.tokens_per_s, llama.get(NONE)), ratio(row.tokens_per_s, llama.get(EAGLE3))]
                                   for row in rows))]
    roof = result.roof
    forward = [[f"{name} kernels, ms", *(f"{measured[t]:.1f}" for t in roof.floor_ms)]
               for name, measured in result.forward_ms.items()]
    forward.append([f"roofline floor, ms ({roof.bandwidth_gb_s:.1f} GB/s, {roof.matmul_gflop_s:.0f} GFLOP/s)",
                    *(f"{roof.floor_ms[t]:.1f}" for t in roof.floor_ms)])
    lines += ["", markdown_table(["target forward", *(f"{t} token{'s' * (t > 1)}" for t in roof.floor_ms)], forward)]
    lines += ["", f"our engines emitted the same tokens in every run: {'yes' if result.same_tokens else 'NO'}"]
    if result.llama_same[1]:
        lines.append(f"llama.cpp's tokens equal ours in {result.llama_same[0]} of {result.llama_same[1]} runs")
    else:
        lines.append("llama.cpp: not built here (bash scripts/build-llama-cpp.sh)")
    return "\n".join(lines)
