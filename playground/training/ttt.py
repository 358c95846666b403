"""The training-time-test objective (see train.py's recipe): batches padded with the target's
states, the unrolled loss of one batch, and its teacher-forced measure on held-out data (Validator),
which training takes at every save and `train validate` takes for finished drafters."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from playground.errors import PlaygroundError
from playground.evaluation.machine import native_bf16
from playground.model.drafter import Eagle3Drafter
from playground.model.target import Target


def ttt_attend(keys: list[torch.Tensor], values: list[torch.Tensor], group: int,
               context: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Attention for unroll step i = len(keys) - 1: causal over step-0 keys, diagonal over steps 1..i.
    The queries may start past position 0: `context` is then step 0's keys and values [B, kv, first, hd]
    at the positions before them, which step 0's queries see too."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not keys and context is not None:
            k, v = torch.cat([context[0], k], dim=2), torch.cat([context[1], v], dim=2)
        keys.append(k.repeat_interleave(group, dim=1))    # [B, heads, T or first + S, hd]
        values.append(v.repeat_interleave(group, dim=1))
        S, T = q.shape[2], keys[0].shape[2]
        scale = q.shape[-1] ** -0.5
        causal = torch.ones(S, T, dtype=torch.bool, device=q.device).tril(T - S)
        s0 = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, h, S, T]
        diag = [((q * kj).sum(-1) * scale)[..., None] for kj in keys[1:]]                  # [B, h, S, 1] each
        probs = torch.cat([s0, *diag], dim=-1).softmax(-1)
        out = probs[..., :T] @ values[0]
        for j, vj in enumerate(values[1:]):
            out = out + probs[..., T + j:T + j + 1] * vj
        return out

    return attend


@torch.no_grad()
def target_states(target: Target, ids: torch.Tensor, top_from: int = 0) -> dict[str, torch.Tensor]:
    """The target's fused features [B, T, 3H], final normed states [B, T, H] and full-vocabulary
    argmax [B, T] over right-padded ids [B, T] (attention is causal: padding changes no real position).
    The argmax, a head over the whole vocabulary, only from position `top_from` on (0 before it)."""
    out = target.forward(ids, target.new_cache(ids.shape[1], batch=ids.shape[0]), last_only=True)
    top = torch.zeros(ids.shape, dtype=torch.long, device=ids.device)
    for b, final in enumerate(out.final_hidden):   # a row's logits at a time
        top[b, top_from:] = target.lm_head(final[top_from:]).argmax(-1)
    # clones: the forward runs in inference mode, and autograd may not save inference tensors
    return {"features": out.features.clone(), "final": out.final_hidden.clone(), "top": top}


def padded_batch(chosen: list[dict], target: Target, max_len: int) -> dict:
    """Right-padded ids [B, T + 1] (cut at max_len + 1 tokens), the answer mask [B, T + 1], and the
    target's states at positions 0..T-1, on the target's device. Each sequence's states come from a
    forward over it alone, as long as it is (a long context padding a short one would cost as much
    again); padding positions get zeros, which no counted position sees."""
    T = min(max_len, max(len(ex["ids"]) - 1 for ex in chosen))
    ids = torch.zeros(len(chosen), T + 1, dtype=torch.long)
    answer = torch.zeros(len(chosen), T + 1, dtype=torch.bool)
    for b, ex in enumerate(chosen):
        n = min(T + 1, len(ex["ids"]))
        ids[b, :n] = ex["ids"][:n].long()
        answer[b, ex["prompt_len"]:n] = True
    ids, answer = ids.to(target.device), answer.to(target.device)
    states = {}
    for b, ex in enumerate(chosen):
        n = min(T, len(ex["ids"]) - 1)
        # the argmax counts where an answer token follows (ttt_loss's mask), from the prompt's last token on
        for name, value in target_states(target, ids[b:b + 1, :n], top_from=max(0, ex["prompt_len"] - 1)).items():
            states.setdefault(name, value.new_zeros(len(chosen), T, *value.shape[2:]))[b, :n] = value[0]
    return {"ids": ids, "answer": answer, **states}


class TTTResult(NamedTuple):
    loss: torch.Tensor          # sum_i decay^i * step_loss[i], differentiable
    step_loss: list[float]      # per unroll step, mean over its counted positions
    step_acc: list[float]       # per unroll step: the drafter's argmax is the target's
    step_tokens: list[int]      # the positions each step counted (answer tokens with a draftable target argmax)


# A part of a batch trained in one pass holds at most this many query-key pairs of attention (sequences
# times queries times keys; one sequence at least): a batch of long contexts takes several passes, their
# gradients added up, in a few GiB.
PART_SCORES = 4_000_000


def query_window(answer: torch.Tensor, ttt_steps: int) -> tuple[int, int]:
    """The positions [first, end) whose queries some unroll step's loss counts: depth i at position t
    predicts token t + 2 + i, so from the earliest answer token less ttt_steps + 1 to the last less one
    ((0, 0) where no row has an answer)."""
    counted = answer.any(0).nonzero()
    if not len(counted):
        return 0, 0
    return max(0, int(counted[0]) - 1 - ttt_steps), max(0, int(counted[-1]) - 1)


def counted_positions(batch: dict, in_vocab: torch.Tensor, ttt_steps: int) -> list[int]:
    """Each unroll step's counted positions in the batch (what ttt_loss's per-step means divide by)."""
    answer, ok_top = batch["answer"], in_vocab[batch["top"]]
    T = ok_top.shape[1]
    return [int((answer[:, 2 + i:T + 1] & ok_top[:, 1 + i:T]).sum()) for i in range(ttt_steps) if T - 1 - i > 0]


def ttt_loss(drafter: Eagle3Drafter, embed: torch.Tensor, head: torch.Tensor, in_vocab: torch.Tensor,
             batch: dict, ttt_steps: int, decay: float, window: tuple[int, int] | None = None,
             counts: list[int] | None = None) -> TTTResult:
    """The unrolled loss of one batch, and its per-step loss and accuracy. Queries, the head and the loss
    run at the positions of `window` only (default query_window: where the answers are); the positions
    before it only give step 0's keys and values. With `counts` (counted_positions of a whole batch this
    one is a part of), every per-step figure is divided by them instead: the parts' figures add up to the
    whole's."""
    ids, answer = batch["ids"], batch["answer"]
    T = batch["features"].shape[1]
    c = drafter.config
    first, end = query_window(answer, ttt_steps) if window is None else window
    stop = min(T, end + ttt_steps)                           # the last target a query at end - 1 predicts, + 1
    with torch.no_grad():
        # position t predicts token t+1; the target's distribution restricted to the draft vocab
        target_p = (batch["final"][:, first:stop] @ head[drafter.t2d].T).softmax(-1)   # [B, stop - first, draft_vocab]
        ok_top = in_vocab[batch["top"][:, first:stop]]                                # its full-vocab argmax is draftable
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    group = c.num_attention_heads // c.num_key_value_heads
    hidden = drafter.fuse(batch["features"][:, :end])        # [B, end, H]
    context = (drafter.keys_values(hidden[:, :first], F.embedding(ids[:, 1:first + 1], embed),
                                   torch.arange(first, device=ids.device)) if first else None)
    hidden = hidden[:, first:]
    positions = torch.arange(first, end, device=ids.device)
    total, stats = hidden.new_zeros(()), []
    for i in range(ttt_steps):
        m = min(end, T - 1 - i) - first                      # queries t = first.. with a target at t + 1 + i
        if m <= 0:
            break
        tokens = F.pad(ids[:, first + 1 + i:first + 1 + i + m], (0, end - first - m))  # token t+1+i at position t
        normed, fed = drafter.step(hidden, F.embedding(tokens, embed), positions + i,
                                   ttt_attend(keys, values, group, context))
        logits = drafter.draft_logits(normed[:, :m])         # [B, m, draft_vocab]
        p = target_p[:, 1 + i:1 + i + m]
        mask = (answer[:, first + 2 + i:first + 2 + i + m] & ok_top[:, 1 + i:1 + i + m]).float()
        divisor = mask.sum().clamp_min(1.0) if counts is None else max(1, counts[i])
        ce = -(p * logits.float().log_softmax(-1)).sum(-1)
        loss_i = (ce * mask).sum() / divisor
        total = total + decay ** i * loss_i
        hit = (logits.argmax(-1) == p.argmax(-1)).float()
        stats.append(torch.stack([loss_i.detach().float(), (hit * mask).sum() / divisor, mask.sum()]))
        hidden = fed
    losses, accs, counted = torch.stack(stats).T.tolist() if stats else ([], [], [])   # one wait for the device
    return TTTResult(total, losses, accs, [int(n) for n in counted])


