"""Command line: `python -m playground generate | convert | train data|drafter|lease|validate|eval|ship |
bench [ui|vllm|trees|profile|kernels|memory|probe] | watch`.

    python -m playground generate --prompt "Write a haiku about the sea." --drafter eagle3.1 --k 5
    python -m playground generate --prompt "Hi" --json          # one JSON object per verify step
    python -m playground convert --out ./smollm2-135m-instruct  # the embedded target as safetensors

Each subcommand's parser names the function that runs it (`set_defaults(func=...)`); those
functions turn the options into the owning module's call and print what it returns. The modules
that run a subcommand are imported inside its function, so `--help` loads only what the options'
defaults need.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from playground.errors import PlaygroundError
from playground.model.variants import EAGLE31, NAMES, NONE, SHIPPED
from playground.options import add_api_key_option, add_tree_options, add_vllm_options, launch_spec, tree_shape


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m playground", description="EAGLE 3.1 playground")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_convert(sub)
    _add_train(sub)
    _add_bench(sub)
    _add_watch(sub)
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


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


# generate, convert

def _add_generate(sub) -> None:
    from playground.engines.chat import TEMPLATES
    from playground.engines.request import DEFAULT_MAX_TOKENS

    p = sub.add_parser("generate", help="stream one answer with speculative decoding")
    p.add_argument("--prompt", required=True, help="the user message (the chat template is applied)")
    p.add_argument("--system", default=None, help="system prompt (default: the model's own)")
    p.add_argument("--template", default="model", choices=list(TEMPLATES), help="prompt format")
    p.add_argument("--drafter", default=EAGLE31, help=f"{' | '.join(NAMES)} | a checkpoint folder; on vLLM, the "
                                                        "name of a server (--vllm-url NAME=URL, --vllm-drafter)")
    p.add_argument("--k", type=int, default=5, help="draft tokens per step (1..10)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32 is bit-exact greedy; bfloat16 is faster where supported, not bit-exact")
    p.add_argument("--target", default=None, help="a local transformers Llama-family folder (default: embedded SmolLM2)")
    p.add_argument("--json", action="store_true", help="JSON lines: one per verify step, then a summary")
    add_tree_options(p)
    add_vllm_options(p)
    p.set_defaults(func=generate)


def generate(args: argparse.Namespace) -> int:
    from playground import terminal
    from playground.engines.reference import ReferenceEngine
    from playground.engines.request import GenerationRequest
    from playground.engines.stats import summarize

    request = GenerationRequest(prompt=args.prompt, system=args.system, template=args.template,
                                drafter=args.drafter, k=args.k, temperature=args.temperature,
                                top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed,
                                tree=tree_shape(args)).validate()
    engine = ReferenceEngine.load(args.target, args.dtype)
    if args.backend == "vllm":
        from playground.engines.vllm.backend import vllm_backend
        from playground.engines.vllm.client import chains_only

        chains_only(request)   # before any server starts
        engine, _ = vllm_backend(engine, args.vllm_url, launch_spec(args, args.k), names=(request.drafter,),
                                 status=_to_stderr, api_key=args.vllm_api_key)
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
        print(json.dumps({"summary": summarize(events).to_json()}), flush=True)
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


# train

def _add_train(sub) -> None:
    from playground.training.data import SOURCES, DataConfig

    train = sub.add_parser("train", help="build drafters: data, drafter, validate, eval, ship").add_subparsers(dest="stage", required=True)
    p = train.add_parser("data", help="self-distillation data from the embedded target")
    p.add_argument("--out", type=Path, default=Path("data/train"))
    p.add_argument("--prompts", type=int, default=DataConfig.prompts)
    p.add_argument("--batch", type=int, default=DataConfig.batch)
    p.add_argument("--max-new-tokens", type=int, default=DataConfig.max_new_tokens)
    p.add_argument("--temperature", type=float, default=DataConfig.temperature)
    p.add_argument("--seed", type=int, default=DataConfig.seed)
    p.add_argument("--source", choices=SOURCES, default=DataConfig.source,
                   help="templates: the prompt generator; self: the target writes the user turns itself")
    p.add_argument("--device", default=DataConfig.device, help="where the target runs: cpu or cuda")
    p.add_argument("--slots", type=int, default=DataConfig.slots,
                   help="> 0: decode in this many slots refilled as answers end, one captured step on a GPU "
                        "(--batch then sets the conversations per shard)")
    p.set_defaults(func=train_data)

    from playground.training.train import TrainConfig

    p = train.add_parser("drafter", help="training-time-test training of drafter variants, side by side")
    p.add_argument("--variant", required=True, nargs="+", choices=list(SHIPPED))
    p.add_argument("--data", type=Path, nargs="+", default=[Path("data/train")], help="data folders, pooled")
    p.add_argument("--out", type=Path, nargs="+", required=True, help="one run folder per variant, in order")
    for name in ("steps", "batch", "max_len", "warmup", "ttt_steps", "draft_vocab", "seed", "save_every", "stop_at"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(TrainConfig, name))
    for name in ("lr", "decay"):
        p.add_argument(f"--{name}", type=float, default=getattr(TrainConfig, name))
    p.add_argument("--budget-s", type=float, default=TrainConfig.budget_s,
                   help="save and stop after this many seconds; the same command goes on from there")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=TrainConfig.bf16,
                   help="bf16 autocast for the drafter (default on)")
    p.add_argument("--device", default=TrainConfig.device, help="where the drafter trains: cpu or cuda")
    p.add_argument("--val-data", type=Path, nargs="+", default=[],
                   help="held-out data folders: loss and accuracy by depth at every save (val.jsonl)")
    p.add_argument("--init", nargs="+", default=[], metavar="DRAFTER",
                   help="one trained drafter per variant, in order (shipped name or checkpoint folder): new runs "
                        "start from its weights and draft vocabulary instead of a new drafter (fine-tuning)")
    p.set_defaults(func=train_drafter)

    p = train.add_parser("lease", help="the scale-up inside one GPU lease, a step per command of under 10 "
                                       "minutes: data, train, finish (there), unpack (here)")
    p.add_argument("step", choices=list(LEASE_STEPS))
    p.add_argument("--work", type=Path, default=Path("lease"), help="the lent machine's folder for data and runs")
    p.add_argument("--plan", choices=("gpu", "toy"), default="gpu", help="toy: the same steps at CPU size")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="data and train stop by themselves after about this long; run the step again to go on")
    p.add_argument("--out", type=Path, default=None, help="finish: the folder the archive's parts go to")
    p.add_argument("--parts", type=Path, default=None, help="unpack: the folder holding the parts")
    p.add_argument("--carry", type=Path, default=Path(".lease"),
                   help="pack: the folder (git-ignored) whose carry-NN folders each go with one device call")
    p.add_argument("--carried", type=Path, default=None, help="receive: the carry-NN folder this call brought")
    p.add_argument("--runs", type=Path, default=Path("runs/lease"), help="unpack: where the run folders go")
    p.set_defaults(func=train_lease)

    p = train.add_parser("validate", help="training's loss and accuracy by depth of trained drafters on "
                                          "held-out data folders (teacher-forced)")
    p.add_argument("--drafters", nargs="+", default=list(SHIPPED),
                   help="drafter names or checkpoint folders (default: the shipped two)")
    p.add_argument("--data", type=Path, nargs="+", required=True, help="data folders of train data, pooled")
    p.add_argument("--sequences", type=int, default=256, help="at most this many sequences")
    p.add_argument("--ttt-steps", type=int, default=TrainConfig.ttt_steps, help="unroll depth measured")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=TrainConfig.bf16)
    p.add_argument("--device", default=TrainConfig.device)
    p.set_defaults(func=train_validate)

    p = train.add_parser("ship", help="evaluate trained runs and copy them to assets/drafters with model cards")
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="run folders of train drafter")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=None, help="evaluate on each kind's first N prompts (default: all)")
    p.set_defaults(func=train_ship)

    from playground.evaluation.prompt_sets import EVAL_KINDS

    p = train.add_parser("eval", help="tau and per-position acceptance on held-out chat, code, long-context "
                                      "and perturbed-format prompts")
    p.add_argument("--drafters", nargs="+", default=list(SHIPPED),
                   help="drafter names or checkpoint folders (default: the shipped two)")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--kinds", nargs="+", default=None, choices=list(EVAL_KINDS),
                   help="a subset of the held-out kinds (default: chat, code, long-context, perturbed); 'templates' "
                        "and 'systems': the two halves of 'perturbed' (other chat templates, unusual system "
                        "prompts); 'longer-context': the long-context questions after three documents (~4,400 "
                        "tokens); 'training': six prompts the shipped drafters trained on, to measure how far they "
                        "generalise")
    p.add_argument("--prompts", type=int, default=None, help="only each kind's first N prompts (default: all)")
    add_tree_options(p)
    p.add_argument("--figures", type=Path, default=None,
                   help="also write each kind's acceptance, sink attention and fed-back RMS by depth, for every "
                        "drafter, to this HTML file (plotly, opens offline)")
    p.set_defaults(func=train_eval)


def train_data(args: argparse.Namespace) -> int:
    from playground.training.data import DataConfig, generate as generate_data

    generate_data(DataConfig(out=args.out, prompts=args.prompts, batch=args.batch,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                             source=args.source, device=args.device, slots=args.slots))
    return 0


def train_drafter(args: argparse.Namespace) -> int:
    from playground.training.train import TrainConfig, train

    if len(args.variant) != len(args.out):
        raise PlaygroundError(f"{len(args.variant)} variants but {len(args.out)} run folders: give one --out per variant")
    if args.init and len(args.init) != len(args.variant):
        raise PlaygroundError(f"{len(args.variant)} variants but {len(args.init)} drafters to start from: "
                              "give one --init per variant")
    fields = {k: v for k, v in vars(args).items() if k not in ("command", "stage", "func", "variant", "out", "init")}
    fields["data"], fields["val_data"] = tuple(fields["data"]), tuple(fields["val_data"])
    inits = args.init or [""] * len(args.variant)
    configs = [TrainConfig(variant=variant, out=out, init=init, **fields)
               for variant, out, init in zip(args.variant, args.out, inits)]
    for folder in train(configs):
        print(f"wrote {folder}")
    return 0


def train_validate(args: argparse.Namespace) -> int:
    from playground.training.train import format_validation, validate_drafters

    print(format_validation(validate_drafters(args.drafters, args.data, args.device, args.sequences,
                                              args.ttt_steps, args.bf16)))
    return 0


def train_ship(args: argparse.Namespace) -> int:
    from playground.engines.reference import ReferenceEngine
    from playground.training.ship import ship

    for folder in ship(args.runs, ReferenceEngine.load(), args.max_tokens, prompts=args.prompts):
        print(f"wrote {folder}")
    return 0


def train_eval(args: argparse.Namespace) -> int:
    from playground.engines.reference import ReferenceEngine
    from playground.evaluation.heldout import evaluate, format_ratios, format_rows, write_figures
    from playground.evaluation.prompt_sets import EVAL_KINDS, KINDS
    from playground.training.prompts import heldout_or_training_requests

    kinds = [EVAL_KINDS[x] for x in args.kinds] if args.kinds else KINDS
    rows = evaluate(ReferenceEngine.load(), args.drafters, args.k, args.max_tokens, kinds, args.prompts,
                    heldout_or_training_requests, tree=tree_shape(args))
    print(format_rows(rows))
    if len(args.drafters) > 1 or args.tree:
        print("\n" + format_ratios(rows))
    if args.figures:
        write_figures(rows, args.figures)
        print(f"wrote {args.figures}")
    return 0


def train_lease(args: argparse.Namespace) -> int:
    return LEASE_STEPS[args.step](args)


def _lease_pack(args: argparse.Namespace) -> int:
    from playground.training import lease

    print("\n".join(f"wrote {part}" for part in lease.pack(args.carry)))
    print(f"carry one folder per device call, each with: python3 -m playground train lease receive "
          f"--carried {args.carry}/carry-NN --work WORK")
    return 0


def _lease_receive(args: argparse.Namespace) -> int:
    from playground.training import lease

    if args.carried is None:
        raise PlaygroundError("receive needs --carried: the carry-NN folder this call brought")
    ready = lease.receive(args.carried, args.work)
    print("receive: " + ("the target and its reader are in place" if ready else "part kept; carry the next"))
    return 0


def _lease_data(args: argparse.Namespace) -> int:
    from playground.training import lease

    lease.open_work(args.work)
    _print_budgeted("data", lease.run_data(lease.PLANS[args.plan], args.work, args.budget_s))
    return 0


def _lease_train(args: argparse.Namespace) -> int:
    from playground.training import lease

    lease.open_work(args.work)
    _print_budgeted("train", lease.run_train(lease.PLANS[args.plan], args.work, args.budget_s))
    return 0


def _print_budgeted(step: str, done: bool) -> None:
    print(f"{step}: " + ("complete" if done else "stopped inside its budget; run the same command again"))


def _lease_finish(args: argparse.Namespace) -> int:
    from playground.training import lease

    if args.out is None:
        raise PlaygroundError("finish needs --out: the folder whose files come back")
    lease.open_work(args.work)
    print("\n".join(f"wrote {part}" for part in lease.run_finish(lease.PLANS[args.plan], args.work, args.out)))
    return 0


def _lease_unpack(args: argparse.Namespace) -> int:
    from playground.training import lease

    if args.parts is None:
        raise PlaygroundError("unpack needs --parts: the folder the lease's finish step wrote to")
    folders = " ".join(map(str, lease.unpack(args.parts, args.runs)))
    print(f"run folders: {folders}\nnext: python -m playground train ship --runs {folders}")
    return 0


LEASE_STEPS = {"pack": _lease_pack, "receive": _lease_receive, "data": _lease_data, "train": _lease_train,
               "finish": _lease_finish, "unpack": _lease_unpack}


# bench

def _bench_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The suite's options, on `bench` and again on each subcommand (where an unset option leaves
    the value given before the subcommand alone), so they may come before or after it."""
    from playground.evaluation.benchmark import BenchConfig
    from playground.evaluation.prompt_sets import CATEGORIES

    d = (lambda value: value) if defaults else (lambda value: argparse.SUPPRESS)
    p.add_argument("--drafters", nargs="+", default=d(list(BenchConfig.drafters)))
    p.add_argument("--k", type=int, default=d(BenchConfig.k))
    p.add_argument("--max-tokens", type=int, default=d(BenchConfig.max_tokens))
    p.add_argument("--categories", nargs="+", default=d(list(CATEGORIES)), choices=CATEGORIES, metavar="CATEGORY",
                   help=f"a subset of: {', '.join(CATEGORIES)}")
    p.add_argument("--per-category", type=int, default=d(None), help="at most this many prompts per category")
    p.add_argument("--sweep-ks", type=int, nargs="*", default=d(list(BenchConfig.sweep_ks)),
                   help="k values swept for EAGLE 3.1 on chat and coding (none: no sweep)")
    p.add_argument("--trees", action=argparse.BooleanOptionalAction, default=d(None),
                   help="each drafter also drafts the default tree on every prompt: chain-vs-tree rows (the "
                        "embedded engine; `bench trees` sweeps shapes); on by default for the suite, off for --prompts")
    p.add_argument("--out", type=Path, default=d(None),
                   help="folder for results.md, results.json and charts.html (default: assets/benchmark/BACKEND)")
    add_vllm_options(p, d)


