"""Drafter names -> drafters: the shipped EAGLE 3 / EAGLE 3.1 checkpoints, `none`, or a folder.

A shipped name whose checkpoint is missing resolves to a seeded random drafter with the same
switches, and says so: the engine still runs (losslessly), it just accepts almost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from playground.errors import PlaygroundError
from playground.model.drafter import DrafterConfig, Eagle3Drafter, load_drafter
from playground.model.variants import NAMES, NONE, SHIPPED, shipped_path

RANDOM_SEED = 0
RANDOM_DRAFT_VOCAB = 8192


def random_drafter(target, eagle31: bool) -> Eagle3Drafter:
    """The seeded random drafter a shipped name falls back to when its checkpoint is missing (float32)."""
    config = DrafterConfig.for_target(target.config, RANDOM_DRAFT_VOCAB, target.aux_layers, eagle31)
    return Eagle3Drafter(config).init_random(RANDOM_SEED).eval().requires_grad_(False)


@dataclass(frozen=True)
class DrafterInfo:
    name: str
    variant: str          # eagle3 | eagle3.1 | none
    source: str           # checkpoint folder, or "random (seed 0)"
    trained: bool


class DrafterStore:
    """Loads each drafter once per target and checks it fits the target."""

    def __init__(self, target, dtype: torch.dtype):
        self.target = target
        self.dtype = dtype
        self._loaded: dict[str, tuple[Eagle3Drafter | None, DrafterInfo]] = {}

    def get(self, name: str) -> tuple[Eagle3Drafter | None, DrafterInfo]:
        if name not in self._loaded:
            self._loaded[name] = self._load(name)
        return self._loaded[name]

    def _load(self, name: str) -> tuple[Eagle3Drafter | None, DrafterInfo]:
        if name == NONE:
            return None, DrafterInfo(NONE, NONE, "", trained=False)
        if name in SHIPPED:
            path = shipped_path(name)
            if (path / "model.safetensors").exists():
                drafter = load_drafter(path, self.dtype)
                info = DrafterInfo(name, drafter.config.variant, str(path), trained=True)
            else:
                drafter = random_drafter(self.target, SHIPPED[name]).to(self.dtype)
                info = DrafterInfo(name, drafter.config.variant, f"random (seed {RANDOM_SEED})", trained=False)
        else:
            path = Path(name)
            if not path.is_dir():
                raise PlaygroundError(f"unknown drafter {name!r}: use {', '.join(NAMES)} "
                                      "or a checkpoint folder")
            drafter = load_drafter(path, self.dtype)
            info = DrafterInfo(path.name, drafter.config.variant, str(path), trained=True)
        self._check_fits(drafter, name)
        return drafter.pack(self.target.kernels), info

    def _check_fits(self, drafter: Eagle3Drafter, name: str) -> None:
        c, t = drafter.config, self.target
        if c.target_hidden_size != t.hidden_size or c.vocab_size != t.config.vocab_size:
            raise PlaygroundError(f"drafter {name!r} was built for another target "
                                  f"(hidden {c.target_hidden_size}, vocab {c.vocab_size})")
        if tuple(c.aux_layer_ids) != tuple(t.aux_layers):
            raise PlaygroundError(f"drafter {name!r} reads target layers {list(c.aux_layer_ids)}; "
                                  f"this target provides {list(t.aux_layers)}")
