"""The training-time-test objective (see train.py's recipe): batches padded with the target's
states, the unrolled loss of one batch, and its teacher-forced measure on held-out data (Validator),
which training takes at every save and `train validate` takes for finished drafters."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from playground.errors import PlaygroundError
from playground.model.drafter import Eagle3Drafter
from playground.model.target import Target


def ttt_attend(keys: list[torch.Tensor], values: list[torch.Tensor], group: int):
    """Attention for unroll step i = len(keys) - 1: causal over step-0 keys, diagonal over steps 1..i."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys.append(k.repeat_interleave(group, dim=1))    # [B, heads, T, hd]
        values.append(v.repeat_interleave(group, dim=1))
        T = q.shape[2]
        scale = q.shape[-1] ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        s0 = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, h, T, T]
        diag = [((q * kj).sum(-1) * scale)[..., None] for kj in keys[1:]]                  # [B, h, T, 1] each
        probs = torch.cat([s0, *diag], dim=-1).softmax(-1)
        out = probs[..., :T] @ values[0]
        for j, vj in enumerate(values[1:]):
            out = out + probs[..., T + j:T + j + 1] * vj
        return out

    return attend


@torch.no_grad()
def target_states(target: Target, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The target's fused features [B, T, 3H], final normed states [B, T, H] and full-vocabulary
    argmax [B, T] over right-padded ids [B, T] (attention is causal: padding changes no real position)."""
    out = target.forward(ids, target.new_cache(ids.shape[1], batch=ids.shape[0]), last_only=True)
    top = torch.stack([target.lm_head(final).argmax(-1) for final in out.final_hidden])  # a row's logits at a time
    # clones: the forward runs in inference mode, and autograd may not save inference tensors
    return {"features": out.features.clone(), "final": out.final_hidden.clone(), "top": top.clone()}


def padded_batch(chosen: list[dict], target: Target, max_len: int) -> dict:
    """Right-padded ids [B, T + 1] (cut at max_len + 1 tokens), the answer mask [B, T + 1], and the
    target's states at positions 0..T-1, on the target's device."""
    T = min(max_len, max(len(ex["ids"]) - 1 for ex in chosen))
    ids = torch.zeros(len(chosen), T + 1, dtype=torch.long)
    answer = torch.zeros(len(chosen), T + 1, dtype=torch.bool)
    for b, ex in enumerate(chosen):
        n = min(T + 1, len(ex["ids"]))
        ids[b, :n] = ex["ids"][:n].long()
        answer[b, ex["prompt_len"]:n] = True
    ids, answer = ids.to(target.device), answer.to(target.device)
    return {"ids": ids, "answer": answer, **target_states(target, ids[:, :T])}


class TTTResult(NamedTuple):
    loss: torch.Tensor          # sum_i decay^i * step_loss[i], differentiable
    step_loss: list[float]      # per unroll step, mean over its counted positions
    step_acc: list[float]       # per unroll step: the drafter's argmax is the target's
    step_tokens: list[int]      # the positions each step counted (answer tokens with a draftable target argmax)


def ttt_loss(drafter: Eagle3Drafter, embed: torch.Tensor, head: torch.Tensor, in_vocab: torch.Tensor,
             batch: dict, ttt_steps: int, decay: float) -> TTTResult:
    """The unrolled loss of one batch, and its per-step loss and accuracy."""
    ids, final, answer = batch["ids"], batch["final"], batch["answer"]
    B, T, _ = batch["features"].shape
    c = drafter.config
    with torch.no_grad():
        # position t predicts token t+1; the target's distribution restricted to the draft vocab
        target_p = (final @ head[drafter.t2d].T).softmax(-1)     # [B, T, draft_vocab]
        ok_top = in_vocab[batch["top"]]                          # its full-vocab argmax is draftable
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    group = c.num_attention_heads // c.num_key_value_heads
    hidden = drafter.fuse(batch["features"])                 # [B, T, H]
    total, stats = hidden.new_zeros(()), []
    for i in range(ttt_steps):
        n = T - 1 - i                                        # positions t with a target at t + 1 + i
        if n <= 0:
            break
        tokens = F.pad(ids[:, 1 + i:1 + i + n], (0, T - n))  # token t+1+i at position t
        normed, fed = drafter.step(hidden, F.embedding(tokens, embed), torch.arange(T, device=ids.device) + i,
                                   ttt_attend(keys, values, group))
        logits = drafter.draft_logits(normed[:, :n])         # [B, n, draft_vocab]
        p = target_p[:, 1 + i:1 + i + n]
        mask = (answer[:, 2 + i:2 + i + n] & ok_top[:, 1 + i:1 + i + n]).float()
        ce = -(p * logits.float().log_softmax(-1)).sum(-1)
        loss_i = (ce * mask).sum() / mask.sum().clamp_min(1.0)
        total = total + decay ** i * loss_i
        hit = (logits.argmax(-1) == p.argmax(-1)).float()
        stats.append(torch.stack([loss_i.detach().float(), (hit * mask).sum() / mask.sum().clamp_min(1.0), mask.sum()]))
        hidden = fed
    losses, accs, counts = torch.stack(stats).T.tolist() if stats else ([], [], [])   # one wait for the device
    return TTTResult(total, losses, accs, [int(c) for c in counts])


class Validator:
    """Teacher-forced loss and accuracy by unroll depth on held-out sequences: training's own
    measure (step_acc), where no drafter has trained. Batches of similar length and their target
    states are made once; each measure pools the batches by counted position."""

    def __init__(self, examples: list[dict], target: Target, batch: int, max_len: int, limit: int = 256):
        chosen = sorted(examples[:limit], key=lambda ex: len(ex["ids"]))
        if not chosen:
            raise PlaygroundError("the held-out data folders hold no sequences (make them with `train data`)")
        self.sequences = len(chosen)
        self.batches = [padded_batch(chosen[i:i + batch], target, max_len) for i in range(0, len(chosen), batch)]

    @torch.no_grad()
    def __call__(self, drafter: Eagle3Drafter, embed: torch.Tensor, head: torch.Tensor, in_vocab: torch.Tensor,
                 ttt_steps: int, decay: float, bf16: bool) -> dict:
        results = []
        for batch in self.batches:
            with torch.autocast(batch["ids"].device.type, dtype=torch.bfloat16, enabled=bf16):
                results.append(ttt_loss(drafter, embed, head, in_vocab, batch, ttt_steps, decay))
        depths = range(min(len(r.step_acc) for r in results))
        tokens = [sum(r.step_tokens[d] for r in results) for d in depths]
        pooled = lambda field: [sum(getattr(r, field)[d] * r.step_tokens[d] for r in results) / max(1, tokens[d])
                                for d in depths]
        step_loss = pooled("step_loss")
        return {"sequences": self.sequences, "tokens": tokens[0] if tokens else 0,
                "loss": sum(decay ** d * x for d, x in enumerate(step_loss)), "step_loss": step_loss,
                "step_acc": pooled("step_acc")}