def _add_bench(sub) -> None:
    from playground.evaluation.prompt_files import PromptLimits

    p = sub.add_parser("bench", help="the prompt suite by category, or your own prompts (--prompts FILE): tau, "
                                     "acceptance, tokens/s, speedups (subcommands: ui, vllm, trees, profile, kernels, "
                                     "probe, memory)")
    _bench_options(p, defaults=True)
    your = p.add_argument_group("your prompts", "instead of the suite: the prompts of FILE through each of --drafters "
                                "(add none for speedups); Ctrl-C, then the same command goes on where it stopped")
    your.add_argument("--prompts", dest="prompt_file", type=Path, default=None, metavar="FILE",
                      help="JSONL/JSON (OpenAI messages, prompt records, ShareGPT), CSV with a prompt column, or "
                           "text with prompts separated by blank lines")
    your.add_argument("--sample", type=int, default=None, metavar="N", help="run N prompts of the file drawn at random")
    your.add_argument("--seed", type=int, default=0, help="of --sample")
    your.add_argument("--concurrency", dest="study_concurrency", type=int, default=1, metavar="N",
                      help="prompts in flight at once on vLLM servers")
    your.add_argument("--max-prompts", type=int, default=PromptLimits.max_prompts)
    your.add_argument("--max-prompt-chars", type=int, default=PromptLimits.max_prompt_chars)
    p.set_defaults(func=bench_suite)
    suites = p.add_subparsers(dest="suite")
    u = suites.add_parser("ui", help="server-side cost of one page update, by run length")
    _bench_options(u, False)
    u.set_defaults(func=bench_ui)
    v = suites.add_parser("vllm", help="vLLM servers (EAGLE 3.1, EAGLE 3, none): output tokens/s by concurrency")
    _bench_options(v, False)
    v.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    v.set_defaults(func=bench_vllm)
    t = suites.add_parser("trees", help="chain against draft trees (both drafters) and a sweep of tree shapes, on "
                                        "held-out chat and code")
    _bench_options(t, False)
    add_tree_options(t)
    t.add_argument("--prompts", type=int, default=6, help="prompts per kind")
    t.set_defaults(func=bench_trees)
    f = suites.add_parser("profile", help="torch.profiler breakdown of one run (the last --drafters, --k, "
                                          "--max-tokens)")
    _bench_options(f, False)
    f.set_defaults(func=bench_profile)
    n = suites.add_parser("kernels", help="the embedded engine on our CPU kernels against PyTorch's and llama.cpp "
                                          "(scripts/build-llama-cpp.sh), interleaved: tokens/s, tau, the target's "
                                          "forward against the roofline")
    _bench_options(n, False)
    n.add_argument("--prompts-per-kind", type=int, default=2, help="chat and coding prompts each")
    n.add_argument("--rounds", type=int, default=2)
    n.set_defaults(func=bench_kernels)
    c = suites.add_parser("probe", help="what the vLLM probe costs: output tokens/s without it, with it loaded, and "
                                        "recording every request, side by side")
    c.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--rounds", type=int, default=4)
    c.add_argument("--contexts", type=int, nargs="*", default=[1000, 4000], choices=[1000, 2000, 4000],
                   help="document lengths (tokens) after which a recorded step's cost is measured")
    c.add_argument("--flood-rounds", type=int, default=4, help="rounds of streams under a flood of calls (0: none)")
    c.add_argument("--load", type=int, default=40, help="requests sent at once, recorded and not (0: none)")
    c.set_defaults(func=bench_probe)
    m = suites.add_parser("memory", help="the app's RSS over consecutive runs through its API (both drafters loaded)")
    _bench_options(m, False)
    m.add_argument("--runs", type=int, default=200)
    m.add_argument("--study", type=int, default=None, metavar="N",
                   help="instead: one study of N prompts through the Your prompts tab's API (both drafters)")
    m.set_defaults(func=bench_memory)


