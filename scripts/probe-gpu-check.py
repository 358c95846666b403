"""The probe's attention self-check against this GPU's own attention kernels.

    python3 scripts/probe-gpu-check.py [--json FILE]      # on a machine with a CUDA GPU and PyTorch

On a GPU server the drafter attends through a fused kernel in 16 bits, and the probe takes a query's
attention as measured only when its copy of the keys reproduces the kernel's output (probe/eagle_probe/
attention.py, TOLERANCE). For each of PyTorch's CUDA attention kernels (flash, cuDNN, memory-efficient,
math) and each dtype it takes, a drafting round of 5 depths is attended at the end of a context, with
sink keys, the way vLLM's drafter attends (causal, grouped-query heads): the check must pass on the
kernel's output over the copy, and fail on the output of a window that left out the sinks and on another
query's output. Where it passes one of those, the row names the depths and gives how far the sink mass
it then reports is from the truth (the mean over query heads, and the worst head). Each row also gives
the time of the check alone for one round (the kernel's output computed beforehand).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from eagle_probe.attention import TOLERANCE, Budget, KeyCopy  # noqa: E402

# heads, kv heads, head size: the two drafters', and the first with the second's head size alone
SHAPES = {"SmolLM2-135M drafter": (9, 3, 64), "SmolLM2 heads, head size 128": (9, 3, 128),
          "Llama-3.1-8B drafter": (32, 8, 128)}
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
    # (case, depth, error of the head mean, error of the worst head) of each wrong output the check passed
    missed = [("window", d + 1, sink(m), max(m.sink)) for d, m in enumerate(window) if not isinstance(m, str)]
    missed += [("other query", d + 1, abs(sink(m) - sink(t)), max(abs(a - b) for a, b in zip(m.sink, t.sink)))
               for d, (m, t) in enumerate(zip(other, truth)) if not isinstance(m, str) and not isinstance(t, str)]
    output = attend(kernel, queries, keys, values)
    sync()
    begin = time.perf_counter()
    for _ in range(ROUNDS):
        check(queries, output)
    sync()
    passed = [m for m in right if not isinstance(m, str)]
    return {"passed": len(passed), "window_caught": sum(isinstance(m, str) for m in window),
            "other_caught": sum(isinstance(m, str) for m in other), "depths": DEPTHS,
            "sink_mass": sum(sink(m) for m in passed) / max(1, len(passed)), "missed": missed,
            "missed_sink_error": max((e for *_, e, _ in missed), default=0.0),
            "missed_worst_head_error": max((e for *_, e in missed), default=0.0),
            "check_ms_per_round": (time.perf_counter() - begin) / ROUNDS * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    warnings.filterwarnings("ignore", message=".*kernel not used|.*does not support|.*runtime disabled")
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                            text=True).stdout.strip() if DEVICE == "cuda" else ""
    print(f"{device} (driver {driver or '-'}), torch {torch.__version__}; tolerance by dtype: "
          + ", ".join(f"{str(d).split('.')[1]} {t:.1e}" for d, t in TOLERANCE.items()), flush=True)
    rows, skipped = [], set()
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for kernel_name, kernel in KERNELS.items():
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                dtype_name = str(dtype).split(".")[1]
                for length, mass in ((n, m) for n in (1024, 8192, 32768) for m in SINK_MASSES):
                    try:
                        row = case(kernel, dtype, heads, kv_heads, dim, length, mass, seed=length)
                    except RuntimeError:   # a kernel that does not take this dtype here
                        skipped.add(f"{kernel_name} {dtype_name}")
                        continue
                    rows.append(row | {"drafter": name, "kernel": kernel_name, "dtype": dtype_name,
                                       "context": length, "sink_target": mass})
                    for missed in row["missed"]:
                        print(f"{name}, {kernel_name}, {dtype_name}, {length} positions, sink {mass}: the check "
                              f"passed the {missed[0]}'s output at depth {missed[1]} (sink mass off by "
                              f"{missed[2]:.4f} over the heads, {missed[3]:.4f} at the worst head)", flush=True)
    print(table(rows))
    print(f"not run (the kernel takes no such input here): {', '.join(sorted(skipped)) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "driver": driver, "torch": torch.__version__,
                                         "date": time.strftime("%Y-%m-%d"), "sink_tokens": SINKS,
                                         "not_run": sorted(skipped), "rows": rows}, indent=1))


def table(rows: list[dict]) -> str:
    """A row per shape, kernel and dtype, pooling its contexts and sink masses."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["drafter"], row["kernel"], row["dtype"]), []).append(row)
    lines = ["| shape | kernel | dtype | true output passed | window without the sinks refused (2% sink, 30%) "
             "| other query's output refused | sink error where a wrong output passed (head mean, worst head) "
             "| check ms per round, 1k-32k |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for (shape, kernel, dtype), group in groups.items():
        n = sum(r["depths"] for r in group)
        by_sink = lambda mass: (f"{sum(r['window_caught'] for r in group if r['sink_target'] == mass)}/"
                                f"{sum(r['depths'] for r in group if r['sink_target'] == mass)}")
        ms = [r["check_ms_per_round"] for r in group]
        lines.append(f"| {shape} | {kernel} | {dtype} | {sum(r['passed'] for r in group)}/{n} | {by_sink(0.02)}, "
                     f"{by_sink(0.3)} | {sum(r['other_caught'] for r in group)}/{n} | "
                     f"{max(r['missed_sink_error'] for r in group):.4f}, "
                     f"{max(r['missed_worst_head_error'] for r in group):.4f} | {min(ms):.1f}-{max(ms):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
