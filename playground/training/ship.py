"""`python -m playground train ship`: put trained drafters into assets/ with a model card each.

    python -m playground train ship --runs runs/eagle3 runs/eagle3.1

Each run folder's exported checkpoint (runs/<variant>/drafter) is evaluated with `train eval`
(both drafters in one table), then copied to assets/drafters/<variant>/ with a README.md that
records the data, the recipe, the hyper-parameters, the training curve, the evaluation and the
commands that reproduce it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from playground.evaluation.heldout import evaluate, format_ratios, format_rows
from playground.model.variants import EAGLE31, shipped_path
from playground.plots import label
from playground.training.train import checkpoint_step

SOURCE_TEXT = {
    "templates": "prompts from the project's templates (`playground/training/prompts.py`: chat, coding, math, "
                 "writing, reasoning and multi-turn, with varied system prompts)",
    "self": "user turns the target wrote itself after one of the system prompts and a few opening words "
            "(`--source self`, `playground/training/prompts.py`)",
    "people": "user turns the target wrote after a persona and a few opening words, some with a format wish, and "
              "pasted paragraphs or Python functions with an instruction (`--source people`, "
              "`playground/training/prompts.py`, `playground/training/corpus.py`)",
    "long": "questions after 2k-6k tokens of local documentation (`--source long`, `playground/training/corpus.py`)",
    "file": "the prompts of a prompt file (`--source file`)",
}


NOT_HYPER_PARAMETERS = ("data", "phases", "data_stats", "out", "variant", "stop_at", "val_data", "init")


def _count(value: int | None, what: str) -> str:
    return f"{what}: not recorded" if value is None else f"{value:,} {what}"


def shown_folder(folder: str) -> str:
    """A data folder as a card shows it: relative to where `train ship` runs, never a machine's absolute path."""
    path = Path(folder)
    if not path.is_absolute():
        return folder
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return f"data/{path.name}"


def data_section(data: list[dict], phases: list[dict]) -> str:
    data = [{**d, "folder": shown_folder(d["folder"])} for d in data]
    phases = [{**p, "data": [shown_folder(f) for f in p["data"]]} for p in phases]
    lines = [f"- `{d['folder']}`: {SOURCE_TEXT[d['source']]}; answered by the target (even ones greedy, odd ones "
             f"sampled at temperature {d['temperature']}, up to {d['max_new_tokens']} new tokens). "
             f"{d['shards']} shards, {_count(d['conversations'], 'conversations')}, "
             f"{_count(d['answer_tokens'], 'answer tokens')}." for d in data]
    if len(phases) > 1:
        lines.append("- By step: " + "; ".join(f"from step {p['from_step']}: {' + '.join(p['data'])}, cosine schedule "
                                               f"over {p['steps']} steps" for p in phases) + ".")
    commands = [f"    python -m playground train data --out {d['folder']} --source {d['source']} "
                f"--prompts {d['prompts']} --batch {d['batch']} --max-new-tokens {d['max_new_tokens']}"
                + (f" --seed {d['seed']}" if d["seed"] else "")
                + (f" --device {d['device']}" if d["device"] != "cpu" else "") for d in data]
    return "\n".join(lines) + "\n\n" + "\n".join(commands)


def _json_or_none(line: str) -> dict | None:
    """A log line, or None for the partial line a killed run may leave."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _records(path: Path) -> list[dict]:
    """A JSON-lines log's records, less the partial line a killed run may leave."""
    return [r for r in map(_json_or_none, path.read_text().splitlines()) if r is not None]


def training_summary(run: Path, last: int = 50) -> dict:
    """The steps trained and the mean per-depth accuracy over the last `last` steps. The exported
    drafter is the checkpoint's; a run folder without checkpoint.pt (copied from another machine)
    holds the drafter of its last logged step."""
    records = _records(run / "log.jsonl")
    step = checkpoint_step(run)
    step = step if step is not None else max(r["step"] for r in records)
    # an interrupted run logs steps past its last checkpoint, which the resumed run logs again: keep the last
    by_step = {r["step"]: r for r in records if r["step"] <= step}
    log = [by_step[s] for s in sorted(by_step)][-last:]
    depths = len(log[-1]["step_acc"])
    held_out = [r for r in _records(run / "val.jsonl") if r["step"] <= step] if (run / "val.jsonl").exists() else []
    return {"steps": step, "accuracy_by_depth": [sum(r["step_acc"][d] for r in log) / len(log) for d in range(depths)],
            "loss": sum(r["loss"] for r in log) / len(log), "held_out": held_out[-1] if held_out else None}