def _vllm_servers(args: argparse.Namespace):
    """The servers --vllm-url names; without any, the ones the bench starts itself."""
    from playground.evaluation.vllm_load import Servers

    args.launch = args.launch or not args.vllm_url
    return Servers(urls=tuple(args.vllm_url), launch=launch_spec(args, args.k), status=_to_stderr,
                   api_key=args.vllm_api_key)


def bench_suite(args: argparse.Namespace) -> int:
    from playground.engines.tree import TreeShape
    from playground.evaluation import benchmark, report

    if args.prompt_file is not None:
        return bench_prompts(args)
    config = benchmark.BenchConfig(drafters=tuple(args.drafters), k=args.k, max_tokens=args.max_tokens,
                                   categories=tuple(args.categories), per_category=args.per_category,
                                   sweep_ks=tuple(args.sweep_ks), backend=args.backend,
                                   tree=TreeShape() if args.trees is not False else None)
    vllm = args.backend == "vllm"
    res, paths = benchmark.run(config, args.out or Path("assets/benchmark") / args.backend,
                               _vllm_servers(args) if vllm else None)
    print(report.markdown(res))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0 if res["lossless"] or vllm else 1


def bench_prompts(args: argparse.Namespace) -> int:
    from playground.engines.reference import ReferenceEngine
    from playground.engines.tree import TreeShape
    from playground.evaluation import prompt_report, prompt_study
    from playground.evaluation.prompt_files import PromptLimits, read_prompt_file

    limits = PromptLimits(max_prompts=args.max_prompts, max_prompt_chars=args.max_prompt_chars)
    try:
        prompts = read_prompt_file(args.prompt_file, limits, args.sample, args.seed)
    except PlaygroundError as e:
        raise PlaygroundError(f"{args.prompt_file}: {e}") from None
    config = prompt_study.StudyConfig(drafters=tuple(args.drafters), k=args.k, max_tokens=args.max_tokens,
                                      tree=TreeShape() if args.trees else None, backend=args.backend,
                                      concurrency=args.study_concurrency)
    out = args.out or Path("prompt-reports") / f"{args.prompt_file.stem}-{args.backend}"
    vllm = args.backend == "vllm"
    reference = ReferenceEngine.load()
    try:
        if vllm:
            from playground.evaluation.vllm_load import serving

            with serving(reference, _vllm_servers(args)) as engine:
                res, paths = prompt_study.run(engine, config, prompts, args.prompt_file.name, out)
        else:
            res, paths = prompt_study.run(reference, config, prompts, args.prompt_file.name, out)
    except KeyboardInterrupt:
        print(f"stopped; what was measured is saved in {out / 'progress.pkl'}: the same command goes on from there",
              file=sys.stderr)
        return 130
    print(prompt_report.markdown(res))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0 if res["lossless"] or vllm else 1


