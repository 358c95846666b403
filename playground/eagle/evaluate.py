"""`python -m playground train eval`: tau and per-position acceptance of drafters on held-out prompts.

Four kinds, written for evaluation and absent from the training prompt set: everyday chat (24
prompts), code (24), long context (8 questions about a ~1,500-token report) and perturbed formats
(24: eight of the chat prompts in each of the plain and markdown templates the drafters never saw
in training, and eight more under unusual system prompts unlike the training personas).
Every run goes through the reference engine at k=5, greedy, so it is also lossless-checked
by construction (the engine's greedy output is the target's). Next to tau, a row gives the share
of the answer's tokens inside the drafter's draft vocabulary: no drafter can propose the others,
so it bounds every depth's acceptance.

A kind's prompts are few, so each tau comes with a 95% bootstrap interval over its prompts, and
each drafter's tau relative to the first drafter's with a paired one (greedy, every drafter
answers a prompt with the same tokens, so the ratio compares the same text).

More kinds, on request: the halves of "perturbed format" ("other templates" and "unusual system
prompts"), and "longer context": the long-context questions after three documents (~4,400
tokens), the report last, after two others. One more, on request only, is not held out:
"training prompts", the first six single-turn conversations of the template source (seed 0: one
of each single-turn kind, then a second chat one), which the shipped drafters trained on. Its
gap to "chat" and "code" measures how far the drafters generalise beyond their training prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from playground.benchmark.suite import DOCUMENTS
from playground.eagle.prompts import KINDS as PROMPT_KINDS, conversation
from playground.engines.events import reconcile
from playground.errors import PlaygroundError
from playground.presets import long_document_prompt
from playground.request import GenerationRequest
from playground.stats import Pooled, bootstrap_interval, drafting_counts, pool, pooled_tau
from playground.ui import figures

CHAT = [
    "What should I pack for a weekend hiking trip in autumn?",
    "Can you suggest three ideas for a child's birthday party at home?",
    "How do I politely decline an invitation to a wedding?",
    "What is the difference between weather and climate?",
    "Give me tips for falling asleep faster.",
    "Why do cats purr?",
    "How can I keep my houseplants alive while I am on holiday for two weeks?",
    "What is a good way to start running if I have never exercised?",
    "My neighbour's dog barks all night. How should I bring it up with them?",
    "Can you explain what a mortgage is in simple words?",
    "What are some cheap and healthy meals I can cook in twenty minutes?",
    "How do I prepare for my first job interview?",
    "Why is the sky blue?",
    "What should I consider when adopting a rescue dog?",
    "How can I learn a new language when I only have fifteen minutes a day?",
    "Is it better to rent or buy a car if I drive only on weekends?",
    "What are the signs that I need new running shoes?",
    "How do I remove a coffee stain from a white shirt?",
    "Can you help me plan a relaxing Sunday?",
    "Why do leaves change colour in the autumn?",
    "What is a polite way to ask my manager for a raise?",
    "How can I stop procrastinating on my homework?",
    "What are the benefits of drinking enough water?",
    "How do vaccines train the body to fight a disease?",
]
CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a JavaScript function that removes duplicate values from an array.",
    "Write a SQL query that finds the five customers with the highest total order amount.",
    "Write a Python class for a simple stack with push, pop and peek methods.",
    "Write a bash script that counts the lines in every .txt file in a folder.",
    "Write a C function that reverses a string in place.",
    "Write a Python function that checks whether two words are anagrams.",
    "Write a JavaScript function that capitalises the first letter of every word in a sentence.",
    "Write a Python script that reads a text file and prints its ten most common words.",
    "Write a SQL query that counts the orders placed in each month of 2023.",
    "Write a Java method that returns the largest value in an array of integers.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a Go function that sums the even numbers in a slice.",
    "Write a Rust function that returns the length of the longest word in a string.",
    "Write a Python function that validates a password: at least eight characters, one digit and one capital letter.",
    "Write a TypeScript interface for a user with a name, an email and an optional age.",
    "Write a Python function that splits a list into chunks of a given size.",
    "Write a bash one-liner that finds all files larger than 100 MB in the home directory.",
    "Write a C++ function that checks whether a year is a leap year.",
    "Write a Python function that returns the second largest number in a list.",
    "Write a JavaScript function that debounces another function.",
    "Write a Python function that counts how often each character appears in a string.",
    "Write an HTML page with a form that asks for a name and an email address.",
    "Write a Python function that rotates a list by k positions to the right.",
]
LONG_QUESTIONS = [
    "How many samples did the laboratory take, and why did the number increase?",
    "What are the main risks the board sees for next year?",
    "How much will a typical household pay more per year after the price increase?",
    "Summarise what happened with the smart meter project.",
    "What does the utility plan to do next year, and how much will it invest?",
    "What did customers ask for most often, and what did the utility change as a result?",
    "How did the utility's staffing change during the year?",
    "Write a short email to residents that explains the report's three most important points.",
]
# Unusual system prompts, unlike the training personas (prompts.SYSTEMS), with the model's template.
ODD_SYSTEMS = [
    "Reply only with a JSON object with the keys \"answer\" and \"confidence\".",
    "You are a sports commentator. Describe everything as if it were a live match.",
    "You are a medieval knight. Speak in old-fashioned English and address the user as 'my liege'.",
    "Answer like a telegram: short phrases, capital letters, and STOP after each sentence.",
    "You are the customer support assistant of Lumen Bank. Be polite, never give financial advice, "
    "and end every answer by asking whether there is anything else you can help with.",
    "You are a grumpy cat who reluctantly helps humans.",
    "Write every answer as a recipe, with ingredients and numbered steps.",
    "You are a tour guide in the year 2300, and everything you explain is ancient history to you.",
]
KINDS = ("chat", "code", "long context", "perturbed format")
# the two halves of "perturbed format", on request, to tell which perturbation a difference comes from
OTHER_TEMPLATES, UNUSUAL_SYSTEMS = "other templates", "unusual system prompts"
# on request: the long-context questions after three documents (~4,400 tokens), the report last
LONGER_CONTEXT = "longer context"
TRAINING_PROMPTS = "training prompts"


def eval_requests(kind: str, drafter: str, k: int, max_tokens: int) -> list[GenerationRequest]:
    make = lambda prompt, template="model", system=None: GenerationRequest(
        prompt=prompt, system=system, drafter=drafter, k=k, max_tokens=max_tokens, template=template)
    if kind == "chat":
        return [make(p) for p in CHAT]
    if kind == "code":
        return [make(p) for p in CODE]
    if kind == "long context":
        return [make(long_document_prompt(q)) for q in LONG_QUESTIONS]
    if kind == LONGER_CONTEXT:
        return [make(documents_prompt(q)) for q in LONG_QUESTIONS]
    if kind == "perturbed format":
        return (eval_requests(OTHER_TEMPLATES, drafter, k, max_tokens)
                + eval_requests(UNUSUAL_SYSTEMS, drafter, k, max_tokens))
    if kind == OTHER_TEMPLATES:
        return [make(p, template) for p in CHAT[:8] for template in ("plain", "markdown")]
    if kind == UNUSUAL_SYSTEMS:
        return [make(p, system=system) for p, system in zip(CHAT[8:], ODD_SYSTEMS)]
    if kind == TRAINING_PROMPTS:
        single_turn = [i for i in range(2 * len(PROMPT_KINDS)) if PROMPT_KINDS[i % len(PROMPT_KINDS)] != "multiturn"]
        return [_training_request(conversation(i), drafter, k, max_tokens) for i in single_turn[:6]]
    raise KeyError(kind)


def documents_prompt(question: str) -> str:
    documents = "\n\n".join(path.read_text() for path in DOCUMENTS.values())
    return f"Read these three documents and answer the question after them.\n\n{documents}\n\nQuestion: {question}"


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
    counts: tuple[tuple[int, int], ...]   # per prompt: (accepted drafts, drafting steps)

    def tau_interval(self) -> tuple[float, float]:
        """95% bootstrap interval of the pooled tau over this kind's prompts."""
        return bootstrap_interval(lambda idx: pooled_tau([self.counts[i] for i in idx]), len(self.counts))


