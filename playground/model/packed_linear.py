"""Bias-free linear layers for the CPU decode path.

A decode or verify forward multiplies a handful of rows by every weight matrix once, so its time
is the time to read the weights. For so few rows PyTorch's default CPU path (MKL gemv or a small
sgemm) reads them on one core at about a third of this machine's memory bandwidth. In float32 our
own kernel (kernels/rows_linear.cpp) reads them on every core near the memory's speed (and hands
prompts, many rows, to oneDNN's gemm); where our kernels do not run, oneDNN's linear does, with the
weight reordered into its blocked layout for a few rows. Projections of the same input (q, k, v;
gate, up) pack into one matrix: fewer and larger calls. A float32 weight whose every value is a
bfloat16 (the drafters, saved in bfloat16) is kept as one: our kernel widens it exactly. Elsewhere
(CUDA, other dtypes) a PackedLinear is plain F.linear. Without our kernels, drafters run in bf16
where oneDNN has it natively (drafting_dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from playground.model.kernels import ops

# the row count oneDNN lays the weights out for; any count runs, 1-16 rows all about as fast
LAYOUT_ROWS = 8


def _onednn_runs_on(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


def _onednn_packs(weight: torch.Tensor) -> bool:
    # bf16 only where oneDNN has a bf16 path: on an AVX2-only CPU its reorder raises for bf16 weights
    return (_onednn_runs_on(weight.device)
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and (weight.dtype == torch.float32
                 or weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def _rows_kernel_runs(weight: torch.Tensor, ours: bool) -> bool:
    return ours and weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.shape[1] % 8 == 0


class PackedLinear(nn.Module):
    """x @ cat(weights).T for inference; `split` gives one output per weight. `kernels`: whether our
    kernels may run it (the caller's choice, made once: kernels.status().loaded where they run here)."""

    def __init__(self, *weights: torch.Tensor, kernels: bool):
        super().__init__()
        weight = torch.cat([w.detach() for w in weights])
        self.split_sizes = [w.shape[0] for w in weights]
        self.out_features, self.in_features = weight.shape
        self.rows_kernel = _rows_kernel_runs(weight, kernels)
        self.onednn = not self.rows_kernel and _onednn_packs(weight)
        # a plain attribute: an opaque oneDNN tensor is neither a parameter nor movable by .to()
        if self.onednn:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_ROWS)
        elif self.rows_kernel and torch.equal(weight, weight.bfloat16().float()):
            self.weight = weight.bfloat16()  # every value a bfloat16 (a drafter saved so): half the bytes, same products
        else:
            self.weight = weight.contiguous()

    @classmethod
    def of_blocks(cls, *blocks: torch.Tensor, in_features: int) -> "PackedLinear":
        """x @ w.T over the GGUF blocks of each w (gguf_blocks.py), packed like weights: our kernels read them."""
        linear = cls.__new__(cls)
        nn.Module.__init__(linear)
        linear.weight = torch.cat(blocks).contiguous()
        linear.split_sizes = [b.shape[0] for b in blocks]
        linear.out_features, linear.in_features = linear.weight.shape[0], in_features
        linear.rows_kernel, linear.onednn = True, False
        return linear

    @property
    def nbytes(self) -> int:
        """What one forward reads of the weight."""
        if self.weight.dtype in (torch.uint8, torch.int8):
            return self.weight.numel()
        return self.out_features * self.in_features * self.weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows_kernel:
            return ops.rows_linear(x, self.weight)
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return F.linear(x, self.weight)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self(x).split(self.split_sizes, dim=-1)


def drafting_dtype(target_dtype: torch.dtype, device: torch.device, kernels: bool) -> torch.dtype:
    """The target's dtype where our kernels run, else bfloat16 on a CPU whose oneDNN runs it natively
    (AVX512-BF16/AMX), else the target's dtype.

    A draft step reads the drafter's weights like a decode step reads the target's, so half the
    bytes is close to half the time. Our kernels already read the drafter's bfloat16 weights as they
    were saved, and they run a draft step (a greedy chain's every depth) in one call, which a
    bfloat16 drafter op by op on oneDNN cannot. The drafter was trained under bf16 autocast, and
    drafts only propose: their precision cannot change what the target emits.
    """
    if kernels and device.type == "cpu" and target_dtype == torch.float32:
        return target_dtype
    native = _onednn_runs_on(device) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.bfloat16 if native and target_dtype == torch.float32 else target_dtype


def pack_linears(module: nn.Module, kernels: bool) -> nn.Module:
    """Replace every bias-free nn.Linear inside module by a PackedLinear, in place (inference only)."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(module, name, PackedLinear(child.weight, kernels=kernels))
        else:
            pack_linears(child, kernels)
    return module
