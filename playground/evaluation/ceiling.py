"""How fast this machine could run the target at best: a roofline from measured bandwidth and FLOP/s.

One decode forward must read every weight once (memory-bound) and do about 2 FLOPs per weight
per token (compute-bound); its floor is the larger of the two times. Speculative decoding at
mean acceptance length tau can reach at most tau tokens per verify forward of k+1 tokens.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from playground.evaluation.timing import timings

if TYPE_CHECKING:
    from playground.model.target import Target


def _best_seconds(fn, repeats: int = 7) -> float:
    return min(timings(fn, repeats))


def memory_bandwidth(megabytes: int = 512) -> float:
    """Bytes/s reading a buffer far larger than the caches (a reduction: one read per element)."""
    x = torch.ones(megabytes * 2**20 // 4)
    return x.numel() * 4 / _best_seconds(lambda: x.sum())


def matmul_flops(n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best_seconds(lambda: a @ b)


@dataclass(frozen=True)
class Ceiling:
    weight_bytes: int
    bandwidth_gb_s: float
    matmul_gflop_s: float
    floor_ms: dict[int, float]        # tokens in the forward -> roofline floor
    measured_ms: dict[int, float]     # tokens in the forward -> our forward pass, median

    @property
    def tokens_per_s(self) -> float:
        """Plain decoding's ceiling: one token per floor-time forward."""
        return 1e3 / self.floor_ms[1]

    def to_json(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_json(cls, row: dict) -> Ceiling:
        """Read back (JSON writes the token counts as strings)."""
        by_tokens = lambda times: {int(tokens): ms for tokens, ms in times.items()}
        return cls(row["weight_bytes"], row["bandwidth_gb_s"], row["matmul_gflop_s"], by_tokens(row["floor_ms"]),
                   by_tokens(row["measured_ms"]))


def measure(target: Target, token_counts: tuple[int, ...] = (1, 6), context: int = 128) -> Ceiling:
    weight_bytes = target.weight_bytes()
    flops_per_token = 2 * target.multiply_adds()
    bandwidth, flops = memory_bandwidth(), matmul_flops()
    floor = {t: 1e3 * max(weight_bytes / bandwidth, t * flops_per_token / flops) for t in token_counts}
    measured = {}
    cache = target.new_cache(context + max(token_counts))
    target.forward(torch.arange(context)[None] + 100, cache)
    for t in token_counts:
        ids = torch.arange(t)[None] + 200
        runs = timings(lambda: target.forward(ids, cache), 12, setup=lambda: cache.truncate(context), warmup=3)
        measured[t] = statistics.median(runs) * 1e3
    return Ceiling(weight_bytes, bandwidth / 1e9, flops / 1e9, floor, measured)
