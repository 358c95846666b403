"""Command-line options that the CLI and app.py share."""

from __future__ import annotations

import argparse
import os
import shlex

from playground.model.variants import SHIPPED
from playground.model.weight_formats import WEIGHTS, WEIGHTS_ENV, default_weights


def add_vllm_options(p: argparse.ArgumentParser, default=lambda value: value, choose_backend: bool = True) -> None:
    """The backend choice (unless the command always runs on vLLM) and the vLLM servers' options
    (`default` wraps each default value)."""
    if choose_backend:
        p.add_argument("--backend", default=default("reference"), choices=["reference", "vllm"],
                       help="reference: the embedded PyTorch engine; vllm: vLLM servers (see --vllm-url, --launch)")
    p.add_argument("--vllm-url", action="append", default=default([]), metavar="NAME=URL",
                   help="a running vLLM server, serving any model with any speculative method, under any NAME (none: "
                        "the baseline without speculation; eagle3, eagle3.1: servers of those drafters); repeatable")
    p.add_argument("--launch", action="store_true", default=default(False),
                   help="start the vLLM servers (with .venv-vllm, see scripts/setup-vllm.sh) and stop them on exit")
    p.add_argument("--vllm-model", default=default(None), metavar="FOLDER_OR_HUB_ID",
                   help="with --launch: the target to serve (default: the embedded SmolLM2 with the shipped drafters)")
    p.add_argument("--vllm-drafter", action="append", default=default([]), metavar="NAME=SOURCE[:k=N][:lookup=MIN-MAX]",
                   help="with --launch: a server NAME to start beside the shipped two (or instead of one of them), "
                        "SOURCE being an EAGLE-3 or EAGLE 3.1 drafter's folder or hub id (plain or speculators "
                        f"format), {' or '.join(SHIPPED)} (the shipped drafters), ngram (prompt lookup) or none (no "
                        "speculation); :k=N its drafts per step, :lookup=MIN-MAX the n-gram sizes; repeatable")
    p.add_argument("--vllm-k", type=int, default=default(None),
                   help="with --launch: drafts per step of the servers whose entry does not say")
    add_api_key_option(p, default)
    p.add_argument("--vllm-args", default=default(""), metavar="'ARGS'",
                   help="with --launch: more `vllm serve` arguments for every server, as one value, e.g. "
                        "--vllm-args='--tensor-parallel-size 4' (after $PLAYGROUND_VLLM_ARGS)")


def k_or_auto(value: str) -> int | str:
    """--k: a whole number, or "auto"."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k must be a whole number or auto, got {value!r}") from None


def add_weights_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default=default_weights(), choices=WEIGHTS,
                   help=f"the embedded target's projections: f32 matrices, or the GGUF's own Q4_1/Q8_0 blocks read by "
                        f"our CPU kernels (the same tokens, a fifth of the bytes); auto: gguf where it runs; default "
                        f"${WEIGHTS_ENV}, else auto")


def add_api_key_option(p: argparse.ArgumentParser, default=lambda value: value) -> None:
    from playground.engines.vllm.api import API_KEY_ENV

    p.add_argument("--vllm-api-key", default=default(os.environ.get(API_KEY_ENV) or None), metavar="KEY",
                   help=f"the vLLM servers' --api-key, sent to every one of them (default: ${API_KEY_ENV}); with "
                        "--launch the servers start with it")


def add_tree_options(p: argparse.ArgumentParser) -> None:
    from playground.engines.tree import TreeShape

    p.add_argument("--tree", action="store_true",
                   help="draft a tree (EAGLE-2 dynamic trees, the embedded engine) instead of a chain of k")
    p.add_argument("--tree-top-k", type=int, default=TreeShape.top_k, help="children per node, nodes expanded per depth")
    p.add_argument("--tree-depth", type=int, default=TreeShape.depth, help="levels of drafts")
    p.add_argument("--tree-nodes", type=int, default=TreeShape.nodes, help="drafts the target verifies per step")


def add_draft_stop_option(p: argparse.ArgumentParser) -> None:
    from playground.engines.draft_stop import SIGNALS

    p.add_argument("--draft-stop", default=None, metavar="RULE",
                   help="end a chain at the first draft that meets RULE, e.g. 'probability<0.3' or "
                        f"'self_attention>0.4' (comma: any of several; signals: {', '.join(SIGNALS)}); k is then "
                        "the longest chain (the embedded engine)")


def draft_stop(args: argparse.Namespace):
    """The request's DraftStop, or None."""
    from playground.engines.draft_stop import DraftStop

    return DraftStop.parse(args.draft_stop) if args.draft_stop else None


def tree_shape(args: argparse.Namespace):
    """The request's TreeShape, or None for chains."""
    from playground.engines.tree import TreeShape

    return TreeShape(args.tree_top_k, args.tree_depth, args.tree_nodes) if args.tree else None


def launch_spec(args: argparse.Namespace, k: int):
    """The servers to start (engines.vllm.backend.LaunchSpec), or None without --launch."""
    from playground.engines.vllm.backend import LaunchSpec

    if not args.launch:
        return None
    return LaunchSpec(model=args.vllm_model, drafters=tuple(args.vllm_drafter), k=args.vllm_k or k,
                      server_args=tuple(shlex.split(args.vllm_args)))
