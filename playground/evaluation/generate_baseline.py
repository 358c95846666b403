"""transformers' own greedy `generate` of the target: the losslessness reference and the speed baseline."""

from __future__ import annotations

import time

import torch

from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest


def transformers_greedy(engine: ReferenceEngine, request: GenerationRequest) -> tuple[list[int], float]:
    """(new token ids, seconds) of `model.generate(do_sample=False)` on the request's prompt."""
    ids = torch.tensor([engine.prompt_ids(request)])
    model = engine.target.reference()   # loaded on first use: not part of the timing
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.max_tokens,
                         do_sample=False, pad_token_id=min(engine.target.eos_ids))
    seconds = time.perf_counter() - start
    return out[0, ids.shape[1]:].tolist(), seconds
