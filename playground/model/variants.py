"""The drafter names everything else uses: the two shipped variants, `none` (no speculation), the
rule any other name follows (vLLM servers are named freely), and where the shipped checkpoints live
(PLAYGROUND_DRAFTERS names another folder holding `eagle3/` and `eagle3.1/`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

EAGLE3, EAGLE31, NONE = "eagle3", "eagle3.1", "none"
SHIPPED = {EAGLE3: False, EAGLE31: True}   # shipped name -> EAGLE 3.1 switches on
NAMES = (EAGLE3, EAGLE31, NONE)
LABELS = {EAGLE31: "EAGLE 3.1", EAGLE3: "EAGLE 3", NONE: "no speculation"}
ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafters"
SEPARATOR = " · "   # a run that drafts otherwise than its drafter's default is named "<drafter> · <how>"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,39}")   # also a file name: logs and exports are named by it


def bad_name(name: str) -> str | None:
    """Why `name` cannot name a server or a run (None: it can)."""
    if NAME.fullmatch(name):
        return None
    return (f"the name {name!r} is not allowed: up to 40 letters, digits and . _ + -, beginning with a letter "
            "or a digit")


def run_name(drafter: str, how: str = "") -> str:
    return drafter + SEPARATOR + how if how else drafter


def shipped_path(name: str) -> Path:
    return Path(os.environ.get("PLAYGROUND_DRAFTERS") or ASSETS) / name
