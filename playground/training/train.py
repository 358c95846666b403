"""Training-time-test training of EAGLE 3 and EAGLE 3.1 drafters on self-distillation data.

    python -m playground train drafter --variant eagle3 eagle3.1 --out runs/eagle3 runs/eagle3.1 \
        --data data/train data/self --steps 3000

The variants named together train side by side in one process, on the same batches in the same
order, with the same seed, steps and hyper-parameters: only the two 3.1 switches differ. The
target runs beside them: every batch's features and target distribution come from one target
forward over its token ids (target_states), shared by all the drafters, so the data is only token ids.
Each run checkpoints every --save-every steps and resumes from its folder; --stop-at N ends a
session at step N without changing the schedule, --budget-s after so many seconds, and SIGTERM or
Ctrl-C after the step in progress, each saving first. A run folder copied without its checkpoint.pt
(the drafter's export and resume.json, ~20 MB: small enough to carry to another machine) resumes from
the exported weights with a fresh optimizer, its learning rate warmed up again over --warmup steps. With --val-data, every save also measures each
drafter on held-out data (Validator: training's loss and accuracy, teacher-forced) into val.jsonl;
`train validate` takes the same measure for finished drafters. A run resumed with other data folders records
from which step it used them (train_config.json). With --init, new runs start from trained drafters
(their weights and draft vocabulary) instead of new ones: fine-tuning on other data.

The recipe (EAGLE-3, "training-time test"): unroll the drafter `ttt_steps` times per sequence.
Step 0 reads fc(target features); step i > 0 reads the drafter's own output state of step i-1
(h_pre for EAGLE 3, norm(h_pre) for 3.1) at the same position, with the tokens teacher-forced and
shifted by i and RoPE position t + i. Step i's queries see the step-0 keys causally and the keys
of steps 1..i only at their own position, exactly what chain drafting sees at depth i + 1.
Loss per step: cross-entropy against the target's distribution restricted to the draft
vocabulary, masked where the target's argmax lies outside it; total sum_i decay^i * loss_i.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from playground.errors import PlaygroundError
from playground.model.drafter import DrafterConfig, Eagle3Drafter, load_drafter, load_drafter_config, save_drafter
from playground.model.target import Target, aux_layer_ids
from playground.model.variants import SHIPPED, shipped_path
from playground.training.data import describe, load_examples
from playground.training.ttt import Validator, autocast_bf16, padded_batch, ttt_pooled

RESUME = "resume.json"   # a run folder's last save: the step its exported drafter reached


@dataclass(frozen=True)
class TrainConfig:
    variant: str                 # eagle3 | eagle3.1
    data: tuple[Path, ...]       # data folders (train data), pooled
    out: Path
    steps: int = 4000
    batch: int = 8               # sequences per step
    max_len: int = 768           # longer sequences are cut (keeps a step's memory bounded)
    lr: float = 1e-3             # a small drafter trained from scratch tolerates a large rate
    warmup: int = 100
    ttt_steps: int = 5           # unroll depth = the deepest draft trained (k = 5 is the default)
    decay: float = 0.8           # loss weight decay^i for unroll step i
    draft_vocab: int = 8192
    seed: int = 0
    save_every: int = 200
    bf16: bool | None = None     # bf16 autocast for the drafter's matmuls; None: where it pays (ttt.autocast_bf16)
    stop_at: int = 0             # > 0: save and stop after this step (the schedule still spans `steps`)
    device: str = "cpu"          # cpu | cuda (the recipe is the same; the target runs there too)
    val_data: tuple[Path, ...] = ()   # held-out data folders: loss and accuracy by depth at every save
    init: str = ""               # a trained drafter to start from (shipped name or folder); "" = a new drafter
    budget_s: float = 0.0        # > 0: save and stop after this many seconds (a resumed run goes on from there)


def pick_draft_vocab(examples: list[dict], vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent answer tokens, ascending (the drafter only ever proposes these)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in examples:
        counts += torch.bincount(ex["ids"][ex["prompt_len"]:].long(), minlength=vocab_size)
    return torch.argsort(counts, descending=True, stable=True)[:size].sort().values


def trained_drafter_path(name: str) -> Path:
    """A shipped drafter's folder, or the checkpoint folder named; a clear error if it holds none."""
    path = shipped_path(name) if name in SHIPPED else Path(name)
    if not (path / "model.safetensors").exists():
        raise PlaygroundError(f"no trained checkpoint for drafter {name!r} (a shipped name or a checkpoint folder)")
    return path


def schedule_factor(step: int, warmup: int, steps: int, rewarm_from: int | None = None) -> float:
    """The learning rate's factor at a step: a linear warm-up (again from where a carried run went on, its
    Adam moments having stayed behind), then a cosine down to 0 at the last step."""
    warm = min(1.0, (step + 1) / warmup)
    if rewarm_from is not None:
        warm *= min(1.0, (step - rewarm_from + 1) / warmup)
    return warm * 0.5 * (1 + math.cos(math.pi * min(1.0, step / steps)))