def evaluate(engine, drafters: list[str], k: int = 5, max_tokens: int = 128, kinds=KINDS,
             prompts: int | None = None) -> list[EvalRow]:
    """One row per kind and drafter; tau and acceptance pooled over the kind's steps (its first
    `prompts` prompts, or all)."""
    if prompts is not None and prompts < 1:
        raise PlaygroundError(f"--prompts must be at least 1, got {prompts}")
    rows = []
    for kind in kinds:
        for name in drafters:
            runs = [reconcile(list(engine.generate(r))) for r in eval_requests(kind, name, k, max_tokens)[:prompts]]
            answer = torch.tensor([t for run in runs for e in run for t in e.token_ids], dtype=torch.long)
            drafter, _ = engine.drafters.get(name)
            draftable = float(drafter.t2d[answer].float().mean()) if drafter is not None else float("nan")
            rows.append(EvalRow(name, kind, pool(runs), draftable, tuple(drafting_counts(run) for run in runs)))
    return rows


def format_rows(rows: list[EvalRow]) -> str:
    lines = ["| kind | drafter | prompts | min prompt tokens | tau | tau 95% CI | acceptance by depth "
             "| sink attention by depth | fed-back RMS by depth | draftable |",
             "|---|---|---:|---:|---:|---|---|---|---|---:|"]
    fmt = lambda xs, f="{:.2f}": " ".join(f.format(x) for x in xs)
    for r in rows:
        p = r.pooled
        lines.append(f"| {r.kind} | {r.drafter} | {p.runs} | {p.min_prompt_tokens} | {p.mean_acceptance_length:.2f} | "
                     f"{'{:.2f}-{:.2f}'.format(*r.tau_interval())} | {fmt(p.acceptance)} | "
                     f"{fmt(p.sink_attention, '{:.3f}')} | {fmt(p.hidden_norm)} | {r.draftable:.3f} |")
    return "\n".join(lines)


