"""The drafter's attention of a recorded request, recomputed from the probe's own copy of its keys.

vLLM's attention backends return outputs, not weights, and each lays out its paged cache its own
way (the CPU backend packs keys per instruction set). So the probe reads no cache: while a recorded
request runs, it keeps the keys and values the drafter's attention layer is handed for that request,
by position, as they are written. The attention mass of a query is then softmax(q . K * scale) over
the keys at positions 0..p of its own sequence, exactly what a causal decoder attends to.

That this copy is what the backend attended over is checked on every query it measures: the copy's
attention output, probs @ V, must equal the output the backend wrote for that query row, to within
the rounding of the backend's dtype measured against the size of the values attended over (an output
is a weighted mean of those values, so an output computed over other keys, or for another query, is
off by a fraction of them). Where it is not (a prefix-cache hit left keys the probe never saw, a
sliding window, a quantised cache, an unknown backend), the record says attention is unavailable and
why, never a wrong number.

Copies are paid for from a byte budget (Budget) before any memory is taken, and every measurement
converts the copy to float32 a chunk at a time: the one temporary as long as the prefix is a round's
scores and probabilities, 4 bytes a position for each query head of each depth (for 32 heads and 7 depths
at 32k positions, about 30 MB each).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

SINK_TOKENS = 4
CHUNK = 4096   # positions converted to float32 at once while measuring
# largest |copy output - backend output| / max |value attended over| that counts as equal, by the
# backend output's dtype: a few units of its rounding (16-bit backends also round the probabilities)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2 * 2.0 ** -8, torch.float16: 2 * 2.0 ** -10}
OTHER_TOLERANCE = 2 * 2.0 ** -8


@dataclass
class Masses:
    """One query's attention, per query head: on the sink keys, on this round's drafts, on the rest."""
    sink: list[float]
    drafts: list[float]
    rest: list[float]


class Unavailable(Exception):
    """Attention cannot be measured truthfully for this query; the message says why."""


class Budget:
    """Bytes every key copy of one worker may hold together, and positions one copy may hold."""

    def __init__(self, max_bytes: int, max_positions: int):
        self.max_bytes, self.max_positions = max_bytes, max_positions
        self.used = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.max_bytes:
                return False
            self.used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


class KeyCopy:
    """One request's drafter keys and values by position, as the attention layer was handed them, head
    by head ([kv heads, positions, dim], so that measuring multiplies contiguous blocks), with the
    largest |value| of each position. Its memory comes from `budget`, asked before each allocation;
    `release()` gives it back."""

    def __init__(self, like_keys: torch.Tensor, value_dim: int, budget: Budget):
        self.budget = budget
        kv_heads = like_keys.shape[1]
        self.keys = like_keys.new_zeros((kv_heads, 0, like_keys.shape[2]))
        self.values = like_keys.new_zeros((kv_heads, 0, value_dim))
        self.written = torch.zeros(0, dtype=torch.bool, device=like_keys.device)
        self.largest = torch.zeros(0, dtype=torch.float32, device=like_keys.device)   # max |value| by position
        self.bytes = 0

    @property
    def capacity(self) -> int:
        return self.written.shape[0]

    def write(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """`keys` [n, kv heads, dim] and `values` at `positions`. Raises Unavailable, having allocated
        nothing, when the copy would pass the budget's limits."""
        end = int(positions.max()) + 1
        if end > self.budget.max_positions:
            raise Unavailable(f"the request passed the {self.budget.max_positions} positions the probe copies "
                              "keys for (EAGLE_PROBE_MAX_POSITIONS): attention is not measured past them")
        if end > self.capacity:
            self._grow(min(max(end, 2 * self.capacity), self.budget.max_positions), keys, values)
        self.keys[:, positions] = keys.transpose(0, 1)
        self.values[:, positions] = values.transpose(0, 1)
        self.written[positions] = True
        self.largest[positions] = values.float().abs().flatten(1).amax(1)

    def release(self) -> None:
        self.budget.give_back(self.bytes)
        self.bytes = 0
        self.keys = self.values = self.written = self.largest = None

    def masses(self, query: torch.Tensor, position: int, round_start: int, sinks: int, scale: float,
               backend_output: torch.Tensor) -> Masses:
        """The attention of `query` [heads, head_dim] at `position` over positions 0..position: on the
        first `sinks` positions, on this round's drafts (positions round_start..position) and on the
        rest. Raises Unavailable unless the copy reproduces `backend_output` [heads, value_dim], the
        backend's output for that query."""
        measured = self.masses_of_round(query[None], [position], round_start, sinks, scale, backend_output[None])[0]
        if isinstance(measured, str):
            raise Unavailable(measured)
        return measured

    def masses_of_round(self, queries: torch.Tensor, positions: list[int], round_start: int, sinks: int, scale: float,
                        backend_outputs: torch.Tensor) -> list[Masses | str]:
        """`masses` of the queries of one drafting round at once, one per depth ([depths, heads, head_dim]
        at `positions`), or why a depth has none; the copy is read once for all of them. A round writes
        each depth's key after the position the depth before attended to, so that the copy as it stands
        after the round holds what each depth attended over."""
        length = min(max(positions) + 1, self.capacity)   # positions past the copy were never written
        if not bool(self.written[:length].all()):
            length = int((~self.written[:length]).nonzero()[0])   # measured up to the first key never written
        if length == 0:
            return [_not_computed(0)] * len(positions)
        depths, heads = queries.shape[0], queries.shape[1]
        kv_heads = self.keys.shape[0]
        group = heads // kv_heads                       # query head h reads kv head h // group
        # [kv, depths * group, dim]: every depth's query heads that read one kv head, side by side, scaled
        q = (queries.float() * scale).reshape(depths, kv_heads, group, -1).transpose(0, 1).reshape(
            kv_heads, depths * group, -1)
        spans = [(s, min(s + CHUNK, length)) for s in range(0, length, CHUNK)]
        scores = [torch.bmm(q, self.keys[:, s:e].float().transpose(1, 2)) for s, e in spans]
        scores = scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1)
        # only the round's drafts lie past a query's position: the mask covers them alone
        ends = torch.tensor(positions, device=scores.device)
        first = min(round_start, length)
        later = torch.arange(first, length, device=scores.device)[None, :] > ends[:, None]   # [depths, tail]
        tail = scores.view(kv_heads, depths, group, length)[..., first:]
        tail.masked_fill_(later[None, :, None], -torch.inf)
        probs = scores.softmax(-1)
        output = q.new_zeros((kv_heads, depths * group, self.values.shape[-1]))
        for s, e in spans:
            output.baddbmm_(probs[..., s:e], self.values[:, s:e].float())
        output = output.reshape(kv_heads, depths, group, -1).transpose(0, 1).reshape(depths, heads, -1)
        largest = self.largest[:length].cummax(0).values[ends.clamp(max=length - 1)].clamp(min=1e-30)
        errors = ((output - backend_outputs.float()).abs().flatten(1).amax(1) / largest).tolist()
        limit = TOLERANCE.get(backend_outputs.dtype, OTHER_TOLERANCE)
        sinks = min(sinks, round_start)
        probs = probs.view(kv_heads, depths, group, length)
        sink, drafts = (part.sum(-1).transpose(0, 1).reshape(depths, heads)
                        for part in (probs[..., :sinks], probs[..., round_start:]))
        rest = (1 - sink - drafts).clamp(min=0)   # a softmax sums to 1: the long middle is not summed again
        sink, drafts, rest = sink.tolist(), drafts.tolist(), rest.tolist()
        measured: list[Masses | str] = []
        for d, position in enumerate(positions):
            if position >= length:
                measured.append(_not_computed(length))
            elif errors[d] > limit:
                measured.append(f"the probe's copy of the keys does not reproduce the backend's attention output "
                                f"({errors[d]:.1e} of the largest value attended over): this backend attends "
                                "differently")
            else:
                measured.append(Masses(sink=sink[d], drafts=drafts[d], rest=rest[d]))
        return measured

    def _grow(self, capacity: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        per_position = (keys[0].numel() + values[0].numel()) * keys.element_size() + 1 + 4
        nbytes = capacity * per_position
        if not self.budget.take(nbytes):   # the old copy stays counted until the new one replaces it
            raise Unavailable(f"the probe's key copies would pass their {self.budget.max_bytes >> 20} MiB "
                              "(EAGLE_PROBE_MAX_KEY_BYTES): attention is not measured for this request")
        old_capacity = self.capacity
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], capacity, old.shape[2]))
            new[:, :old_capacity] = old
            setattr(self, name, new)
        for name in ("written", "largest"):
            old = getattr(self, name)
            new = old.new_zeros(capacity)
            new[:old_capacity] = old
            setattr(self, name, new)
        self.budget.give_back(self.bytes)
        self.bytes = nbytes


