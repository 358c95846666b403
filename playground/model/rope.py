"""Rotary position embedding, Llama's rotate-half convention (shared by target and drafter)."""

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """cos/sin broadcast against q and k [.., T, head_dim]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
