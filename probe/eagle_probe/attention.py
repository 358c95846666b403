"""The drafter's attention of a recorded request, recomputed from the probe's own copy of its keys.

vLLM's attention backends return outputs, not weights, and each lays out its paged cache its own
way (the CPU backend packs keys per instruction set). So the probe reads no cache: while a recorded
request runs, it keeps the keys and values the drafter's attention layer is handed for that request,
by position, as they are written. The attention mass of a query is then softmax(q . K * scale) over
the keys at positions 0..p of its own sequence, exactly what a causal decoder attends to.

That this copy is what the backend attended over is checked on every query it measures: the copy's
attention output, probs @ V, must equal the output the backend wrote for that query row. Where it
does not (a prefix-cache hit left keys the probe never saw, a sliding window, a quantised cache, an
unknown backend), the record says attention is unavailable and why, never a wrong number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SINK_TOKENS = 4
# largest |copy output - backend output| / max(1, |backend output|) that counts as equal
OUTPUT_TOLERANCE = {torch.float32: 1e-3}
HALF_TOLERANCE = 3e-2   # 16-bit activations


@dataclass
class Masses:
    """One query's attention, per query head: on the sink keys, on this round's drafts, on the rest."""
    sink: list[float]
    drafts: list[float]
    rest: list[float]


class Unavailable(Exception):
    """Attention cannot be measured truthfully for this query; the message says why."""


class KeyCopy:
    """One request's drafter keys and values by position, as the attention layer was handed them."""

    def __init__(self, like: torch.Tensor, value_dim: int):
        self.keys = like.new_zeros((0, *like.shape[1:]))
        self.values = like.new_zeros((0, like.shape[1], value_dim))
        self.written = torch.zeros(0, dtype=torch.bool, device=like.device)

    def write(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = int(positions.max()) + 1
        if end > self.keys.shape[0]:
            self._grow(max(end, 2 * self.keys.shape[0]))
        self.keys[positions] = keys
        self.values[positions] = values
        self.written[positions] = True

    def masses(self, query: torch.Tensor, position: int, round_start: int, scale: float,
               backend_output: torch.Tensor) -> Masses:
        """The attention of `query` [heads, head_dim] at `position` over positions 0..position; this
        round's drafts sit at positions round_start..position. Raises Unavailable unless the copy
        reproduces `backend_output` [heads, value_dim], the backend's output for that query."""
        length = position + 1
        if length > self.written.shape[0] or not bool(self.written[:length].all()):
            missing = int((~self.written[:length]).nonzero()[0]) if length <= self.written.shape[0] else length - 1
            raise Unavailable(f"the drafter's key at position {missing} was not computed in this request "
                              f"(a prefix-cache hit? send recorded requests with a unique cache_salt)")
        keys, values = self.keys[:length].float(), self.values[:length].float()   # [L, kv, d]
        heads, kv_heads = query.shape[0], keys.shape[1]
        group = heads // kv_heads                       # query head h reads kv head h // group
        q = query.float().reshape(kv_heads, group, -1)
        probs = (torch.einsum("kgd,lkd->kgl", q, keys) * scale).softmax(-1)   # [kv, group, L]
        output = torch.einsum("kgl,lkd->kgd", probs, values).reshape(heads, -1)
        expected = backend_output.float()
        error = float((output - expected).abs().max()) / max(1.0, float(expected.abs().max()))
        if error > OUTPUT_TOLERANCE.get(backend_output.dtype, HALF_TOLERANCE):
            raise Unavailable(f"the probe's copy of the keys does not reproduce the backend's attention output "
                              f"(relative difference {error:.1e}): this backend attends differently")
        probs = probs.reshape(heads, length)
        sinks = min(SINK_TOKENS, round_start)
        return Masses(sink=probs[:, :SINK_TOKENS].sum(-1).tolist(), drafts=probs[:, round_start:].sum(-1).tolist(),
                      rest=probs[:, sinks:round_start].sum(-1).tolist())

    def _grow(self, capacity: int) -> None:
        for name in ("keys", "values", "written"):
            old = getattr(self, name)
            new = old.new_zeros((capacity, *old.shape[1:]))
            new[:old.shape[0]] = old
            setattr(self, name, new)


MEAN_FIELDS = ("sink_attention", "self_attention", "rest_attention")


def across_ranks(answers: list[dict | None]) -> dict | None:
    """One fetch answer from every tensor-parallel rank's. The ranks record the same steps; only their
    attention differs, each measuring its own query heads. Ranks hold equally many heads, so the mean
    over all heads is the mean of the ranks' means."""
    first = answers[0]
    if first is None or len(answers) == 1:
        return first
    for i, record in enumerate(first.get("records") or []):
        ranks = [answer["records"][i] for answer in answers]
        errors = [r["attention_error"] for r in ranks if "attention_error" in r]
        if errors:
            for field in (*MEAN_FIELDS, "attention_by_head"):
                record.pop(field, None)
            record["attention_error"] = errors[0]
            continue
        for field in MEAN_FIELDS:
            if field in record:
                record[field] = [sum(values) / len(values) for values in zip(*(r[field] for r in ranks))]
        if "attention_by_head" in record:
            record["attention_by_head"] = [[head for depth in by_depth for head in depth]
                                           for by_depth in zip(*(r["attention_by_head"] for r in ranks))]
    return first
