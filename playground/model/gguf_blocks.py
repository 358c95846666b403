"""The embedded target's projections as its GGUF file stores them: Q4_1 and Q8_0 blocks, not floats.

A decode step reads every weight once, so the bytes read are its time. The file's blocks are a
fifth (Q4_1) and a quarter (Q8_0) of float32's bytes, and our kernels (kernels/rows_linear.cpp)
dequantize them in L1 exactly as gguf's `dequantize` does, the float32 model's own numbers: the
same outputs from fewer bytes. Rows come in the order transformers gives the dequantized model
(q and k un-permuted the way it un-permutes them), so a matrix of blocks stands where its float32
matrix stood.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StoredTensor:
    kind: str            # ggml's type name: "Q4_1", "Q8_0", "F32", ...
    rows: np.ndarray     # [rows, bytes a row], uint8, a view of the file's memory map


# a metadata value's size by its GGUF type code, for the fixed-size ones (strings and arrays are walked)
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def tensor_table(path: Path) -> dict[str, StoredTensor]:
    """A GGUF file's tensors by name, read from its header (format v2/v3: docs/gguf.md in ggml). The
    metadata is stepped over, not parsed: gguf's own reader builds objects for every one of the
    tokenizer's 98,000 strings (2.4 s here, this 0.05 s), and the target loaded in 5.9 s with it."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, mode="r")
    header = bytes(data[:24])
    if len(header) < 24 or header[:4] != b"GGUF" or struct.unpack_from("<I", header, 4)[0] < 2:
        raise ValueError(f"{path} is not a GGUF file of version 2 or later")
    n_tensors, n_values = struct.unpack_from("<QQ", header, 8)
    at, alignment = 24, 32

    def unpack(fmt: str):
        nonlocal at
        values = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return values

    def string() -> str:
        nonlocal at
        (length,) = unpack("<Q")
        at += length
        return bytes(data[at - length:at]).decode()

    def skip(kind: int, count: int = 1) -> None:
        nonlocal at
        if kind in _FIXED_SIZES:
            at += _FIXED_SIZES[kind] * count
        elif kind == _STRING:
            for _ in range(count):
                (length,) = unpack("<Q")   # before the sum: `at += unpack(...)` would add to at's old value
                at += length
        elif kind == _ARRAY:
            for _ in range(count):
                item_kind, items = unpack("<IQ")
                skip(item_kind, items)
        else:
            raise ValueError(f"{path}: unknown metadata type {kind}")

    for _ in range(n_values):
        key = string()
        (kind,) = unpack("<I")
        if key == "general.alignment" and kind == 4:
            (alignment,) = unpack("<I")
            if alignment == 0:
                raise ValueError(f"{path}: general.alignment is 0")
        else:
            skip(kind)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = unpack("<I")
        dims = unpack(f"<{n_dims}Q")
        kind, offset = unpack("<IQ")
        infos.append((name, dims, GGMLQuantizationType(kind), offset))
    start = -(-at // alignment) * alignment
    table = {}
    for name, dims, kind, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        row_bytes = dims[0] // block * block_bytes
        rows = int(np.prod(dims[1:], dtype=np.int64))
        begin = start + offset
        table[name] = StoredTensor(kind.name, data[begin:begin + rows * row_bytes].reshape(rows, row_bytes))
    return table


class GGUFBlocks:
    """The block matrices of a GGUF file, by tensor name, read once from its memory map."""

    def __init__(self, path: Path, num_heads: int, num_kv_heads: int):
        self.tensors = tensor_table(path)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads

    def matrix(self, name: str) -> torch.Tensor:
        """The tensor's blocks, [rows, bytes a row], in transformers' row order; a copy in memory."""
        tensor = self.tensors[name]
        if tensor.kind not in BLOCK_DTYPES:
            raise ValueError(f"{name} is {tensor.kind}: our kernels read {' and '.join(BLOCK_DTYPES)} blocks")
        rows = tensor.rows
        if ".attn_q." in name:
            rows = _unpermuted(rows, self.num_heads)
        elif ".attn_k." in name:
            rows = _unpermuted(rows, self.num_kv_heads)
        return torch.from_numpy(np.array(rows, copy=True, order="C")).view(BLOCK_DTYPES[tensor.kind])

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's projections: q, k, v, o, gate, up, down."""
        names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
                 "down": "ffn_down"}
        return {short: self.matrix(f"blk.{i}.{name}.weight") for short, name in names.items()}

    def head(self) -> torch.Tensor:
        """The output head: its own tensor, or the token embedding where the file ties them."""
        return self.matrix("output.weight" if "output.weight" in self.tensors else "token_embd.weight")
