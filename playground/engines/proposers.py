"""Drafting behind one small interface: observe committed positions, propose a chain of k tokens
or a draft tree.

The verify loop (reference.py) knows nothing else about drafters. EagleProposer runs an
Eagle3Drafter, chains and trees, with its own KV cache and records what the playground plots:
attention mass on sink / self-drafted keys and the RMS of the state fed into each depth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from playground.engines.draft_stop import DraftStop
from playground.engines.quantities import (FED_BACK_RMS, OWN_DRAFT_ATTENTION, REST_ATTENTION, SINK_ATTENTION,
                                           rest_of)
from playground.engines.sampling import SamplingParams, probabilities
from playground.engines.tree import ROOT, DraftTree, TreeShape
from playground.model.drafter import Eagle3Drafter
from playground.model.kernels import ops
from playground.model.kv_cache import KVCache

DEFAULT_SINK_TOKENS = 4


@dataclass
class Proposal:
    ids: list[int] = field(default_factory=list)       # target vocabulary, by depth
    q: torch.Tensor | None = None                       # [k, vocab] draft distributions (sampling only)
    probs: list[float] = field(default_factory=list)    # drafter probability of each draft
    sink_attention: list[float] = field(default_factory=list)
    self_attention: list[float] = field(default_factory=list)
    hidden_norm: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class DepthOutput:
    """One drafter step: its output (into the LM head), the state fed into the next depth, both
    [1, T, H], and its attention masses on the sink tokens and on this round's drafts (of the last
    query row, or averaged over every row where a mask says which keys each row reads)."""
    normed: torch.Tensor
    fed_back: torch.Tensor
    sink: float
    own: float


class Proposer(Protocol):
    def observe(self, features: torch.Tensor, next_ids: list[int]) -> None:
        """Committed positions: target features [m, F] and, for each, the token that follows it."""

    def propose(self, k: int, params: SamplingParams, generator: torch.Generator,
                stop: DraftStop | None = None) -> Proposal:
        """A chain of k drafts, each drawn from the drafter's distribution under `params`; with `stop`, it
        ends before the first draft that meets the rule."""

    def propose_tree(self, shape: TreeShape) -> tuple[DraftTree, Proposal]:
        """A greedy draft tree of that shape, and the probes by depth (a Proposal without ids)."""


class NoProposer:
    """No speculation: the verify loop degenerates to plain autoregressive decoding."""

    def observe(self, features: torch.Tensor, next_ids: list[int]) -> None:
        pass

    def propose(self, k: int, params: SamplingParams, generator: torch.Generator,
                stop: DraftStop | None = None) -> Proposal:
        return Proposal()

    def propose_tree(self, shape: TreeShape) -> tuple[DraftTree, Proposal]:
        return DraftTree(), Proposal()


class EagleProposer:
    """Chain and tree drafting with an EAGLE-3 drafter.

    Drafter position t holds (target feature of t, token t+1) and predicts token t+2. Positions
    with target features are committed in the drafter's cache; draft positions written past them
    are scratch, overwritten by the next observe (the rollback costs nothing).
    """

    def __init__(self, drafter: Eagle3Drafter, embed_tokens: torch.nn.Module, capacity: int,
                 sink_tokens: int = DEFAULT_SINK_TOKENS):
        c = drafter.config
        self.drafter = drafter
        self.embed_tokens = embed_tokens
        self.sink_tokens = sink_tokens
        self.cache = KVCache(1, c.num_key_value_heads, c.head_dim, capacity, drafter.dtype)
        self.scale = c.head_dim ** -0.5
        self.group = c.num_attention_heads // c.num_key_value_heads
        self.pending_features: list[torch.Tensor] = []
        self.pending_ids: list[int] = []
        self.draft_vocab_ids = drafter.to_target_ids(torch.arange(c.draft_vocab_size))
        self.vocab_size = c.vocab_size
        self.step_weights = drafter.step_weights()
        # how one step runs, chosen once: a call into kernels/eagle_step.cpp, or the drafter's modules op by op
        self._step = self._kernel_step if self.step_weights is not None else self._module_step

    @property
    def chains_in_one_call(self) -> bool:
        """Whether a greedy chain runs as one call (kernels/eagle_step.cpp's eagle_chain)."""
        return self.step_weights is not None and self.embed_tokens.weight.dtype == torch.float32

    def observe(self, features: torch.Tensor, next_ids: list[int]) -> None:
        self.pending_features.append(features)
        self.pending_ids.extend(next_ids)

    @torch.inference_mode()
    def propose(self, k: int, params: SamplingParams, generator: torch.Generator,
                stop: DraftStop | None = None) -> Proposal:
        hidden, ids, committed, end = self._take_pending()
        if params.greedy and self.chains_in_one_call and stop is None:
            return self._greedy_chain(hidden, ids, committed, end, k)
        proposal = Proposal()
        positions = torch.arange(committed, end)
        q_rows = []
        for depth in range(k):
            rms = float(hidden[0, -1].float().pow(2).mean().sqrt())
            embeds = self.embed_tokens(ids)[None].to(self.drafter.dtype)
            out = self._step(hidden, embeds, positions, end, int(positions[0]))
            if depth == 0:
                self.cache.truncate(end)
            logits = self.drafter.draft_logits(out.normed[0, -1]).float()  # [draft_vocab]
            draft_id, prob, q = self._choose(logits, params, generator)
            if stop is not None:
                if stop.stops(probability=prob, **{SINK_ATTENTION.name: out.sink, OWN_DRAFT_ATTENTION.name: out.own,
                                                   REST_ATTENTION.name: rest_of((out.sink,), (out.own,))[0],
                                                   FED_BACK_RMS.name: rms}):
                    break
                if q is not None:   # sampled: a kept draft is verified against what it was drawn from
                    q = stop.restricted(q)
            proposal.hidden_norm.append(rms)
            proposal.ids.append(draft_id)
            proposal.probs.append(prob)
            _record(proposal, out)
            if q is not None:
                q_rows.append(q)
            hidden = out.fed_back[:, -1:]
            ids = torch.tensor([draft_id])
            positions = torch.tensor([end + depth])
        if q_rows:
            proposal.q = torch.stack(q_rows)
        return proposal

    def _greedy_chain(self, hidden: torch.Tensor, ids: torch.Tensor, committed: int, end: int, k: int) -> Proposal:
        """propose's loop at temperature 0, every depth in one call (kernels/eagle_step.cpp)."""
        cos, sin = self.drafter.rope(torch.arange(committed, end + k - 1), hidden.dtype)
        c = self.drafter.config
        chain = ops.eagle_chain(hidden[0], ids, embedding=self.embed_tokens.weight, weights=self.step_weights,
                                head=self.drafter.lm_head.weight, draft_to_target=self.draft_vocab_ids, cos=cos, sin=sin,
                                keys=self.cache.keys, values=self.cache.values, start=committed, k=k,
                                eps=c.rms_norm_eps, num_heads=c.num_attention_heads, sink_tokens=self.sink_tokens,
                                norm_output=c.norm_output)
        self.cache.truncate(end)
        return Proposal(ids=chain.ids.tolist(), probs=chain.probs.tolist(), sink_attention=chain.sink.tolist(),
                        self_attention=chain.own.tolist(), hidden_norm=chain.rms.tolist())

    def _kernel_step(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, committed_end: int,
                     start: int, mask: torch.Tensor | None = None) -> DepthOutput:
        """The drafter's step written at `start`.. with attention causal over its cache, or as `mask`
        [T, start+T] allows, in one call (kernels/eagle_step.cpp)."""
        cos, sin = self.drafter.rope(positions, hidden.dtype)
        c = self.drafter.config
        step = ops.eagle_step(hidden[0], embeds[0], self.step_weights, cos=cos, sin=sin, keys=self.cache.keys,
                              values=self.cache.values, start=start, eps=c.rms_norm_eps, num_heads=c.num_attention_heads,
                              sink_tokens=self.sink_tokens, committed_end=committed_end, mask=mask)
        return DepthOutput(step.normed[None], (step.normed if c.norm_output else step.h_pre)[None], step.sink, step.own)

    def _module_step(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, committed_end: int,
                     start: int, mask: torch.Tensor | None = None) -> DepthOutput:
        """`_kernel_step`, run by the drafter's modules op by op (other dtypes, or no kernels here)."""
        masses: dict[str, float] = {}
        normed, fed_back = self.drafter.step(hidden, embeds, positions,
                                             self._attend_fn(start, committed_end, mask, masses))
        return DepthOutput(normed, fed_back, masses["sink"], masses["own"])

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        """(target id, drafter probability, full-vocab q or None) for one draft depth."""
        if params.greedy:
            d = int(logits.argmax())
            return int(self.draft_vocab_ids[d]), float(logits.softmax(-1)[d]), None
        q_draft = probabilities(logits, params)
        d = int(torch.multinomial(q_draft, 1, generator=generator))
        q = torch.zeros(self.vocab_size).index_copy_(0, self.draft_vocab_ids, q_draft)
        return int(self.draft_vocab_ids[d]), float(q_draft[d]), q

    @torch.inference_mode()
    def propose_tree(self, shape: TreeShape) -> tuple[DraftTree, Proposal]:
        """A greedy draft tree (tree.py), and its probes by depth in a Proposal (sink and self
        attention and fed-back RMS averaged over the nodes expanded at each depth)."""
        probes = Proposal()
        hidden, ids, committed, end = self._take_pending()
        probes.hidden_norm.append(float(hidden[0, -1].float().pow(2).mean().sqrt()))
        embeds = self.embed_tokens(ids)[None].to(self.drafter.dtype)
        out = self._step(hidden, embeds, torch.arange(committed, end), end, committed)
        self.cache.truncate(end)
        _record(probes, out)
        tree, sources = DraftTree(), {}
        frontier = self._expand(tree, sources, [ROOT], out.normed[0, -1:], out.fed_back[0, -1:], shape.top_k)
        slots: dict[int, int] = {}   # expanded node -> its scratch slot in the drafter cache
        for depth in range(1, shape.depth):
            frontier = sorted(frontier, key=lambda i: -tree.scores[i])[:shape.top_k]
            start = end + len(slots)
            slots.update({node: start + row for row, node in enumerate(frontier)})
            hidden = torch.stack([sources[n] for n in frontier])[None]
            probes.hidden_norm.append(float(hidden[0].float().pow(2).mean(-1).sqrt().mean()))
            mask = torch.zeros(len(frontier), start + len(frontier), dtype=torch.bool)
            mask[:, :end] = True
            for row, node in enumerate(frontier):
                while node != ROOT:   # a frontier node's ancestors were all expanded before it
                    mask[row, slots[node]] = True
                    node = tree.parents[node]
            embeds = self.embed_tokens(torch.tensor([tree.tokens[n] for n in frontier]))[None].to(self.drafter.dtype)
            out = self._step(hidden, embeds, torch.full((len(frontier),), end + depth - 1), end, start, mask)
            _record(probes, out)
            frontier = self._expand(tree, sources, frontier, out.normed[0], out.fed_back[0], shape.top_k)
        return tree.best(shape.nodes), probes

    def _take_pending(self) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """The committed positions observed since the last proposal: their fused target features
        [1, m, H], their next tokens [m], where they start in the drafter cache and where the
        first scratch position is."""
        committed = self.cache.length
        hidden = self.drafter.fuse(torch.cat(self.pending_features).to(self.drafter.dtype))[None]
        ids = torch.tensor(self.pending_ids)
        self.pending_features, self.pending_ids = [], []
        return hidden, ids, committed, committed + ids.shape[0]

    def _expand(self, tree: DraftTree, sources: dict, parents: list[int], normed: torch.Tensor,
                fed_back: torch.Tensor, top_k: int) -> list[int]:
        """Add the `top_k` likeliest children of each parent (drafter outputs `normed` [R, H], the head
        run once for all R); return the children, parent by parent."""
        best = self.drafter.draft_logits(normed).float().log_softmax(-1).topk(top_k)
        children = []
        for row, parent in enumerate(parents):
            score = 0.0 if parent == ROOT else tree.scores[parent]
            for lp, d in zip(best.values[row].tolist(), best.indices[row].tolist()):
                child = tree.add(int(self.draft_vocab_ids[d]), parent, math.exp(lp), score + lp)
                sources[child] = fed_back[row]
                children.append(child)
        return children

    def _attend_fn(self, start: int, committed_end: int, mask: torch.Tensor | None, masses: dict[str, float]):
        """Attention over the drafter cache (causal unless `mask` [T, start+T] says otherwise); puts the
        sink and own-draft mass of the last query, or with a mask of every query, averaged, in `masses`."""

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            T = q.shape[2]
            keys, values = self.cache.write(0, start, k, v)  # [1, kv, start+T, hd]
            causal = None if T == 1 else torch.ones(T, start + T, dtype=torch.bool).tril(diagonal=start)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=causal if mask is None else mask,
                                                 enable_gqa=True)
            kv_heads, hd = keys.shape[1], keys.shape[3]
            rows = q[0, :, -1:] if mask is None else q[0]                 # [heads, R, hd]
            grouped = rows.reshape(kv_heads, self.group, rows.shape[1], hd)  # query head h reads kv head h // group
            scores = torch.einsum("kgrd,ksd->kgrs", grouped, keys[0]).float() * self.scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = scores.softmax(-1)                                     # [kv, group, R, start+T]
            sinks = min(self.sink_tokens, committed_end)   # a draft is never a sink, however short the context
            masses.update(sink=float(probs[..., :sinks].sum(-1).mean()),
                          own=float(probs[..., committed_end:].sum(-1).mean()))
            return out

        return attend


def _record(probes: Proposal, out: DepthOutput) -> None:
    probes.sink_attention.append(out.sink)
    probes.self_attention.append(out.own)
