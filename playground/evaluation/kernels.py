"""`python -m playground bench kernels`: the embedded engine on our CPU kernels against PyTorch's,
and against llama.cpp where scripts/build-llama-cpp.sh has built it.

Three engines in one process: two on playground/model/kernels, reading the target's float32
matrices (f32) or the GGUF file's own Q4_1 / Q8_0 blocks (gguf), one on PyTorch's own kernels
(oneDNN's linear, the op-by-op stack); and llama.cpp's server on the float32 weights and on the
GGUF file the target comes from. All run interleaved on the same prompts (chat and code, greedy):
decode tokens/s and tau of each method, whether every run of ours emitted the same tokens, and the
target's forward for 1 and k + 1 tokens against each weight format's roofline floor.

    python -m playground bench kernels --drafters none eagle3 eagle3.1 --k 5 --max-tokens 128
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from playground.engines.events import collect
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.evaluation import ceiling, llama_cpp
from playground.evaluation.tables import markdown_table
from playground.model import kernels
from playground.model.variants import EAGLE3, NONE
from playground.prompts.sets import CHAT, CODING

OURS = {"ours f32": "f32", "ours gguf": "gguf"}           # our kernels on each weight format
LLAMA = {"llama.cpp f32": "f32", "llama.cpp Q4_1": "gguf"}  # llama.cpp on the same two files
SYSTEMS = (*OURS, "pytorch", *LLAMA)


@dataclass(frozen=True)
class Row:
    system: str          # one of SYSTEMS
    drafter: str
    tokens_per_s: float  # decode (after the first token), mean over the runs
    tau: float           # mean over the runs
    draft_ms: float | None   # per verify step, mean over the runs (our engines)
    verify_ms: float | None


@dataclass(frozen=True)
class Result:
    rows: list[Row]
    same_tokens: bool                # our engines, every method, every run
    llama_same: dict[str, tuple[int, int]]   # llama.cpp system -> runs whose tokens equal ours, all its runs
    forward_ms: dict[str, dict[int, float]]  # engine -> tokens in the forward -> median ms
    roofs: dict[str, ceiling.Ceiling]        # our kernels' engines: the floor of their weights' bytes


def _engines(drafters: list[str]) -> dict[str, ReferenceEngine]:
    """Our three engines with their drafters loaded."""
    if not kernels.status().loaded:
        raise SystemExit(f"bench kernels: our kernels do not run here: {kernels.status().note}")
    engines = {name: ReferenceEngine.load(kernels=True, weights=weights) for name, weights in OURS.items()}
    engines["pytorch"] = ReferenceEngine.load(kernels=False, weights="f32")
    for engine in engines.values():
        for drafter in drafters:
            engine.drafters.get(drafter)
    assert all(engines[name].target.stack_weights is not None for name in OURS)
    assert engines["pytorch"].target.stack_weights is None
    return engines


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def run(drafters: list[str], k: int, max_tokens: int, prompts_per_kind: int = 2, rounds: int = 2) -> Result:
    engines = _engines(drafters)
    peers = [d for d in (NONE, EAGLE3) if d in drafters] if llama_cpp.available() else []
    prompts = CHAT[:prompts_per_kind] + CODING[:prompts_per_kind]
    runs: dict[tuple[str, str], list] = {}
    llama_same = {system: [0, 0] for system in LLAMA} if peers else {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for system, weights in LLAMA.items():
            for drafter in peers:
                servers[system, drafter] = llama_cpp.LlamaServer(None if drafter == NONE else k, weights)
                stack.callback(servers[system, drafter].close)
        for _ in range(rounds):
            for prompt in prompts:
                for drafter in drafters:
                    request = GenerationRequest(prompt=prompt, drafter=drafter, k=k, max_tokens=max_tokens)
                    for name, engine in engines.items():
                        summary = summarize(collect(engine.generate(request)))
                        runs.setdefault((name, drafter), []).append(summary)
                    for system in LLAMA:
                        if (system, drafter) in servers:
                            peer = servers[system, drafter].complete(engines["ours f32"].prompt_ids(request), max_tokens)
                            runs.setdefault((system, drafter), []).append(peer)
                            llama_same[system][0] += peer.token_ids[:len(summary.token_ids)] == summary.token_ids
                            llama_same[system][1] += 1
    ours_tokens = {tuple(s.token_ids for s in runs[(name, d)]) for name in engines for d in drafters}
    rows = [Row(name, drafter, _mean(s.decode_tokens_per_s for s in summaries),
                _mean(s.mean_acceptance_length for s in summaries),
                *((_mean(s.draft_ms_per_step for s in summaries), _mean(s.verify_ms_per_step for s in summaries))
                  if name in engines else (None, None)))
            for (name, drafter), summaries in runs.items()]
    forwards = {name: ceiling.measure(engine.target, (1, k + 1)) for name, engine in engines.items()}
    return Result(rows, len(ours_tokens) == 1, {system: tuple(n) for system, n in llama_same.items()},
                  {n: c.measured_ms for n, c in forwards.items()}, {n: forwards[n] for n in OURS})


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(result: Result) -> str:
    rows = sorted(result.rows, key=lambda r: (SYSTEMS.index(r.system), r.drafter))
    plain = {row.system: row.tokens_per_s for row in rows if row.drafter == NONE}
    pytorch = {row.drafter: row.tokens_per_s for row in rows if row.system == "pytorch"}
    ratio = lambda value, base: f"{value / base:.2f}x" if base else "-"
    head = ["system", "method", "decode tok/s", "tau", "draft ms/step", "verify ms/step", "vs none, same system",
            "vs PyTorch's kernels", *(f"vs {system} none" for system in LLAMA)]
    lines = [markdown_table(head, ([row.system, row.drafter, f"{row.tokens_per_s:.1f}", f"{row.tau:.2f}",
                                    _ms(row.draft_ms), _ms(row.verify_ms), ratio(row.tokens_per_s, plain.get(row.system)),
                                    ratio(row.tokens_per_s, pytorch.get(row.drafter)),
                                    *(ratio(row.tokens_per_s, plain.get(system)) for system in LLAMA)]
                                   for row in rows))]
    tokens = next(iter(result.roofs.values())).floor_ms
    forward = [[f"{name}, ms", *(f"{measured[t]:.1f}" for t in tokens)] for name, measured in result.forward_ms.items()]
    for name, roof in result.roofs.items():
        forward.append([f"roofline floor of {name}'s {roof.weight_bytes / 2**20:.0f} MiB, ms "
                        f"({roof.bandwidth_gb_s:.1f} GB/s, {roof.matmul_gflop_s:.0f} GFLOP/s)",
                        *(f"{roof.floor_ms[t]:.1f}" for t in tokens)])
    lines += ["", markdown_table(["target forward", *(f"{t} token{'s' * (t > 1)}" for t in tokens)], forward)]
    lines += ["", f"our engines emitted the same tokens in every run: {'yes' if result.same_tokens else 'NO'}"]
    for system, (same, total) in result.llama_same.items():
        lines.append(f"{system}'s tokens equal ours in {same} of {total} runs")
    if not result.llama_same:
        lines.append("llama.cpp: not built here (bash scripts/build-llama-cpp.sh)")
    return "\n".join(lines)