def _not_computed(position: int) -> str:
    return (f"the drafter's key at position {position} was not computed in this request (a prefix-cache hit? send "
            "recorded requests with a unique cache_salt)")


MEAN_FIELDS = ("sink_attention", "self_attention", "rest_attention")


def across_ranks(answers: list[dict | None]) -> dict | None:
    """One fetch answer from the answers of one engine's workers. Workers that record nothing (pipeline
    stages before the last never sample, gpu_model_runner.py ~4307) answer None and are left out. The
    tensor-parallel ranks that remain record the same steps; only their attention differs, each
    measuring its own query heads. Ranks hold equally many heads, so the mean over all heads is the
    mean of the ranks' means. Ranks that disagree make an error in the answer, never an exception."""
    answers = [a for a in answers if a is not None]
    if not answers:
        return None
    first = answers[0]
    if len(answers) == 1:
        return first
    counts = [len(a.get("records") or []) for a in answers]
    if len(set(counts)) > 1:
        return {**first, "records": [], "error": f"the tensor-parallel ranks hold different numbers of records "
                                                 f"{counts}: this fetch's records are dropped"}
    for i, record in enumerate(first.get("records") or []):
        ranks = [answer["records"][i] for answer in answers]
        if any((r.get("drafts"), r.get("tokens")) != (record.get("drafts"), record.get("tokens")) for r in ranks):
            record["error"] = "the tensor-parallel ranks recorded different drafts or tokens for this step"
        errors = [r["attention_error"] for r in ranks if "attention_error" in r]
        measured = [all(f in r for f in MEAN_FIELDS) for r in ranks]
        if errors or any(measured) != all(measured):   # some ranks measured attention, others not
            for field in (*MEAN_FIELDS, "attention_by_head"):
                record.pop(field, None)
            if errors:
                record["attention_error"] = errors[0]
            continue
        for field in MEAN_FIELDS:
            if field in record:
                record[field] = [sum(values) / len(values) for values in zip(*(r[field] for r in ranks))]
        if "attention_by_head" in record:
            record["attention_by_head"] = [[head for depth in by_depth for head in depth]
                                           for by_depth in zip(*(r["attention_by_head"] for r in ranks))]
    return first
