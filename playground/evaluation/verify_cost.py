"""Where a verify forward's time goes, by rows (1 to k + 1) and context, on this host's kernels.

A verify of k drafts is the target's forward over k + 1 rows. On a CPU that streams its weights,
the rows after the first should cost little: each weight is read once for all of them. This
measures the decoder stack whole (one `decoder_layers` call) and its parts alone, on the same rows
over the same cache: the projections (the 120 layer matrices), attention over the cache (30 layers),
what is left (norms, RoPE, SiLU, residuals, cache writes) and the greedy head (`verify_argmax` with
every draft accepted, so every row is scored). A part timed alone is 120 or 30 calls from Python,
which the stack's one call does not pay: the same number of calls on a tiny matrix or cache is timed
too and taken off. A part's floor is the larger of its bytes at the measured bandwidth and its
multiply-adds at the measured float32 matmul rate: past a few rows the projections are arithmetic,
not reading.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from playground.evaluation.ceiling import matmul_flops, memory_bandwidth
from playground.evaluation.tables import markdown_table
from playground.evaluation.timing import timings
from playground.model.kernels import ops
from playground.model.target import Target


@dataclass(frozen=True)
class Cell:
    """One forward of `rows` rows after `context` tokens, its parts timed alone (median ms)."""
    rows: int
    context: int
    stack_ms: float
    projections_ms: float
    attention_ms: float
    head_ms: float

    @property
    def rest_ms(self) -> float:
        return self.stack_ms - self.projections_ms - self.attention_ms

    @property
    def verify_ms(self) -> float:
        return self.stack_ms + self.head_ms


@dataclass(frozen=True)
class Breakdown:
    weights: str                 # the target's weight format
    bandwidth_gb_s: float
    matmul_gflop_s: float
    projection_bytes: int        # the layers' matrices
    projection_macs: int         # their multiply-adds for one row
    head_bytes: int
    head_macs: int
    cache_bytes_per_token: int   # keys and values of one position, every layer
    attention_macs_per_key: int  # one row's multiply-adds for one cached position (scores and values), every layer
    cells: list[Cell]

    def floor_ms(self, bytes_read: float, multiply_adds: float = 0) -> float:
        return max(bytes_read / self.bandwidth_gb_s, 2 * multiply_adds / self.matmul_gflop_s) / 1e6

    def cell(self, rows: int, context: int) -> Cell:
        return next(c for c in self.cells if c.rows == rows and c.context == context)


def _median_ms(fn, repeats: int) -> float:
    return statistics.median(timings(fn, repeats)) * 1e3


@torch.inference_mode()
def measure(target: Target, rows: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
            contexts: tuple[int, ...] = (128, 1024, 4096), repeats: int = 15) -> Breakdown:
    if target.stack_weights is None:
        raise SystemExit("the verify breakdown times our kernels' stack; they do not run this target here")
    projections = [x for layer in target.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    head = target.lm_head
    cache = target.new_cache(max(contexts) + max(rows))
    generator = torch.Generator().manual_seed(0)
    tiny_x, tiny_w = torch.randn(1, 64), torch.randn(8, 64)
    tiny_q, tiny_cache = torch.randn(1, target.num_heads, 1, target.head_dim), target.new_cache(8)
    projection_calls = _median_ms(lambda: [ops.rows_linear(tiny_x, tiny_w) for _ in projections], repeats)
    attention_calls = _median_ms(lambda: [ops.cache_attention(tiny_q, tiny_cache.keys[0], tiny_cache.values[0], start=0,
                                                              mask=None, causal=True)
                                          for _ in range(target.num_layers)], repeats)
    cells = []
    for context in sorted(contexts):
        cache.truncate(0)
        target.forward(torch.randint(100, 40_000, (1, context), generator=generator), cache, head=False)
        for r in rows:
            ids = torch.randint(100, 40_000, (1, r), generator=generator)

            def stack():
                cache.truncate(context)
                target.forward(ids, cache, head=False)

            inputs = [torch.randn(r, x.in_features, generator=generator) for x in projections]

            def projected():
                for x, rows_of_x in zip(projections, inputs):
                    ops.rows_linear(rows_of_x, x.weight)

            q = torch.randn(1, target.num_heads, r, target.head_dim, generator=generator)

            def attention():
                for layer in range(target.num_layers):
                    ops.cache_attention(q, cache.keys[layer], cache.values[layer], start=context, mask=None, causal=True)

            final = torch.randn(r, target.hidden_size, generator=generator)
            tokens = head(final).argmax(-1).tolist()[:-1]  # every draft the target's own: all rows scored

            def verify_head():
                ops.verify_argmax(final, head.weight, tokens, list(range(len(tokens))))

            cells.append(Cell(r, context, _median_ms(stack, repeats), _median_ms(projected, repeats) - projection_calls,
                              _median_ms(attention, repeats) - attention_calls, _median_ms(verify_head, repeats)))
    cache_bytes = 2 * target.num_layers * target.num_kv_heads * target.head_dim * cache.keys.element_size()
    attention_macs = 2 * target.num_layers * target.num_heads * target.head_dim
    return Breakdown(target.weights, memory_bandwidth() / 1e9, matmul_flops() / 1e9, sum(x.nbytes for x in projections),
                     sum(x.out_features * x.in_features for x in projections), head.nbytes,
                     head.out_features * head.in_features, cache_bytes, attention_macs, cells)


def _with_ratio(ms: float, one_row_ms: float) -> str:
    """ms and its ratio to one row's, where one row's is large enough for a ratio to mean something"""
    return f"{ms:.2f} ({ms / one_row_ms:.2f}x)" if one_row_ms >= 0.05 else f"{ms:.2f}"


def markdown(b: Breakdown) -> str:
    """One table per context: each part's ms by rows, its ratio to one row, and the projections' and
    attention's floors."""
    lines = [f"Weights {b.weights}; bandwidth {b.bandwidth_gb_s:.1f} GB/s (a read far past the caches), float32 matmul "
             f"{b.matmul_gflop_s:.0f} GFLOP/s; the head's one-row floor {b.floor_ms(b.head_bytes, b.head_macs):.2f} ms.",
             ""]
    rows = sorted({c.rows for c in b.cells})
    for context in sorted({c.context for c in b.cells}):
        one = b.cell(1, context) if 1 in rows else b.cell(rows[0], context)
        lines += [f"After {context} tokens of context:", ""]
        table = []
        for r in rows:
            c = b.cell(r, context)
            table.append([str(r)] + [_with_ratio(getattr(c, part), getattr(one, part))
                                     for part in ("verify_ms", "stack_ms", "projections_ms", "attention_ms", "head_ms")]
                         + [f"{c.rest_ms:.2f}", f"{b.floor_ms(b.projection_bytes, r * b.projection_macs):.2f}",
                            f"{b.floor_ms(b.cache_bytes_per_token * context, r * b.attention_macs_per_key * context):.2f}"])
        lines += [markdown_table(["rows", "verify ms (x 1 row)", "stack", "projections", "attention", "head", "rest",
                                  "projections' floor", "attention's floor"], table), ""]
    return "\n".join(lines)


def run(weights: str | None, contexts: tuple[int, ...], max_rows: int) -> str:
    return markdown(measure(Target.load(weights=weights), tuple(range(1, max_rows + 1)), contexts))
