"""Our kernels' ops as Python functions: the one place that knows each op's arguments and their order
(the schemas the .cpp files register under torch.ops.playground). Callers name every argument; the
ops themselves check shapes and say what is wrong. Load the kernels (kernels.status()) before calling."""

from __future__ import annotations

from typing import NamedTuple

import torch


class DrafterStep(NamedTuple):
    normed: torch.Tensor       # the drafter layer's output after its final norm, [T, H]
    h_pre: torch.Tensor        # before that norm
    sink: float                # attention mass on the sink tokens, the mean over the rows weighed and the heads
    own: float                 # on the drafter's own drafts (positions from committed_end on)


class ChainDrafts(NamedTuple):
    ids: torch.Tensor          # [k] target token ids
    probs: torch.Tensor        # [k] each draft's probability under the drafter
    sink: torch.Tensor         # [k] attention on the sink tokens, by depth
    own: torch.Tensor          # [k] attention on the drafter's own drafts, by depth
    rms: torch.Tensor          # [k] RMS of the state fed into each depth


def rows_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for a few rows of x; weight float32, bfloat16, or GGUF blocks (Q4_1 uint8, Q8_0 int8)."""
    return torch.ops.playground.rows_linear(x, weight)


def verify_argmax(final: torch.Tensor, head: torch.Tensor, tokens: list[int], parents: list[int]) -> list[int]:
    """The head's argmax after each row of a verify's final states that can still be read (Target.greedy_tokens)."""
    return torch.ops.playground.verify_argmax(final, head, tokens, parents).tolist()


def cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, start: int,
                    mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """One layer's attention of q [B, heads, T, hd] over its cache's first start + T positions."""
    return torch.ops.playground.cache_attention(q, keys, values, start, mask, causal)


def decoder_layers(h: torch.Tensor, weights: list[torch.Tensor], *, cos: torch.Tensor, sin: torch.Tensor,
                   keys: torch.Tensor, values: torch.Tensor, start: int, mask: torch.Tensor | None, causal: bool,
                   eps: float, num_heads: int, taps: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The target's whole decoder stack in one call, writing its cache at start..: the final hidden states,
    and the inputs of the `taps` layers (EAGLE 3's features)."""
    h, *tapped = torch.ops.playground.decoder_layers(h, weights, cos, sin, keys, values, start, mask, causal, eps,
                                                     num_heads, taps)
    return h, tapped


def eagle_fuse(features: torch.Tensor, *, norms: list[torch.Tensor], fc: torch.Tensor, eps: float) -> torch.Tensor:
    """The drafter's first input from the target's features [N, n_aux * Ht]: each part normed (EAGLE 3.1's
    fc_norm, where `norms` are given), then fc."""
    return torch.ops.playground.eagle_fuse(features, norms, fc, eps)


def eagle_step(hidden: torch.Tensor, embeds: torch.Tensor, weights: list[torch.Tensor], *, cos: torch.Tensor,
               sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, eps: float, num_heads: int,
               sink_tokens: int, committed_end: int, mask: torch.Tensor | None) -> DrafterStep:
    """One drafter step for rows hidden, embeds [T, H] written at start.., attention causal over the cache
    or as `mask` allows; positions from committed_end on are the drafter's own drafts."""
    return DrafterStep(*torch.ops.playground.eagle_step(hidden, embeds, weights, cos, sin, keys, values, start, eps,
                                                        num_heads, sink_tokens, committed_end, mask))


def eagle_chain(hidden: torch.Tensor, ids: torch.Tensor, *, embedding: torch.Tensor, weights: list[torch.Tensor],
                head: torch.Tensor, draft_to_target: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                keys: torch.Tensor, values: torch.Tensor, start: int, k: int, eps: float, num_heads: int,
                sink_tokens: int, norm_output: bool) -> ChainDrafts:
    """A greedy chain of k drafts in one call: every depth's step, head and argmax."""
    return ChainDrafts(*torch.ops.playground.eagle_chain(hidden, ids, embedding, weights, head, draft_to_target, cos,
                                                         sin, keys, values, start, k, eps, num_heads, sink_tokens,
                                                         norm_output))
