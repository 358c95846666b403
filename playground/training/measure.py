"""Training's measures outside a run: trained drafters on held-out data (`train validate`), and what one
training step's parts cost on this host (`train cost`).

    python -m playground train validate --drafters eagle3 eagle3.1 runs/eagle3.1 --data data/val
    python -m playground train cost --data data/wide/long data/wide/people
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from playground.model.drafter import load_drafter
from playground.model.variants import SHIPPED, shipped_path
from playground.training.data import load_examples
from playground.training.train import TrainConfig, load_frozen_target, trained_drafter_path
from playground.training.ttt import Validator, autocast_bf16, padded_batch, ttt_pooled


def validate_drafters(drafters: list[str], data: list[Path], device: str = TrainConfig.device, limit: int = 256,
                      ttt_steps: int = TrainConfig.ttt_steps, bf16: bool | None = TrainConfig.bf16) -> list[dict]:
    """Training's measure for trained drafters (names or checkpoint folders) on held-out data folders:
    one row per drafter (the recipe's decay, batch and max_len)."""
    paths = [trained_drafter_path(name) for name in drafters]
    bf16 = autocast_bf16(bf16, device)
    target, _, embed, head = load_frozen_target(device)
    validator = Validator(load_examples(data), target, TrainConfig.batch, TrainConfig.max_len, limit)
    rows = []
    for name, path in zip(drafters, paths):
        drafter = load_drafter(path).to(device)
        rows.append({"drafter": name, **validator(drafter, embed, head, drafter.t2d, ttt_steps, TrainConfig.decay,
                                                  bf16)})
    return rows


def format_validation(rows: list[dict]) -> str:
    lines = ["| drafter | sequences | answer tokens | loss | accuracy by depth |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r['drafter']} | {r['sequences']} | {r['tokens']} | {r['loss']:.3f} | "
              + " ".join(f"{a:.3f}" for a in r["step_acc"]) + " |" for r in rows]
    return "\n".join(lines)


def step_costs(data: list[Path], batch: int = TrainConfig.batch, max_len: int = 6400, device: str = TrainConfig.device,
               bf16: bool | None = TrainConfig.bf16) -> list[dict]:
    """One training step's parts timed on this host, for each data folder's longest batch and its median one:
    the target's states (padded_batch) and each shipped variant's pass with its gradient (ttt_pooled), with
    the process's peak memory so far."""
    bf16 = autocast_bf16(bf16, device)
    target, _, embed, head = load_frozen_target(device)
    drafters = {name: load_drafter(shipped_path(name)).to(device).requires_grad_(True).train() for name in SHIPPED}
    rows = []
    for folder in data:
        examples = sorted(load_examples([folder]), key=lambda ex: len(ex["ids"]))
        middle = max(0, len(examples) // 2 - batch // 2)
        for which, chosen in (("longest", examples[-batch:]), ("median", examples[middle:middle + batch])):
            began = time.perf_counter()
            padded = padded_batch(chosen, target, max_len)
            row = {"data": str(folder), "batch": which, "sequences": len(chosen), "longest": padded["ids"].shape[1] - 1,
                   "tokens": sum(min(len(ex["ids"]) - 1, max_len) for ex in chosen),
                   "target_s": round(time.perf_counter() - began, 2), "drafter_s": {}}
            for name, drafter in drafters.items():
                began = time.perf_counter()
                ttt_pooled(drafter, embed, head, drafter.t2d, padded, TrainConfig.ttt_steps, TrainConfig.decay, bf16,
                           backward=True)
                row["drafter_s"][name] = round(time.perf_counter() - began, 2)
                drafter.zero_grad(set_to_none=True)
            row["peak_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)
            rows.append(row)
    return rows


def format_step_costs(rows: list[dict], host: str) -> str:
    lines = [f"training step costs on {host}", "",
             "| data | batch | sequences | longest | tokens | target s | ms a token | "
             + " | ".join(f"{name} s" for name in rows[0]["drafter_s"]) + " | peak GiB |",
             "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(rows[0]["drafter_s"]) + "---:|"]
    lines += [f"| {r['data']} | {r['batch']} | {r['sequences']} | {r['longest']} | {r['tokens']} | {r['target_s']} | "
              f"{1e3 * r['target_s'] / r['tokens']:.2f} | " + " | ".join(str(s) for s in r["drafter_s"].values())
              + f" | {r['peak_gib']} |" for r in rows]
    return "\n".join(lines)