def resumable(run: Path) -> bool:
    """Whether a run folder holds a run to go on with: its checkpoint, or a carried copy (resume.json)."""
    return (Path(run) / "checkpoint.pt").exists() or (Path(run) / RESUME).exists()


def init_source(config: TrainConfig) -> Path | None:
    """The trained drafter a new run starts from (--init); None without one, or where the run
    resumes (a resumed run ignores --init)."""
    if not config.init or resumable(config.out):
        return None
    return trained_drafter_path(config.init)


def init_mismatch(have: DrafterConfig, variant: str, draft_vocab: int) -> str | None:
    """Why a trained drafter cannot start a run of this variant and draft vocabulary size, if it cannot."""
    if have.variant != variant:
        return f"it is {have.variant}, the run trains {variant}"
    if have.draft_vocab_size != draft_vocab:
        return f"its draft vocabulary has {have.draft_vocab_size} tokens (pass --draft-vocab {have.draft_vocab_size})"
    return None


def cannot_start(config: TrainConfig, why: str) -> PlaygroundError:
    return PlaygroundError(f"--init {config.init} cannot start the {config.variant} run: {why}")


def check_init(config: TrainConfig) -> None:
    """Fail before the target loads, and before the run folder exists, where --init names a drafter
    of another variant or draft vocabulary size."""
    source = init_source(config)
    if source is None:
        return
    why = init_mismatch(load_drafter_config(source), config.variant, config.draft_vocab)
    if why:
        raise cannot_start(config, why)


def load_init(folder: Path, config: TrainConfig, expected: DrafterConfig) -> Eagle3Drafter:
    """The trained drafter a new run starts from (--init, found in `folder`): the same switches, target
    and draft vocabulary size."""
    drafter = load_drafter(folder)
    if drafter.config != expected:
        raise cannot_start(config, init_mismatch(drafter.config, expected.variant, expected.draft_vocab_size)
                           or "it was made for another target")
    return drafter


def init_from_target(drafter: Eagle3Drafter, model) -> None:
    """Start the output side where the target is: the draft head as the target's head rows of the
    draft vocabulary, the final norm as the target's. The drafter then only has to learn to
    produce the target's next final state, which it reaches far sooner than from a random head."""
    with torch.no_grad():
        drafter.lm_head.weight.copy_(model.lm_head.weight[drafter.t2d])
        drafter.norm.weight.copy_(model.model.norm.weight)


class Batcher:
    """Padded batches of examples in a seeded order, with the target's states; the position in the
    order is resumable."""

    def __init__(self, examples: list[dict], config: TrainConfig, target: Target):
        self.examples, self.config, self.target = examples, config, target
        self._orders: dict[int, list[list[int]]] = {}
        self.per_epoch = len(self.order(0))

    def order(self, epoch: int) -> list[list[int]]:
        """The epoch's batches (the current epoch's are kept: every step of an epoch reads them)."""
        if epoch not in self._orders:
            self._orders = {epoch: self._shuffled(epoch)}
        return self._orders[epoch]

    def _shuffled(self, epoch: int) -> list[list[int]]:
        """The epoch's batches: shuffled, then grouped by similar length (little padding), in random order."""
        rng = random.Random(f"{self.config.seed}:{epoch}")
        idx = list(range(len(self.examples)))
        rng.shuffle(idx)
        size, pool = self.config.batch, self.config.batch * 32
        batches = []
        for start in range(0, len(idx) - size + 1, pool):
            group = sorted(idx[start:start + pool], key=lambda j: len(self.examples[j]["ids"]))
            batches += [group[b:b + size] for b in range(0, len(group) - size + 1, size)]
        rng.shuffle(batches)
        return batches

    def batch(self, step: int) -> dict:
        """ids [B, T + 1], the answer mask [B, T + 1], and the target's states at positions 0..T-1."""
        epoch, i = divmod(step, self.per_epoch)
        chosen = [self.examples[j] for j in self.order(epoch)[i]]
        return padded_batch(chosen, self.target, self.config.max_len)


def checkpoint_step(run: Path) -> int | None:
    """The step a run folder's last save reached; None without one."""
    resume = Path(run) / RESUME
    return json.loads(resume.read_text())["step"] if resume.exists() else None


