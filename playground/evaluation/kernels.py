"""`python -m playground bench kernels`: the embedded engine on our CPU kernels against PyTorch's.

Two engines in one process, one built on playground/model/kernels (the default where they run),
one on PyTorch's own (oneDNN's linear, the op-by-op stack), run interleaved on the same prompts
(chat and code, greedy): decode tokens/s and tau of each method, whether every run emitted the
same tokens, and the target's forward for 1 and k + 1 tokens against the roofline floor.

    python -m playground bench kernels --drafters none eagle3 eagle3.1 --k 5 --max-tokens 128
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.evaluation import ceiling
from playground.evaluation.prompt_sets import CHAT, CODING
from playground.model import kernels

KERNELS = ("ours", "pytorch")


@dataclass(frozen=True)
class Row:
    kernels: str
    drafter: str
    tokens_per_s: float  # decode (after the first token), mean over prompts
    tau: float
    forward_ms: dict[int, float]


def _engines() -> dict[str, ReferenceEngine]:
    ours = ReferenceEngine.load()
    if not kernels.status().loaded:
        raise SystemExit(f"bench kernels: our kernels do not run here: {kernels.status().note}")
    with mock.patch.object(kernels, "status", lambda: kernels.KernelStatus(False, "PyTorch's kernels")):
        pytorch = ReferenceEngine.load()
    return {"ours": ours, "pytorch": pytorch}


def run(drafters: list[str], k: int, max_tokens: int, prompts_per_kind: int = 2, rounds: int = 2
        ) -> tuple[list[Row], bool, ceiling.Ceiling]:
    """Rows by kernels and drafter, whether every run emitted the same tokens, the roofline."""
    engines = _engines()
    prompts = CHAT[:prompts_per_kind] + CODING[:prompts_per_kind]
    runs: dict[tuple[str, str], list] = {}
    for _ in range(rounds):
        for prompt in prompts:
            for drafter in drafters:
                for name, engine in engines.items():
                    request = GenerationRequest(prompt=prompt, drafter=drafter, k=k, max_tokens=max_tokens)
                    runs.setdefault((name, drafter), []).append(summarize(list(engine.generate(request))))
    tokens = {tuple(s.token_ids for s in summaries) for summaries in runs.values()}
    forwards = {name: ceiling.measure(engine.target, (1, k + 1)) for name, engine in engines.items()}
    rows = [Row(name, drafter, sum(s.decode_tokens_per_s for s in summaries) / len(summaries),
                sum(s.mean_acceptance_length for s in summaries) / len(summaries), forwards[name].measured_ms)
            for (name, drafter), summaries in runs.items()]
    return rows, len(tokens) == 1, forwards["ours"]


def table(rows: list[Row], same_tokens: bool, roof: ceiling.Ceiling) -> str:
    plain = {row.kernels: row.tokens_per_s for row in rows if row.drafter == "none"}
    lines = ["| kernels | method | decode tok/s | tau | vs none, same kernels | vs PyTorch's kernels |",
             "|---|---|---:|---:|---:|---:|"]
    theirs = {row.drafter: row.tokens_per_s for row in rows if row.kernels == "pytorch"}
    for row in sorted(rows, key=lambda r: (KERNELS.index(r.kernels), r.drafter)):
        vs_none = f"{row.tokens_per_s / plain[row.kernels]:.2f}x" if row.kernels in plain else "-"
        lines.append(f"| {row.kernels} | {row.drafter} | {row.tokens_per_s:.1f} | {row.tau:.2f} | {vs_none} | "
                     f"{row.tokens_per_s / theirs[row.drafter]:.2f}x |")
    forwards = {row.kernels: row.forward_ms for row in rows}
    lines += ["", "| target forward | " + " | ".join(f"{t} token{'s' * (t > 1)}" for t in roof.floor_ms) + " |",
              "|---|" + "---:|" * len(roof.floor_ms)]
    for name in KERNELS:
        lines.append(f"| {name} kernels, ms | " + " | ".join(f"{forwards[name][t]:.1f}" for t in roof.floor_ms) + " |")
    lines.append(f"| roofline floor, ms ({roof.bandwidth_gb_s:.1f} GB/s, {roof.matmul_gflop_s:.0f} GFLOP/s) | "
                 + " | ".join(f"{roof.floor_ms[t]:.1f}" for t in roof.floor_ms) + " |")
    lines += ["", f"every run emitted the same tokens: {'yes' if same_tokens else 'NO'}"]
    return "\n".join(lines)