def bench_ui(args: argparse.Namespace) -> int:
    import subprocess

    # the UI measures itself: the command line never imports the page
    return subprocess.run([sys.executable, "-m", "playground.ui.update_cost"]).returncode


def bench_vllm(args: argparse.Namespace) -> int:
    from playground.evaluation import vllm_load

    load = vllm_load.LoadConfig(tuple(args.concurrency), args.max_tokens, args.k)
    print(vllm_load.markdown(vllm_load.run(load, _vllm_servers(args))))
    return 0


def bench_probe(args: argparse.Namespace) -> int:
    from playground.evaluation import probe_cost

    config = probe_cost.ProbeCostConfig(tuple(args.concurrency), args.max_tokens, args.rounds,
                                        contexts=tuple(args.contexts), flood_rounds=args.flood_rounds,
                                        load_requests=args.load)
    print(probe_cost.markdown(probe_cost.run(config, status=_to_stderr)))
    return 0


def bench_trees(args: argparse.Namespace) -> int:
    from playground.evaluation import trees

    shape = tree_shape(args) or trees.TreeBenchConfig.tree
    config = trees.TreeBenchConfig(drafters=tuple(args.drafters), k=args.k, tree=shape.validate(),
                                   prompts=args.prompts, max_tokens=args.max_tokens)
    result, paths = trees.run(config, args.out or Path("assets/benchmark/trees"))
    print(trees.markdown(result))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


