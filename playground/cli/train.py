"""`train data | drafter | validate | eval | ship`: build drafters, measure them, ship them."""

from __future__ import annotations

import argparse
from pathlib import Path

from playground.errors import PlaygroundError
from playground.model.variants import SHIPPED
from playground.options import add_tree_options, tree_shape


def add_parsers(sub) -> None:
    from playground.prompts.corpus_file import CORPUS
    from playground.training.data import SOURCES, DataConfig

    train = sub.add_parser("train", help="build drafters: data, drafter, validate, eval, ship").add_subparsers(dest="stage", required=True)
    p = train.add_parser("data", help="self-distillation data from the embedded target")
    p.add_argument("--out", type=Path, default=Path("data/train"))
    p.add_argument("--prompts", type=int, default=DataConfig.prompts)
    p.add_argument("--batch", type=int, default=DataConfig.batch)
    p.add_argument("--first", type=int, default=DataConfig.first,
                   help="the first conversation's index (default 0): --prompts more, going on where another "
                        "folder ended; its shards number from 0")
    p.add_argument("--max-new-tokens", type=int, default=DataConfig.max_new_tokens)
    p.add_argument("--temperature", type=float, default=DataConfig.temperature)
    p.add_argument("--seed", type=int, default=DataConfig.seed)
    p.add_argument("--source", choices=SOURCES, default=DataConfig.source,
                   help="templates: the prompt generator; self: the target writes the user turns itself; people: "
                        "the same after personas, with format wishes and pasted text or code; long: questions "
                        "after 2k-6k-token documents (people and long read --corpus)")
    p.add_argument("--corpus", default=str(CORPUS),
                   help="the corpus file of python -m playground.training.corpus")
    p.add_argument("--prompt-file", default="", help="--source file: a prompt file (JSONL, JSON, CSV or text)")
    p.add_argument("--device", default=DataConfig.device, help="where the target runs: cpu or cuda")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=DataConfig.dtype,
                   help="the target's weights and activations while it answers (bfloat16: the GPU plans' choice)")
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
                   help="bf16 autocast for the drafter (default: on CUDA and on CPUs with native bf16, where it "
                        "pays; elsewhere it is emulated, several times slower than float32)")
    p.add_argument("--device", default=TrainConfig.device, help="where the drafter trains: cpu or cuda")
    p.add_argument("--val-data", type=Path, nargs="+", default=[],
                   help="held-out data folders: loss and accuracy by depth at every save (val.jsonl)")
    p.add_argument("--init", nargs="+", default=[], metavar="DRAFTER",
                   help="one trained drafter per variant, in order (shipped name or checkpoint folder): new runs "
                        "start from its weights and draft vocabulary instead of a new drafter (fine-tuning)")
    p.set_defaults(func=train_drafter)

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

    p = train.add_parser("cost", help="one training step's parts timed on this host, for each data folder's "
                                      "longest and median batch: the target's states and each drafter's pass")
    p.add_argument("--data", type=Path, nargs="+", required=True, help="data folders")
    p.add_argument("--batch", type=int, default=TrainConfig.batch, help="sequences per step")
    p.add_argument("--max-len", type=int, default=6400, help="longer sequences are cut")
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    p.set_defaults(func=train_cost)

    p = train.add_parser("ship", help="evaluate trained runs and copy them to assets/drafters with model cards")
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="run folders of train drafter")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=None, help="evaluate on each kind's first N prompts (default: all)")
    p.set_defaults(func=train_ship)

    from playground.prompts.sets import EVAL_KINDS

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

    generate_data(DataConfig(out=args.out, prompts=args.prompts, batch=args.batch, first=args.first,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                             source=args.source, device=args.device, dtype=args.dtype, slots=args.slots,
                             corpus=args.corpus, prompt_file=args.prompt_file))
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
    from playground.training.measure import format_validation, validate_drafters

    print(format_validation(validate_drafters(args.drafters, args.data, args.device, args.sequences,
                                              args.ttt_steps, args.bf16)))
    return 0


def train_cost(args: argparse.Namespace) -> int:
    import json

    from playground.evaluation.machine import described, machine
    from playground.training.measure import format_step_costs, step_costs

    rows = step_costs(args.data, args.batch, args.max_len)
    print(json.dumps({"host": machine(), "rows": rows}) if args.json else format_step_costs(rows, described(machine())))
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
    from playground.prompts.sets import EVAL_KINDS, KINDS
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