def batch_parts(answer: torch.Tensor, ttt_steps: int, part_scores: int = PART_SCORES) -> list[list[int]]:
    """The batch's rows with an answer, in parts of at most part_scores query-key pairs (one row at least):
    rows in the order their answers start, so that a part's rows share a window."""
    starts = [(int(row.nonzero()[0]), b) for b, row in enumerate(answer) if row.any()]
    parts: list[list[int]] = []
    for _, b in sorted(starts):
        grown = parts[-1] + [b] if parts else None
        first, end = query_window(answer[grown], ttt_steps) if grown else (0, 0)
        if grown is not None and len(grown) * (end - first) * end <= part_scores:
            parts[-1] = grown
        else:
            parts.append([b])
    return parts


def autocast_bf16(requested: bool | None, device: str) -> bool:
    """bf16 autocast as asked, or by default where it pays: on CUDA, and on CPUs that compute bf16 natively
    (elsewhere oneDNN emulates it: 6x slower than float32 on an AVX2 EPYC)."""
    if requested is not None:
        return requested
    return torch.device(device).type != "cpu" or native_bf16()


def ttt_pooled(drafter: Eagle3Drafter, embed: torch.Tensor, head: torch.Tensor, in_vocab: torch.Tensor,
               batch: dict, ttt_steps: int, decay: float, bf16: bool, backward: bool,
               part_scores: int = PART_SCORES) -> TTTResult:
    """ttt_loss of the whole batch, taken in parts of bounded memory (batch_parts), with (`backward`) its
    gradient added to the drafter's: the loss and gradient of one pass over the batch. The loss comes back
    detached."""
    counts = counted_positions(batch, in_vocab, ttt_steps)
    parts = []
    for rows in batch_parts(batch["answer"], ttt_steps, part_scores):
        part = {name: value[rows] for name, value in batch.items()}
        with torch.autocast(batch["ids"].device.type, dtype=torch.bfloat16, enabled=bf16):
            result = ttt_loss(drafter, embed, head, in_vocab, part, ttt_steps, decay, counts=counts)
        if backward and result.loss.requires_grad:
            result.loss.backward()
        parts.append(result)
    depths = range(min((len(r.step_loss) for r in parts), default=0))
    added = lambda field: [sum(getattr(r, field)[d] for r in parts) for d in depths]
    return TTTResult(sum((r.loss.detach() for r in parts), torch.zeros(())), added("step_loss"), added("step_acc"),
                     added("step_tokens"))


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
        results = [ttt_pooled(drafter, embed, head, in_vocab, batch, ttt_steps, decay, bf16, backward=False)
                   for batch in self.batches]
        depths = range(min(len(r.step_acc) for r in results))
        tokens = [sum(r.step_tokens[d] for r in results) for d in depths]
        pooled = lambda field: [sum(getattr(r, field)[d] * r.step_tokens[d] for r in results) / max(1, tokens[d])
                                for d in depths]
        step_loss = pooled("step_loss")
        return {"sequences": self.sequences, "tokens": tokens[0] if tokens else 0,
                "loss": sum(decay ** d * x for d, x in enumerate(step_loss)), "step_loss": step_loss,
                "step_acc": pooled("step_acc")}