def bench_profile(args: argparse.Namespace) -> int:
    from playground.evaluation import profile

    print(profile.run(args.drafters[-1], args.k, args.max_tokens))
    return 0


def bench_kernels(args: argparse.Namespace) -> int:
    from playground.evaluation import kernels

    drafters = list(dict.fromkeys(["none", *args.drafters]))  # no speculation is every speedup's baseline
    result = kernels.run(drafters, args.k, args.max_tokens, args.prompts_per_kind, args.rounds)
    print(kernels.table(result))
    return 0 if result.same_tokens else 1


def bench_memory(args: argparse.Namespace) -> int:
    from playground.evaluation.memory import rss_over_runs, rss_over_study

    if args.study is not None:
        print("| prompts done | RSS (MiB) | peak RSS (MiB) |\n|---:|---:|---:|")
        samples = rss_over_study(args.study)
    else:
        print("| runs done | RSS (MiB) | peak RSS (MiB) |\n|---:|---:|---:|")
        samples = rss_over_runs(args.runs)
    for done, rss, peak in samples:
        print(f"| {done} | {rss:.0f} | {peak:.0f} |")
    return 0


# watch

def _add_watch(sub) -> None:
    p = sub.add_parser("watch", help="live acceptance of running vLLM servers, from their /metrics, for all the "
                                     "traffic they serve: a table every few seconds")
    p.add_argument("--vllm-url", action="append", default=[], required=True, metavar="NAME=URL",
                   help="a vLLM server under any name (or a bare URL); repeatable")
    p.add_argument("--every", type=float, default=5.0, metavar="SECONDS", help="seconds between readings")
    p.add_argument("--window", type=float, default=60.0, metavar="SECONDS",
                   help="the figures are over the readings of the last SECONDS")
    p.add_argument("--count", type=int, default=None, help="stop after COUNT tables (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="one JSON object per reading: the time and each server's view")
    add_api_key_option(p)
    p.set_defaults(func=watch)


def watch(args: argparse.Namespace) -> int:
    from playground.engines.vllm.watch import Watch, parse_servers, text_table

    if args.every <= 0 or args.window <= 0 or (args.count is not None and args.count < 1):
        raise PlaygroundError("--every and --window are positive seconds, --count at least 1")
    watching = Watch(parse_servers(args.vllm_url), window=args.window, api_key=args.vllm_api_key)
    try:
        shown = 0
        while True:
            started = time.time()
            views = watching.read()
            if args.json:
                print(json.dumps({"time": started, "servers": [v.as_json() for v in views]}), flush=True)
            else:
                print(text_table(views, started) + "\n", flush=True)
            shown += 1
            if args.count is not None and shown >= args.count:
                return 0
            time.sleep(max(0.0, started + args.every - time.time()))
    finally:
        watching.close()
