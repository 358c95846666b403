"""Command line: `python -m playground generate | convert | train data|drafter | bench baseline`.

    python -m playground generate --prompt "Write a haiku about the sea." --drafter eagle3.1 --k 5
    python -m playground generate --prompt "Hi" --json          # one JSON object per verify step
    python -m playground convert --out ./smollm2-135m-instruct  # the embedded target as safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from playground.errors import PlaygroundError


@dataclass(frozen=True)
class GenerateArgs:
    prompt: str
    system: str | None
    template: str
    drafter: str
    k: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    dtype: str
    target: str | None
    json: bool
    backend: str
    vllm_url: list[str]
    launch: bool


def _add_generate(sub) -> None:
    from playground.chat import TEMPLATES
    from playground.request import DEFAULT_MAX_TOKENS

    p = sub.add_parser("generate", help="stream one answer with speculative decoding")
    p.add_argument("--prompt", required=True, help="the user message (the chat template is applied)")
    p.add_argument("--system", default=None, help="system prompt (default: the model's own)")
    p.add_argument("--template", default="model", choices=list(TEMPLATES), help="prompt format")
    p.add_argument("--drafter", default="eagle3.1", help="eagle3 | eagle3.1 | none | a checkpoint folder")
    p.add_argument("--k", type=int, default=5, help="draft tokens per step (1..10)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32 is bit-exact greedy; bfloat16 is faster where supported, not bit-exact")
    p.add_argument("--target", default=None, help="a local transformers Llama-family folder (default: embedded SmolLM2)")
    p.add_argument("--json", action="store_true", help="JSON lines: one per verify step, then a summary")
    add_vllm_options(p)


def add_vllm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="reference", choices=["reference", "vllm"],
                   help="reference: the embedded PyTorch engine; vllm: vLLM servers (see --vllm-url, --launch)")
    p.add_argument("--vllm-url", action="append", default=[], metavar="NAME=URL",
                   help="a running vLLM server for drafter NAME (eagle3, eagle3.1, none); repeatable")
    p.add_argument("--launch", action="store_true",
                   help="start the vLLM servers (with .venv-vllm, see scripts/setup-vllm.sh) and stop them on exit")


def generate(args: GenerateArgs) -> int:
    from playground.engines.reference import ReferenceEngine
    from playground.request import GenerationRequest
    from playground.stats import summarize
    from playground import terminal

    request = GenerationRequest(prompt=args.prompt, system=args.system, template=args.template,
                                drafter=args.drafter, k=args.k, temperature=args.temperature,
                                top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed).validate()
    engine = ReferenceEngine.load(args.target, args.dtype)
    if args.backend == "vllm":
        from playground.engines.backends import vllm_backend

        engine, _ = vllm_backend(engine, args.vllm_url, args.launch, args.k, names=(request.drafter,),
                                 status=lambda line: print(line, file=sys.stderr))
    info = engine.drafter_info(request.drafter)
    if info.variant != "none" and not info.trained:
        print(f"note: {info.name} is a randomly initialised drafter ({info.source}); "
              "no trained checkpoint is shipped, so few drafts will be accepted", file=sys.stderr)
    if args.json:
        events = []
        for event in engine.generate(request):
            events.append(event)
            print(json.dumps(event.to_json()), flush=True)
        print(json.dumps({"summary": summarize(events).to_json()}), flush=True)
    else:
        color = sys.stdout.isatty()
        print(terminal.legend(color), file=sys.stderr)
        events = terminal.stream(engine.generate(request), sys.stdout, color)
        print(terminal.render_summary(summarize(events)), file=sys.stderr)
    return 0


def convert(out: Path) -> int:
    import shutil

    from playground.target import embedded_target_folder

    shutil.copytree(embedded_target_folder(), out, dirs_exist_ok=True)
    print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m playground", description="EAGLE 3.1 playground")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    p = sub.add_parser("convert", help="write the embedded target as a safetensors folder (vLLM serves it)")
    p.add_argument("--out", type=Path, required=True)
    _add_train(sub)
    _add_bench(sub)
    return parser


def _add_train(sub) -> None:
    from playground.eagle.data import DataConfig

    train = sub.add_parser("train", help="build drafters: data, drafter, eval").add_subparsers(dest="stage", required=True)
    p = train.add_parser("data", help="self-distillation data from the embedded target")
    p.add_argument("--out", type=Path, default=Path("data/train"))
    p.add_argument("--prompts", type=int, default=DataConfig.prompts)
    p.add_argument("--batch", type=int, default=DataConfig.batch)
    p.add_argument("--max-new-tokens", type=int, default=DataConfig.max_new_tokens)
    p.add_argument("--temperature", type=float, default=DataConfig.temperature)
    p.add_argument("--seed", type=int, default=DataConfig.seed)

    from playground.eagle.train import TrainConfig

    p = train.add_parser("drafter", help="training-time-test training of one drafter variant")
    p.add_argument("--variant", required=True, choices=["eagle3", "eagle3.1"])
    p.add_argument("--data", type=Path, default=Path("data/train"))
    p.add_argument("--out", type=Path, required=True)
    for name in ("steps", "batch", "max_len", "warmup", "ttt_steps", "draft_vocab", "seed", "save_every"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(TrainConfig, name))
    for name in ("lr", "decay"):
        p.add_argument(f"--{name}", type=float, default=getattr(TrainConfig, name))
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=TrainConfig.bf16,
                   help="bf16 autocast for the drafter (default on)")

    p = train.add_parser("eval", help="tau and per-position acceptance on held-out chat, code, long-context "
                                      "and perturbed-format prompts")
    p.add_argument("--drafters", nargs="+", default=["eagle3", "eagle3.1"],
                   help="drafter names or checkpoint folders (default: the shipped two)")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--kinds", nargs="+", default=None, choices=["chat", "code", "long-context", "perturbed"],
                   help="a subset of the prompt kinds (default: all four)")


def _add_bench(sub) -> None:
    from playground.bench import BaselineConfig

    bench = sub.add_parser("bench", help="speed and acceptance benchmarks").add_subparsers(dest="suite", required=True)
    p = bench.add_parser("baseline", help="engine (none / drafters) vs transformers generate, side by side")
    p.add_argument("--max-tokens", type=int, default=BaselineConfig.max_tokens)
    p.add_argument("--repeats", type=int, default=BaselineConfig.repeats)
    p.add_argument("--k", type=int, default=BaselineConfig.k)
    bench.add_parser("ui", help="server-side cost of one page update, by run length")
    p = bench.add_parser("vllm", help="vLLM servers (EAGLE 3.1, EAGLE 3, none): output tokens/s by concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=5)


def bench(args: argparse.Namespace) -> int:
    from playground.bench import (BaselineConfig, VLLMBenchConfig, baseline, format_table, ui_update_cost,
                                  vllm_throughput)

    if args.suite == "vllm":
        rows = vllm_throughput(VLLMBenchConfig(max_tokens=args.max_tokens, k=args.k))
        print("| concurrency | drafter | tokens | seconds | output tokens/s | tau |\n|---:|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['concurrency']} | {r['drafter']} | {r['tokens']} | {r['seconds']:.1f} | "
                  f"{r['tokens_per_s']:.1f} | {r['tau']:.2f} |")
        return 0

    if args.suite == "ui":
        print("| verify steps | text update (ms) | plot update (ms) |\n|---:|---:|---:|")
        for steps, text_ms, plot_ms in ui_update_cost():
            print(f"| {steps} | {text_ms:.2f} | {plot_ms:.2f} |")
        return 0

    print(format_table(baseline(BaselineConfig(max_tokens=args.max_tokens, repeats=args.repeats, k=args.k))))
    return 0


def train(args: argparse.Namespace) -> int:
    if args.stage == "eval":
        from playground.eagle.evaluate import KINDS, evaluate, format_rows
        from playground.engines.reference import ReferenceEngine

        flags = dict(zip(["chat", "code", "long-context", "perturbed"], KINDS))
        kinds = [flags[x] for x in args.kinds] if args.kinds else KINDS
        print(format_rows(evaluate(ReferenceEngine.load(), args.drafters, args.k, args.max_tokens, kinds)))
        return 0
    if args.stage == "data":
        from playground.eagle.data import DataConfig, generate as generate_data

        generate_data(DataConfig(out=args.out, prompts=args.prompts, batch=args.batch,
                                 max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed))
        return 0
    from playground.eagle.train import TrainConfig, train as train_drafter

    fields = {k: v for k, v in vars(args).items() if k not in ("command", "stage")}
    print(f"wrote {train_drafter(TrainConfig(**fields))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        if args.command == "generate":
            fields = {k: v for k, v in vars(args).items() if k != "command"}
            return generate(GenerateArgs(**fields))
        if args.command == "train":
            return train(args)
        if args.command == "bench":
            return bench(args)
        return convert(args.out)
    except PlaygroundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
