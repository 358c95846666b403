"""Bias-free linear layers packed for oneDNN: the CPU decode path.

A decode or verify forward multiplies a handful of rows by every weight matrix once, so its time
is the time to read the weights. For so few rows PyTorch's default CPU path (MKL gemv or a small
sgemm) reads them on one core at about a third of this machine's memory bandwidth; oneDNN's
linear on a prepacked weight reads them on every core. Projections of the same input (q, k, v;
gate, up) pack into one matrix: fewer and larger calls. Where oneDNN cannot run (CUDA, other
dtypes) a PackedLinear is plain F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _onednn_packs(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """x @ cat(weights).T for inference; `split` gives one output per weight."""

    def __init__(self, *weights: torch.Tensor):
        super().__init__()
        weight = torch.cat([w.detach() for w in weights])
        self.split_sizes = [w.shape[0] for w in weights]
        self.onednn = _onednn_packs(weight)
        # a plain attribute: an opaque oneDNN tensor is neither a parameter nor movable by .to()
        self.weight = weight.to_mkldnn() if self.onednn else weight
        self.dtype = weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return F.linear(x, self.weight)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self(x).split(self.split_sizes, dim=-1)


def pack_linears(module: nn.Module) -> nn.Module:
    """Replace every bias-free nn.Linear inside module by a PackedLinear, in place (inference only)."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(module, name, PackedLinear(child.weight))
        else:
            pack_linears(child)
    return module
