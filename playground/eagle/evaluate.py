"""`python -m playground train eval`: tau and per-position acceptance of drafters on held-out prompts.

Four kinds, written for evaluation and absent from the training prompt set: everyday chat,
code, long context (a ~1,500-token report and a question about it), and perturbed formats
(chat prompts in the plain and markdown templates the drafters never saw in training).
Every run goes through the reference engine at k=5, greedy, so it is also lossless-checked
by construction (the engine's greedy output is the target's). Next to tau, a row gives the share
of the answer's tokens inside the drafter's draft vocabulary: no drafter can propose the others,
so it bounds every depth's acceptance.

One more kind, on request only, is not held out: "training prompts", the first six single-turn
conversations of the template source (seed 0: one of each single-turn kind, then a second chat
one), which the shipped drafters trained on. Its
gap to "chat" and "code" measures how far the drafters generalise beyond their training prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.eagle.prompts import KINDS as PROMPT_KINDS, conversation
from playground.presets import long_document_prompt
from playground.request import GenerationRequest
from playground.stats import Pooled, pool

CHAT = [
    "What should I pack for a weekend hiking trip in autumn?",
    "Can you suggest three ideas for a child's birthday party at home?",
    "How do I politely decline an invitation to a wedding?",
    "What is the difference between weather and climate?",
    "Give me tips for falling asleep faster.",
    "Why do cats purr?",
]
CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a JavaScript function that removes duplicate values from an array.",
    "Write a SQL query that finds the five customers with the highest total order amount.",
    "Write a Python class for a simple stack with push, pop and peek methods.",
    "Write a bash script that counts the lines in every .txt file in a folder.",
    "Write a C function that reverses a string in place.",
]
LONG_QUESTIONS = [
    "How many samples did the laboratory take, and why did the number increase?",
    "What are the main risks the board sees for next year?",
    "How much will a typical household pay more per year after the price increase?",
    "Summarise what happened with the smart meter project.",
]
KINDS = ("chat", "code", "long context", "perturbed format")
TRAINING_PROMPTS = "training prompts"


def eval_requests(kind: str, drafter: str, k: int, max_tokens: int) -> list[GenerationRequest]:
    make = lambda prompt, template="model": GenerationRequest(prompt=prompt, drafter=drafter, k=k,
                                                             max_tokens=max_tokens, template=template)
    if kind == "chat":
        return [make(p) for p in CHAT]
    if kind == "code":
        return [make(p) for p in CODE]
    if kind == "long context":
        return [make(long_document_prompt(q)) for q in LONG_QUESTIONS]
    if kind == "perturbed format":
        return [make(p, template) for p in CHAT[:3] for template in ("plain", "markdown")]
    if kind == TRAINING_PROMPTS:
        single_turn = [i for i in range(2 * len(PROMPT_KINDS)) if PROMPT_KINDS[i % len(PROMPT_KINDS)] != "multiturn"]
        return [_training_request(conversation(i), drafter, k, max_tokens) for i in single_turn[:6]]
    raise KeyError(kind)


def _training_request(messages: list[dict], drafter: str, k: int, max_tokens: int) -> GenerationRequest:
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = messages[1:] if system else messages
    return GenerationRequest(prompt=turns[-1]["content"], system=system, history=tuple(turns[:-1]),
                             drafter=drafter, k=k, max_tokens=max_tokens)


@dataclass(frozen=True)
class EvalRow:
    drafter: str
    kind: str
    pooled: Pooled
    draftable: float   # share of the answer tokens inside the drafter's draft vocabulary: the others cannot be accepted


def evaluate(engine, drafters: list[str], k: int = 5, max_tokens: int = 128, kinds=KINDS) -> list[EvalRow]:
    """One row per kind and drafter; tau and acceptance pooled over all the kind's steps."""
    rows = []
    for kind in kinds:
        for name in drafters:
            runs = [list(engine.generate(r)) for r in eval_requests(kind, name, k, max_tokens)]
            answer = torch.tensor([t for run in runs for e in run for t in e.token_ids], dtype=torch.long)
            drafter, _ = engine.drafters.get(name)
            draftable = float(drafter.t2d[answer].float().mean()) if drafter is not None else float("nan")
            rows.append(EvalRow(name, kind, pool(runs), draftable))
    return rows


def format_rows(rows: list[EvalRow]) -> str:
    lines = ["| kind | drafter | prompts | min prompt tokens | tau | acceptance by depth | sink attention by depth "
             "| fed-back RMS by depth | draftable |", "|---|---|---:|---:|---:|---|---|---|---:|"]
    fmt = lambda xs, f="{:.2f}": " ".join(f.format(x) for x in xs)
    for r in rows:
        p = r.pooled
        lines.append(f"| {r.kind} | {r.drafter} | {p.runs} | {p.min_prompt_tokens} | {p.mean_acceptance_length:.2f} | "
                     f"{fmt(p.acceptance)} | {fmt(p.sink_attention, '{:.3f}')} | {fmt(p.hidden_norm)} | "
                     f"{r.draftable:.3f} |")
    return "\n".join(lines)
