"""Token distributions and the verification rules of speculative decoding.

Greedy: accept the longest prefix of drafts equal to the target's argmax, then emit the
target's own token (correction at the first mismatch, bonus after all k).
Sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft x with probability
min(1, p(x) / q(x)), else emit a sample of norm(max(0, p - q)); after k accepts, sample p.
The emitted sequence then has exactly the target's sampling distribution, whatever q is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-p (nucleus) filtering, as transformers' TopPLogitsWarper: [.., V] -> probs."""
    logits = logits.float() / params.temperature
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1.0 - params.top_p)
        drop_sorted[..., -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_greedy(draft_ids: list[int], target_ids: list[int]) -> tuple[int, int]:
    """(number of drafts accepted, the target's token after them); target_ids: the target's greedy
    token after the last committed token and after each draft (k + 1; past the first rejected
    draft they are not read)."""
    accepted = 0
    while accepted < len(draft_ids) and draft_ids[accepted] == target_ids[accepted]:
        accepted += 1
    return accepted, target_ids[accepted]


def verify_sampling(draft_ids: list[int], draft_q: torch.Tensor, target_p: torch.Tensor,
                    generator: torch.Generator) -> tuple[int, int]:
    """Lossless rejection sampling; draft_q [k, V] the drafter's distributions, target_p [k+1, V]."""
    for i, x in enumerate(draft_ids):
        p, q = float(target_p[i, x]), float(draft_q[i, x])
        if q > 0 and torch.rand((), generator=generator).item() * q < p:
            continue
        residual = (target_p[i] - draft_q[i]).clamp_min(0.0)
        total = residual.sum()
        # residual == 0 only when p == q everywhere, in which case x is always accepted above
        return i, sample(residual / total if total > 0 else target_p[i], generator)
    return len(draft_ids), sample(target_p[len(draft_ids)], generator)
