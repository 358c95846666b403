"""The probe's attention self-check against this GPU's own attention kernels.

    python3 scripts/probe-gpu-check.py [--json FILE]      # on a machine with a CUDA GPU and PyTorch

On a GPU server the drafter attends through a fused kernel in 16 bits, and the probe takes a query's
attention as measured only when its copy of the keys reproduces the kernel's output (probe/eagle_probe/
attention.py, TOLERANCE). For each of PyTorch's CUDA attention kernels (flash, memory-efficient, math)
and each dtype they take, a drafting round of 5 depths is attended at the end of a context, with sink
keys, the way vLLM's drafter attends (causal, grouped-query heads): the check must pass on the kernel's
output over the copy, and fail on the output of a window that left out the sinks and on another query's output; where
it passes one of those, the row gives how far the sink mass it reports is from the truth. Each row
also gives the round's measurement time.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from eagle_probe.attention import TOLERANCE, Budget, KeyCopy  # noqa: E402

SHAPES = {"SmolLM2-135M drafter": (9, 3, 64), "Llama-3.1-8B drafter": (32, 8, 128)}   # heads, kv heads, dim
KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
SINK_MASSES = (0.02, 0.3)   # of the attention on the sink keys: diffuse, and a strong sink
DEPTHS, SINKS, ROUNDS = 5, 4, 8
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def attend(kernel, queries, keys, values):
    """The kernel's output for a round's queries [depths, heads, dim] at the end of keys [n, kv heads, dim]."""
    depths, n = queries.shape[0], keys.shape[0]
    group = queries.shape[1] // keys.shape[1]   # the fused kernels here take as many kv heads as query heads
    q, k, v = (t.transpose(0, 1)[None] for t in (queries, keys.repeat_interleave(group, 1),
                                                  values.repeat_interleave(group, 1)))
    with sdpa_kernel(kernel):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(depths, n))
    return out[0].transpose(0, 1)


def with_sinks(queries, keys, mass: float):
    """`keys` with the first SINKS moved along each kv head's mean query until they hold about `mass` of the
    attention (bisection, in float32)."""
    direction = queries.reshape(DEPTHS, keys.shape[1], -1, keys.shape[2]).mean((0, 2))
    direction = direction / direction.norm(dim=-1, keepdim=True)
    low, high = 0.0, 200.0
    for _ in range(40):
        moved = keys.clone()
        moved[:SINKS] = (low + high) / 2 * direction
        group = queries.shape[1] // keys.shape[1]
        scores = torch.einsum("dhe,nhe->dhn", queries, moved.repeat_interleave(group, 1)) * keys.shape[2] ** -0.5
        sink = float(scores.softmax(-1)[..., :SINKS].sum(-1).mean())
        low, high = ((low + high) / 2, high) if sink < mass else (low, (low + high) / 2)
    return moved


def case(kernel, dtype, heads, kv_heads, dim, length, mass, seed) -> dict:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    queries = torch.randn(DEPTHS, heads, dim, device=DEVICE, generator=g)
    keys = torch.randn(length, kv_heads, dim, device=DEVICE, generator=g)
    values = torch.randn(length, kv_heads, dim, device=DEVICE, generator=g)
    keys = with_sinks(queries, keys, mass)
    queries, keys, values = (t.to(dtype) for t in (queries, keys, values))
    copy = KeyCopy(keys[:1], dim, Budget(1 << 34, 1 << 20))
    copy.write(torch.arange(length, device=DEVICE), keys, values)
    positions, start, scale = list(range(length - DEPTHS, length)), length - DEPTHS, dim ** -0.5
    check = lambda q, outputs: copy.masses_of_round(q, positions, start, SINKS, scale, outputs)
    right = check(queries, attend(kernel, queries, keys, values))
    # what the check is for: a backend that attended over other keys (a window without the sinks), or an
    # output that is not this query's; where it passes one, the sink mass it reports against the truth
    window = check(queries, attend(kernel, queries, keys[SINKS:], values[SINKS:]))
    truth = check(queries.roll(1, 0), attend(kernel, queries.roll(1, 0), keys, values))
    other = check(queries, attend(kernel, queries.roll(1, 0), keys, values))
    sink = lambda m: sum(m.sink) / len(m.sink)
    missed = [sink(m) for m in window if not isinstance(m, str)]
    missed += [abs(sink(m) - sink(t)) for m, t in zip(other, truth) if not isinstance(m, str)]
    sync()
    begin = time.perf_counter()
    for _ in range(ROUNDS):
        check(queries, attend(kernel, queries, keys, values))
    sync()
    passed = [m for m in right if not isinstance(m, str)]
    return {"passed": len(passed), "window_caught": sum(isinstance(m, str) for m in window),
            "other_caught": sum(isinstance(m, str) for m in other), "depths": DEPTHS,
            "sink_mass": sum(sink(m) for m in passed) / max(1, len(passed)),
            "missed_sink_error": max(missed, default=0.0),
            "ms_per_round": (time.perf_counter() - begin) / ROUNDS * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    warnings.filterwarnings("ignore", message=".*kernel not used|.*does not support|.*runtime disabled")
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"{device}, torch {torch.__version__}; tolerance by dtype: "
          + ", ".join(f"{str(d).split('.')[1]} {t:.1e}" for d, t in TOLERANCE.items()))
    print("| drafter | kernel | dtype | context | check passed | window caught | other query caught "
          "| sink mass | sink error when missed | ms/round |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for kernel_name, kernel in KERNELS.items():
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                for length, mass in ((n, m) for n in (1024, 8192, 32768) for m in SINK_MASSES):
                    try:
                        row = case(kernel, dtype, heads, kv_heads, dim, length, mass, seed=length)
                    except RuntimeError as e:   # a kernel that does not take this dtype or shape here
                        print(f"| {name} | {kernel_name} | {str(dtype).split('.')[1]} | {length} | "
                              f"not run: {str(e).splitlines()[0][:80]} |", flush=True)
                        continue
                    row |= {"drafter": name, "kernel": kernel_name, "dtype": str(dtype).split(".")[1],
                            "context": length}
                    rows.append(row)
                    print(f"| {name} | {kernel_name} | {row['dtype']} | {length} | {row['passed']}/{DEPTHS} "
                          f"| {row['window_caught']}/{DEPTHS} | {row['other_caught']}/{DEPTHS} "
                          f"| {row['sink_mass']:.3f} | {row['missed_sink_error']:.4f} | {row['ms_per_round']:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": device, "torch": torch.__version__,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
