"""`generate` (one answer, streamed or as JSON lines) and `convert` (the embedded target or a drafter
as files vLLM serves)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from playground.errors import PlaygroundError
from playground.model.variants import EAGLE31, NAMES, NONE, SHIPPED
from playground.options import (add_draft_stop_option, add_tree_options, add_vllm_options, add_weights_option,
                                draft_stop, k_or_auto, launch_spec, tree_shape)
from playground.terminal import to_stderr


def add_parsers(sub) -> None:
    _add_generate(sub)
    _add_convert(sub)


def _add_generate(sub) -> None:
    from playground.engines.chat import TEMPLATES
    from playground.engines.request import DEFAULT_MAX_TOKENS

    p = sub.add_parser("generate", help="stream one answer with speculative decoding")
    p.add_argument("--prompt", required=True, help="the user message (the chat template is applied)")
    p.add_argument("--system", default=None, help="system prompt (default: the model's own)")
    p.add_argument("--template", default="model", choices=list(TEMPLATES), help="prompt format")
    p.add_argument("--drafter", default=EAGLE31, help=f"{' | '.join(NAMES)} | a checkpoint folder; on vLLM, the "
                                                        "name of a server (--vllm-url NAME=URL, --vllm-drafter)")
    p.add_argument("--k", type=k_or_auto, default=5,
                   help="draft tokens per step (1..10), or auto: the k this host's measured costs and the drafter's "
                        "stored acceptance expect to be fastest (the embedded engine's chains; none where plain "
                        "decoding is)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32 is bit-exact greedy; bfloat16 is faster where supported, not bit-exact")
    p.add_argument("--target", default=None, help="a local transformers Llama-family folder (default: embedded SmolLM2)")
    add_weights_option(p)
    p.add_argument("--json", action="store_true", help="JSON lines: one per verify step, then a summary")
    add_tree_options(p)
    add_draft_stop_option(p)
    add_vllm_options(p)
    p.set_defaults(func=generate)


def generate(args: argparse.Namespace) -> int:
    from playground import terminal
    from playground.engines.reference import ReferenceEngine
    from playground.engines.request import GenerationRequest
    from playground.engines.stats import summarize

    auto = args.k == "auto"
    if auto and args.backend == "vllm":
        raise PlaygroundError("--k auto chooses a chain's k on the embedded engine: not with --backend vllm")
    request = GenerationRequest(prompt=args.prompt, system=args.system, template=args.template,
                                drafter=args.drafter, k=5 if auto else args.k, temperature=args.temperature,
                                top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed,
                                tree=tree_shape(args), draft_stop=draft_stop(args)).validate()
    engine = ReferenceEngine.load(args.target, args.dtype, weights=args.weights)
    k_choice = None
    if auto:
        from playground.evaluation import k_choice as choosing

        request, k_choice = choosing.chosen(engine, request)
        if k_choice is not None:
            print(f"note: --k auto chose {k_choice.reason}", file=sys.stderr)
    if args.backend == "vllm":
        from playground.engines.vllm.backend import vllm_backend
        from playground.engines.vllm.client import chains_only

        chains_only(request)   # before any server starts
        engine, _ = vllm_backend(engine, args.vllm_url, launch_spec(args, args.k), names=(request.drafter,),
                                 status=to_stderr, api_key=args.vllm_api_key)
    info = engine.drafter_info(request.drafter)
    if info.variant != NONE and not info.trained:
        print(f"note: {info.name} is a randomly initialised drafter ({info.source}); "
              "no trained checkpoint is shipped, so few drafts will be accepted", file=sys.stderr)
    if info.variant != NONE and engine.limitations(request.drafter):
        print(f"note: {engine.limitations(request.drafter)}", file=sys.stderr)
    if args.json:
        events = []
        for event in engine.generate(request):
            events.append(event)
            print(json.dumps(event.to_json()), flush=True)
        summary = summarize(events).to_json()
        if k_choice is not None:
            summary["k_choice"] = k_choice.to_json()
        print(json.dumps({"summary": summary}), flush=True)
    else:
        color = sys.stdout.isatty()
        print(terminal.legend(color), file=sys.stderr)
        events = terminal.stream(engine.generate(request), sys.stdout, color)
        print(terminal.render_summary(summarize(events)), file=sys.stderr)
    if events and events[-1].note:
        print(f"note: {events[-1].note}", file=sys.stderr)
    return 0


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="write the embedded target as a safetensors folder (vLLM serves it), "
                                       "or a drafter in the speculators format")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--speculators", metavar="DRAFTER", default=None,
                   help=f"write this drafter ({' | '.join(SHIPPED)} | a checkpoint folder) in the `speculators` "
                        "format instead (same weights; vLLM loads both)")
    p.add_argument("--k", type=int, default=5, help="with --speculators: the draft tokens per step it proposes")
    p.set_defaults(func=convert)


def convert(args: argparse.Namespace) -> int:
    import shutil

    from playground.model.target import embedded_target_folder

    if args.speculators:
        from playground.model.drafter import save_speculators
        from playground.model.variants import shipped_path

        source = shipped_path(args.speculators) if args.speculators in SHIPPED else Path(args.speculators)
        save_speculators(source, args.out, verifier=str(embedded_target_folder()), k=args.k)
    else:
        shutil.copytree(embedded_target_folder(), args.out, dirs_exist_ok=True)
    print(f"wrote {args.out}")
    return 0
