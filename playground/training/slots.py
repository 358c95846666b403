"""Self-distillation at GPU speed: a fixed set of slots decoding side by side, refilled as they end.

`data.continue_batch` pads a batch to its longest prompt and runs until its longest answer ends:
rows that finish early idle, and every step's shapes differ. Here each of `slots` rows holds one
sequence in its own cache row, and every step feeds one token per row at the row's own position
(the next prompt token while the row reads its prompt, then the token it just produced). The
step's shapes never change, so on a GPU one captured CUDA graph replays the target's forward.
Between steps, rows that ended (EOS, or the length cap) hand back their reply and take the next
prompt. Reading a prompt a token a step costs one step per prompt token; answers of up to 256
tokens after prompts of 30-100 amortise it, and it keeps one step shape for everything.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from playground.engines.sampling import SamplingParams, probabilities
from playground.model.kv_cache import KVCache
from playground.model.target import Target

log = logging.getLogger(__name__)
CHECK_EVERY = 8   # steps between looks at which rows ended (each look waits for the device)


def row_forward(target: Target, cache: KVCache, slots: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """target.decode_rows over `cache`, as a replayed CUDA graph on a GPU (the same call elsewhere)."""
    if target.device.type != "cuda":
        return lambda ids, positions: target.decode_rows(ids, positions, cache)
    ids = torch.zeros(slots, dtype=torch.long, device=target.device)
    positions = torch.zeros_like(ids)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the graph, as capture requires
        for _ in range(2):
            target.decode_rows(ids, positions, cache)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            logits = target.decode_rows(ids, positions, cache)
    except RuntimeError as e:   # a kernel this build cannot capture: the same steps, launched one by one
        log.warning("slot decoding runs uncaptured: %s", str(e).splitlines()[0])
        return lambda ids, positions: target.decode_rows(ids, positions, cache)

    def replay(new_ids: torch.Tensor, new_positions: torch.Tensor) -> torch.Tensor:
        ids.copy_(new_ids)
        positions.copy_(new_positions)
        graph.replay()
        return logits

    return replay


@torch.inference_mode()
def continue_slots(target: Target, prompt_ids: list[list[int]], sampled: list[bool], max_new_tokens: int,
                   params: SamplingParams, generator: torch.Generator, slots: int = 1024) -> list[list[int]]:
    """`continue_batch`'s contract: each prompt continued greedily or by sampling (`sampled`), each
    reply ending at (and including) EOS, or at the length cap; replies in the prompts' order."""
    n, slots = len(prompt_ids), min(slots, len(prompt_ids))
    device = target.device
    width = max(map(len, prompt_ids)) + max_new_tokens
    cache = target.new_cache(width, batch=slots)
    forward = row_forward(target, cache, slots)
    eos = torch.tensor(sorted(target.eos_ids), device=device)
    seq = torch.zeros(slots, width, dtype=torch.long, device=device)
    prompt_len = torch.full((slots,), width, device=device)   # an empty row never writes
    end = torch.full((slots,), width, device=device)          # a row's last token goes at end - 1
    pos = torch.zeros(slots, dtype=torch.long, device=device)
    live = torch.zeros(slots, dtype=torch.bool, device=device)
    sample_rows = torch.zeros(slots, dtype=torch.bool, device=device)
    owner = [-1] * slots                                       # which prompt each row holds
    replies: list[list[int]] = [[] for _ in range(n)]
    queue = iter(range(n))

    def refill(rows: list[int]) -> None:
        taken = [(row, i) for row, i in zip(rows, queue)]
        if not taken:
            return
        rows_t = torch.tensor([row for row, _ in taken], device=device)
        lengths = [len(prompt_ids[i]) for _, i in taken]
        block = torch.zeros(len(taken), width, dtype=torch.long)
        for j, (_, i) in enumerate(taken):
            block[j, :lengths[j]] = torch.tensor(prompt_ids[i])
            owner[taken[j][0]] = i
        seq[rows_t] = block.to(device)
        prompt_len[rows_t] = torch.tensor(lengths, device=device)
        end[rows_t] = prompt_len[rows_t] + max_new_tokens
        pos[rows_t] = 0
        live[rows_t] = True
        sample_rows[rows_t] = torch.tensor([sampled[i] for _, i in taken], device=device)

    refill(list(range(slots)))
    while any(i >= 0 for i in owner):
        any_sampled = any(sampled[i] for i in owner if i >= 0)
        for _ in range(CHECK_EVERY):
            logits = forward(seq.gather(1, pos[:, None])[:, 0], pos)
            next_ids = logits.argmax(-1)
            if any_sampled:
                drawn = torch.multinomial(probabilities(logits, params), 1, generator=generator)[:, 0]
                next_ids = torch.where(sample_rows, drawn, next_ids)
            writes = live & (pos + 1 >= prompt_len)   # the row fed its last prompt token, or its own
            at = (pos + 1)[:, None]
            seq.scatter_(1, at, torch.where(writes, next_ids, seq.gather(1, at)[:, 0])[:, None])
            live &= ~(writes & (torch.isin(next_ids, eos) | (pos + 2 >= end)))
            pos = torch.where(live, pos + 1, pos)
        ended = [row for row in (~live).nonzero()[:, 0].tolist() if owner[row] >= 0]
        if ended:
            last = (pos[ended] + 2).tolist()                   # a row ends on the token at pos + 1
            starts = prompt_len[ended].tolist()
            for row, tokens, start, stop in zip(ended, seq[ended].tolist(), starts, last):
                replies[owner[row]] = tokens[start:stop]
                owner[row] = -1
            refill(ended)
    return replies