def write_train_config(path: Path, config: TrainConfig, start: int, data_stats: list[dict]) -> None:
    """The run's configuration, plus `phases` (from which step it used which data folders and schedule
    length) and `data_stats` (how the current data was made and its size; describe())."""
    fields = {k: ([str(f) for f in v] if k in ("data", "val_data") else str(v)) for k, v in asdict(config).items()}
    phases = json.loads(path.read_text()).get("phases", []) if path.exists() else []
    phases = [p for p in phases if p["from_step"] < start]
    phase = {"from_step": start, "data": fields["data"], "steps": config.steps}
    if not phases or {**phases[-1], "from_step": start} != phase:
        phases.append(phase)
    path.write_text(json.dumps({**fields, "phases": phases, "data_stats": data_stats}, indent=2))


def load_frozen_target(device: str) -> tuple[Target, torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The target in float32, transformers' own model of it (the plain weights a drafter starts
    from), and its embeddings and head, frozen: what training and validation read."""
    target = Target.load(None, "float32", device)
    model = target.reference()
    return target, model, model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()


class Run:
    """One variant's training in its run folder: drafter, optimizer, schedule, log and checkpoint.
    `start` is the step its checkpoint reached (0 for a new run)."""

    def __init__(self, config: TrainConfig, model, frequent_tokens: Callable[[], torch.Tensor], data_stats: list[dict]):
        """`frequent_tokens` picks the draft vocabulary of a new run; a resumed run keeps its own. A new
        run with `config.init` starts from that drafter, its weights and draft vocabulary, and keeps its
        model card (init_card.md) for the shipped card's provenance."""
        config = replace(config, bf16=autocast_bf16(config.bf16, config.device))   # recorded as it runs
        self.config = config
        self.out = Path(config.out)
        drafter_config = DrafterConfig.for_target(model.config, config.draft_vocab,
                                                 aux_layer_ids(model.config.num_hidden_layers), SHIPPED[config.variant])
        self.checkpoint = self.out / "checkpoint.pt"
        vocab_file = self.out / "draft_vocab.pt"
        source = init_source(config)
        if source is not None:
            self.drafter = load_init(source, config, drafter_config)
            self.out.mkdir(parents=True, exist_ok=True)
            torch.save(self.drafter.to_target_ids(torch.arange(config.draft_vocab)), vocab_file)
            card = source / "README.md"
            if card.exists():
                shutil.copyfile(card, self.out / "init_card.md")
            self.drafter.requires_grad_(True).train()
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            if not vocab_file.exists():
                torch.save(frequent_tokens(), vocab_file)
            self.drafter = Eagle3Drafter(drafter_config).init_random(config.seed)
            self.drafter.set_draft_vocab(torch.load(vocab_file))
            init_from_target(self.drafter, model)
        self.drafter.to(config.device)   # where the target's model is
        self.start, self.rewarm_from = 0, None
        carried = self.out / RESUME
        if not self.checkpoint.exists() and carried.exists():   # a carried copy: the exported weights go on
            self.start = self.rewarm_from = json.loads(carried.read_text())["step"]
            self.drafter = load_drafter(self.out / "drafter").to(config.device).requires_grad_(True).train()
        self.in_vocab = self.drafter.t2d.clone()
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: self.learning_rate(s))
        if self.checkpoint.exists():
            state = torch.load(self.checkpoint, map_location=config.device)
            self.drafter.load_state_dict(state["drafter"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.schedule.load_state_dict(state["schedule"])
            self.start, self.rewarm_from = state["step"], state.get("rewarm_from")
        elif self.start:   # the schedule where the carried run stopped
            self.schedule.last_epoch = self.start
            for group in self.optimizer.param_groups:
                group["lr"] = config.lr * self.learning_rate(self.start)
        write_train_config(self.out / "train_config.json", config, self.start, data_stats)
        self.log = open(self.out / "log.jsonl", "a")
        self.began = time.monotonic()

    def learning_rate(self, step: int) -> float:
        return schedule_factor(step, self.config.warmup, self.config.steps, self.rewarm_from)

    def train_step(self, step: int, batch: dict, embed: torch.Tensor, head: torch.Tensor) -> tuple[float, float]:
        """One optimizer step on the batch, logged; (loss, first-depth accuracy)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, losses, accs, _ = ttt_pooled(self.drafter, embed, head, self.in_vocab, batch, self.config.ttt_steps,
                                           self.config.decay, self.config.bf16, backward=True)
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), 0.5)
        self.optimizer.step()
        self.schedule.step()
        loss_value = float(loss.detach())
        self.log.write(json.dumps({"step": step + 1, "loss": loss_value, "step_loss": losses, "step_acc": accs,
                                   "lr": self.schedule.get_last_lr()[0],
                                   "elapsed_s": round(time.monotonic() - self.began, 3)}) + "\n")
        return loss_value, accs[0]

    def save(self, step: int) -> None:
        """The checkpoint: the drafter in float32, Adam's moments in bfloat16 (half the size, so that a run
        folder can be carried to another machine; loading casts them back to the weights' float32)."""
        tmp = self.checkpoint.with_suffix(".tmp")
        optimizer = self.optimizer.state_dict()
        optimizer["state"] = {i: {k: v.bfloat16() if k in ("exp_avg", "exp_avg_sq") else v for k, v in s.items()}
                              for i, s in optimizer["state"].items()}
        torch.save({"drafter": self.drafter.state_dict(), "optimizer": optimizer,
                    "schedule": self.schedule.state_dict(), "step": step, "rewarm_from": self.rewarm_from}, tmp)
        os.replace(tmp, self.checkpoint)
        save_drafter(self.drafter, self.out / "drafter")
        (self.out / RESUME).write_text(json.dumps({"step": step}) + "\n")   # after the export it describes
        self.log.flush()

    def validate(self, step: int, validator: Validator, embed: torch.Tensor, head: torch.Tensor) -> dict:
        """The held-out measure at this step, appended to val.jsonl."""
        measured = validator(self.drafter, embed, head, self.in_vocab, self.config.ttt_steps, self.config.decay,
                             self.config.bf16)
        with open(self.out / "val.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "data": [str(d) for d in self.config.val_data], **measured}) + "\n")
        return measured


def train(configs: list[TrainConfig]) -> list[Path]:
    """Train one drafter per config side by side, on the same batches and the same target states.
    The configs may differ only in variant, run folder and the trained drafter each starts from."""
    config = configs[0]
    if len({replace(c, variant="", out=Path(), init="") for c in configs}) > 1:
        raise PlaygroundError("drafters trained side by side share every setting but the variant, the run folder "
                              "and the drafter each starts from")
    if len({bool(c.init) for c in configs}) > 1:
        raise PlaygroundError("drafters trained side by side all start from a trained drafter (--init), or none does")
    if len({c.variant for c in configs}) < len(configs) or len({Path(c.out) for c in configs}) < len(configs):
        raise PlaygroundError("one run folder per variant, each variant once")
    if set(map(Path, config.val_data)) & set(map(Path, config.data)):
        raise PlaygroundError("--val-data must be held out: a folder given as --data too measures nothing held out")
    for c in configs:
        check_init(c)
    torch.manual_seed(config.seed)
    target, model, embed, head = load_frozen_target(config.device)
    by_folder = {folder: load_examples([folder]) for folder in config.data}
    examples = [ex for folder_examples in by_folder.values() for ex in folder_examples]
    data_stats = [describe(folder, folder_examples) for folder, folder_examples in by_folder.items()]
    # picked once for all the new runs (the same data gives them the same vocabulary)
    frequent_tokens = functools.cache(lambda: pick_draft_vocab(examples, model.config.vocab_size, config.draft_vocab))
    runs = [Run(c, model, frequent_tokens, data_stats) for c in configs]
    batcher = Batcher(examples, config, target)
    validator = Validator(load_examples(config.val_data), target, config.batch, config.max_len) if config.val_data else None
    end = min(config.steps, config.stop_at) if config.stop_at > 0 else config.steps
    first = min(run.start for run in runs)
    began = time.monotonic()
    with stop_signals() as stopped:   # before the progress bar shows: from then on a signal saves first
        bar = tqdm(range(first, end), desc="train " + " + ".join(c.variant for c in configs), initial=first,
                   total=config.steps)
        for step in bar:
            batch = batcher.batch(step)   # the target's states in float32, outside autocast
            # a run ahead of the others (interrupted between two runs' saves) skips the steps it has done
            done = {run.config.variant: run.train_step(step, batch, embed, head) for run in runs if step >= run.start}
            bar.set_postfix({variant: f"loss {loss:.3f} acc0 {acc:.2f}" for variant, (loss, acc) in done.items()})
            if 0 < config.budget_s < time.monotonic() - began:
                why = f"after {config.budget_s:.0f} s"
            else:
                why = f"on {stopped[0]}" if stopped else ""
            if (step + 1) % config.save_every == 0 or step + 1 == end or why:
                for run in runs:
                    run.save(step + 1)
                    if validator is not None and not stopped:
                        measured = run.validate(step + 1, validator, embed, head)
                        bar.write(f"step {step + 1} {run.config.variant}: held-out accuracy by depth "
                                  + " ".join(f"{a:.3f}" for a in measured["step_acc"]))
            if why:
                bar.write(f"stopped at step {step + 1} of {config.steps} {why}; the same command goes on from there")
                break
    for run in runs:
        run.log.close()
    return [run.out / "drafter" for run in runs]


@contextmanager
def stop_signals() -> Iterator[list[str]]:
    """SIGTERM and Ctrl-C, while training, end the step in progress and stop after saving (the list
    names the signal once one came); a second one stops at once."""
    stopped: list[str] = []

    def stop(number, frame):
        if stopped:
            raise KeyboardInterrupt
        stopped.append(signal.Signals(number).name)

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stopped
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
