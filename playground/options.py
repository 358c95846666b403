"""Command-line options that the CLI and app.py share."""

from __future__ import annotations

import argparse

from playground.model.variants import NAMES


def add_vllm_options(p: argparse.ArgumentParser, default=lambda value: value) -> None:
    """The backend choice and the vLLM servers' options (`default` wraps each default value)."""
    p.add_argument("--backend", default=default("reference"), choices=["reference", "vllm"],
                   help="reference: the embedded PyTorch engine; vllm: vLLM servers (see --vllm-url, --launch)")
    p.add_argument("--vllm-url", action="append", default=default([]), metavar="NAME=URL",
                   help=f"a running vLLM server for drafter NAME ({', '.join(NAMES)}); repeatable")
    p.add_argument("--launch", action="store_true", default=default(False),
                   help="start the vLLM servers (with .venv-vllm, see scripts/setup-vllm.sh) and stop them on exit")
