"""The embedded target's projections as its GGUF file stores them: Q4_1 and Q8_0 blocks, not floats.

A decode step reads every weight once, so the bytes read are its time. The file's blocks are a
fifth (Q4_1) and a quarter (Q8_0) of float32's bytes, and our kernels (kernels/rows_linear.cpp)
dequantize them in L1 exactly as gguf's `dequantize` does, the float32 model's own numbers: the
same outputs from fewer bytes. Rows come in the order transformers gives the dequantized model
(q and k un-permuted the way it un-permutes them), so a matrix of blocks stands where its float32
matrix stood.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# ggml's block types our kernels read, as the torch dtype that carries their bytes
BLOCK_DTYPES = {"Q4_1": torch.uint8, "Q8_0": torch.int8}


def _unpermuted(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves the halves of each q/k head's rows for its RoPE; transformers
    (modeling_gguf_pytorch_utils: _reverse_permute_weights) puts them back. Rows of blocks move alike."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, -1).swapaxes(2, 1).reshape(rows.shape)


class GGUFBlocks:
    """The block matrices of a GGUF file, by tensor name, read once from its memory map."""

    def __init__(self, path: Path, num_heads: int, num_kv_heads: int):
        from gguf import GGUFReader

        self.tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads

    def matrix(self, name: str) -> torch.Tensor:
        """The tensor's blocks, [rows, bytes a row], in transformers' row order; a copy in memory."""
        tensor = self.tensors[name]
        kind = tensor.tensor_type.name
        if kind not in BLOCK_DTYPES:
            raise ValueError(f"{name} is {kind}: our kernels read {' and '.join(BLOCK_DTYPES)} blocks")
        rows = np.asarray(tensor.data)
        if ".attn_q." in name:
            rows = _unpermuted(rows, self.num_heads)
        elif ".attn_k." in name:
            rows = _unpermuted(rows, self.num_kv_heads)
        return torch.from_numpy(np.array(rows, copy=True, order="C")).view(BLOCK_DTYPES[kind])

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's projections: q, k, v, o, gate, up, down."""
        names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
                 "down": "ffn_down"}
        return {short: self.matrix(f"blk.{i}.{name}.weight") for short, name in names.items()}

    def head(self) -> torch.Tensor:
        """The output head: its own tensor, or the token embedding where the file ties them."""
        return self.matrix("output.weight" if "output.weight" in self.tensors else "token_embd.weight")