def tau_ratios(rows: list[EvalRow]) -> list[tuple[str, str, str, float, tuple[float, float]]]:
    """Per kind, tau of each later drafter over the first one's, with a 95% paired bootstrap
    interval: the drafters answered the same prompts (and, greedy, the same tokens), so a
    resample draws the same prompts for both."""
    ratios = []
    for kind in dict.fromkeys(r.kind for r in rows):
        base, *others = [r for r in rows if r.kind == kind]
        for other in others:
            ratio = lambda idx: (pooled_tau([other.counts[i] for i in idx])
                                 / pooled_tau([base.counts[i] for i in idx]))
            ratios.append((kind, other.drafter, base.drafter, ratio(range(len(base.counts))),
                           bootstrap_interval(ratio, len(base.counts))))
    return ratios


def format_ratios(rows: list[EvalRow]) -> str:
    ratios = tau_ratios(rows)
    if not ratios:
        return ""
    lines = ["| kind | tau ratio | value | 95% CI |", "|---|---|---:|---|"]
    lines += [f"| {kind} | {a} / {b} | {value:.2f} | {lo:.2f}-{hi:.2f} |" for kind, a, b, value, (lo, hi) in ratios]
    return "\n".join(lines)


def write_figures(rows: list[EvalRow], path: Path) -> None:
    """Per kind, a row of the drafters' acceptance, sink attention and fed-back RMS by depth, in one
    standalone HTML file."""
    figs = []
    for kind in dict.fromkeys(r.kind for r in rows):
        pooled = {r.drafter: r.pooled for r in rows if r.kind == kind}
        figs += [figures.by_depth({n: p.acceptance for n, p in pooled.items()}, f"{kind}: acceptance by depth",
                                  "acceptance rate", [0, 1.05]),
                 figures.by_depth({n: p.sink_attention for n, p in pooled.items()},
                                  f"{kind}: attention to the sink tokens", "attention mass"),
                 figures.by_depth({n: p.hidden_norm for n, p in pooled.items()}, f"{kind}: fed-back state RMS", "RMS")]
    figures.html_page(figs, "Drafter evaluation by depth", path, columns=3)   # a row per kind