def held_out_text(trained: dict) -> str:
    """The run's last held-out measure (train drafter --val-data), or nothing."""
    val = trained["held_out"]
    if val is None:
        return ""
    acc = " / ".join(f"{a:.2f}" for a in val["step_acc"])
    return (f" On held-out data ({' + '.join(map(shown_folder, val['data']))}: {val['sequences']} sequences, "
            f"{val['tokens']:,} answer tokens) at step {val['step']}: loss {val['loss']:.2f}, accuracy by depth {acc}.")


def started_from(config: dict) -> str:
    """How the run's drafter began: from the target (a new drafter) or from a trained one (--init)."""
    if not config.get("init"):
        return "the draft head and final norm initialised from the target's"
    return (f"the whole drafter (weights and draft vocabulary) starting from the trained drafter "
            f"`{config['init']}`, whose card at that time is \"Started from\" below")


def init_section(init_card: str) -> str:
    """The card of the drafter a run started from, its headings one level down, or nothing."""
    if not init_card:
        return ""
    demoted = "\n".join("#" + line if line.startswith("#") else line for line in init_card.strip().splitlines())
    return f"\n## Started from\n\n{demoted}\n"


def model_card(variant: str, config: dict, data: list[dict], trained: dict, table: str, eval_command: str,
               init_card: str = "") -> str:
    switches = ("`fc_norm` and `norm_output` on (EAGLE 3.1)" if variant == EAGLE31
                else "`fc_norm` and `norm_output` off (plain EAGLE 3)")
    acc = " / ".join(f"{a:.2f}" for a in trained["accuracy_by_depth"])
    partial = (f" of {config['steps']} scheduled (the cosine schedule was stopped early; training resumes from "
               "the run folder)" if trained["steps"] < int(config["steps"]) else "")
    return f"""# {label(variant)} drafter for SmolLM2-135M-Instruct

An EAGLE-3 draft head (one decoder layer, hidden 576, draft vocabulary of {config['draft_vocab']} tokens,
fused target layers 2, 15 and 27) with {switches}. vLLM's EAGLE-3 checkpoint format:
`--speculative-config '{{"method": "eagle3", "model": "assets/drafters/{variant}", "num_speculative_tokens": 5}}'`.

## Data

Self-distillation from the target itself, no downloads: the target's answers as token ids. Training
recomputes the target's fused features and distribution from the ids for every batch.

{data_section(data, config.get('phases', []))}

## Recipe

Training-time test as in EAGLE-3: {config['ttt_steps']} unrolled steps per sequence, loss weights
{config['decay']}^i, soft cross-entropy against the target's distribution over the draft vocabulary
(masked where the target's top token is outside it), frozen target embeddings, {started_from(config)}. EAGLE 3 and EAGLE 3.1 share data, order, seed, steps
and every hyper-parameter below; only the two switches differ.

| hyper-parameter | value |
|---|---|
""" + "\n".join(f"| {k} | {v} |" for k, v in config.items() if k not in NOT_HYPER_PARAMETERS) + f"""

Trained {trained['steps']} steps{partial}. Mean over the last 50 steps: loss {trained['loss']:.2f}, training
accuracy by unroll depth {acc}.{held_out_text(trained)}

    python -m playground train drafter --variant {variant} --data {' '.join(map(shown_folder, config['data']))} --out runs/{variant} \\
        --steps {config['steps']} --batch {config['batch']} --save-every {config['save_every']} \\
        --device {config['device']}{' --val-data ' + ' '.join(map(shown_folder, config['val_data'])) if config.get('val_data') else ''}{' --init ' + config['init'] if config.get('init') else ''}

## Evaluation

Held-out prompts (`playground/prompts/sets.py`), k=5, greedy, through the reference engine:

{table}

    {eval_command}
""" + init_section(init_card)


def ship(runs: list[Path], engine, max_tokens: int = 128, assets: Path | None = None,
         prompts: int | None = None) -> list[Path]:
    configs = {json.loads((r / "train_config.json").read_text())["variant"]: r for r in runs}
    folders = {variant: str(run / "drafter") for variant, run in configs.items()}
    rows = evaluate(engine, list(folders.values()), max_tokens=max_tokens, prompts=prompts)
    names = {folder: variant for variant, folder in folders.items()}
    named = [replace(r, drafter=names[r.drafter]) for r in rows]
    table = format_rows(named) + "\n\n" + format_ratios(named)
    command = (f"python -m playground train eval --drafters {' '.join(configs)} --max-tokens {max_tokens}"
               + (f" --prompts {prompts}" if prompts else ""))
    written = []
    for variant, run in configs.items():
        config = json.loads((run / "train_config.json").read_text())
        dest = shipped_path(variant) if assets is None else assets / variant
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(run / "drafter", dest)
        init_card = run / "init_card.md"
        (dest / "README.md").write_text(model_card(variant, config, config["data_stats"], training_summary(run), table,
                                                   command, init_card.read_text() if init_card.exists() else ""))
        written.append(dest)
    print(table)
    return written
