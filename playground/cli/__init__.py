"""Command line: `python -m playground generate | convert | train data|drafter|validate|eval|ship |
bench [prompts|ui|vllm|trees|rejection|draft-stop|chunked-prefill|profile|kernels|k-choice|memory|probe] | watch | diff`.

    python -m playground generate --prompt "Write a haiku about the sea." --drafter eagle3.1 --k 5
    python -m playground generate --prompt "Hi" --json          # one JSON object per verify step
    python -m playground convert --out ./smollm2-135m-instruct  # the embedded target as safetensors

One module per command family (`answers`: generate and convert; `train`; `bench`; `watch`; `diff`), each
adding its parsers and the functions they run (`set_defaults(func=...)`); those functions turn the
options into the owning module's call and print what it returns. The modules that run a
subcommand are imported inside its function, so `--help` loads only what the options' defaults need.
"""

from __future__ import annotations

import argparse
import os
import sys

from playground.cli import answers, bench, diff, train, watch
from playground.errors import PlaygroundError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m playground", description="EAGLE 3.1 playground")
    sub = parser.add_subparsers(dest="command", required=True)
    answers.add_parsers(sub)
    train.add_parsers(sub)
    bench.add_parsers(sub)
    watch.add_parsers(sub)
    diff.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        return args.func(args)
    except PlaygroundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
