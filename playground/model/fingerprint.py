"""Checkpoint fingerprints: whether two checkpoints hold the same configuration and tensors.

A fingerprint hashes the config (less what does not change the model: dtype and version notes)
and every tensor's name, dtype, shape and bytes, so a folder and the weights held in memory can
be compared. Folders are hashed once per process (keyed by path, size and modification time).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

import torch

COSMETIC_KEYS = frozenset({"torch_dtype", "dtype", "transformers_version", "_name_or_path"})
_folders: dict[tuple, str] = {}


def fingerprint(config: Mapping, tensors: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({k: v for k, v in config.items() if k not in COSMETIC_KEYS}, sort_keys=True).encode())
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def folder_fingerprint(folder: str | Path, config: Mapping | None = None) -> str | None:
    """The fingerprint of a local checkpoint folder (config.json, or `config` as read from it, and
    *.safetensors); None when the path is not such a folder on this machine."""
    from safetensors import safe_open

    path = Path(folder)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files or not (path / "config.json").is_file():
        return None
    key = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in [path / "config.json", *files])
    key += (json.dumps(config, sort_keys=True),)
    if key not in _folders:
        opened = [safe_open(str(f), "pt") for f in files]
        tensors = _Lazy({name: handle for handle in opened for name in handle.keys()})
        config = json.loads((path / "config.json").read_text()) if config is None else config
        _folders[key] = fingerprint(config, tensors)
    return _folders[key]


class _Lazy(Mapping):
    """Tensors read from their file one at a time (a target's weights are not all held at once)."""

    def __init__(self, handles: dict):
        self.handles = handles

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.handles[name].get_tensor(name)

    def __iter__(self):
        return iter(self.handles)

    def __len__(self) -> int:
        return len(self.handles)
