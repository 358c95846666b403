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
from typing import Callable

import torch

from playground import plots
from playground.engines.intervals import bootstrap_interval, paired_ratio, tau_of
from playground.engines.quantities import DEPTH_QUANTITIES
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import Pooled
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation import runner
from playground.evaluation.runner import Method
from playground.evaluation.tables import markdown_table
from playground.model.variants import NONE, SHIPPED, run_name
from playground.prompts.sets import (EVAL_KINDS, HELDOUT_CHAT, HELDOUT_CODE, HELDOUT_LONG_QUESTIONS,
                                     HELDOUT_SYSTEMS, KINDS, LONGER_CONTEXT, OTHER_TEMPLATES, UNUSUAL_SYSTEMS,
                                     documents_prompt, report_prompt)


# kinds whose prompts are questions about the same text: one document, resampled as one unit
ONE_DOCUMENT = (EVAL_KINDS["long-context"], LONGER_CONTEXT)


def eval_requests(kind: str, drafter: str, k: int, max_tokens: int) -> list[GenerationRequest]:
    make = lambda prompt, template="model", system=None: GenerationRequest(
        prompt=prompt, system=system, drafter=drafter, k=k, max_tokens=max_tokens, template=template)
    if kind == EVAL_KINDS["chat"]:
        return [make(p) for p in HELDOUT_CHAT]
    if kind == EVAL_KINDS["code"]:
        return [make(p) for p in HELDOUT_CODE]
    if kind == EVAL_KINDS["long-context"]:
        return [make(report_prompt(q)) for q in HELDOUT_LONG_QUESTIONS]
    if kind == LONGER_CONTEXT:
        return [make(documents_prompt(q)) for q in HELDOUT_LONG_QUESTIONS]
    if kind == EVAL_KINDS["perturbed"]:
        return (eval_requests(OTHER_TEMPLATES, drafter, k, max_tokens)
                + eval_requests(UNUSUAL_SYSTEMS, drafter, k, max_tokens))
    if kind == OTHER_TEMPLATES:
        return [make(p, template) for p in HELDOUT_CHAT[:8] for template in ("plain", "markdown")]
    if kind == UNUSUAL_SYSTEMS:
        return [make(p, system=system) for p, system in zip(HELDOUT_CHAT[8:], HELDOUT_SYSTEMS)]
    raise KeyError(kind)


@dataclass(frozen=True)
class EvalRow:
    drafter: str
    kind: str
    pooled: Pooled
    draftable: float   # share of the answer tokens inside the drafter's draft vocabulary: the others cannot be accepted
    counts: tuple[tuple[int, int], ...]   # per document: (accepted drafts, drafting steps), summed over its prompts
    draft: str = "chain"                  # chain | tree (the TreeShape evaluate was given)
    variant: str = ""                     # the drafter's switches named (eagle3, eagle3.1); "" for none

    @property
    def label(self) -> str:
        return self.drafter if self.draft == "chain" else f"{self.drafter} {self.draft}"

    def tau_interval(self) -> tuple[float, float] | None:
        """95% bootstrap interval of the pooled tau over this kind's documents (a prompt is its own document
        unless the kind asks about one text); None for one document, where none can be drawn."""
        return bootstrap_interval(tau_of(self.counts), len(self.counts)) if len(self.counts) > 1 else None


@dataclass(frozen=True)
class EvalPrompt:
    """The prompt at `index` of a kind, as `requests(kind, drafter, k, max_tokens)` makes it."""
    kind: str
    index: int
    requests: Callable[[str, str, int, int], list[GenerationRequest]] = eval_requests

    @property
    def id(self) -> str:
        return f"{self.kind} {self.index + 1}"

    @property
    def category(self) -> str:
        return self.kind

    @property
    def document(self) -> str:
        """What the prompt is about, as a unit of resampling: its kind's one text, or the prompt itself."""
        return self.kind if self.kind in ONE_DOCUMENT else self.id

    def request(self, drafter: str, k: int, max_tokens: int) -> GenerationRequest:
        return self.requests(self.kind, drafter, k, max_tokens)[self.index]


def kind_prompts(kind: str, prompts: int | None, requests=eval_requests) -> list[EvalPrompt]:
    """The kind's first `prompts` prompts (all of them with None)."""
    return [EvalPrompt(kind, i, requests) for i in range(len(requests(kind, NONE, 1, 1)[:prompts]))]


def evaluate(engine: ReferenceEngine, drafters: list[str], k: int = 5, max_tokens: int = 128, kinds=KINDS,
             prompts: int | None = None, requests=eval_requests, tree: TreeShape | None = None) -> list[EvalRow]:
    """One row per kind and drafter (and, given a `tree`, a second one drafting that tree); tau and
    acceptance pooled over the kind's steps (its first `prompts` prompts, or all).
    `requests(kind, drafter, k, max_tokens)` gives a kind's requests."""
    if prompts is not None and prompts < 1:
        raise PlaygroundError(f"--prompts must be at least 1, got {prompts}")
    drafts = [("chain", None)] + ([("tree", tree)] if tree is not None else [])
    methods = [(Method(name if shape is None else run_name(name, draft), name, k, shape), draft)
               for name in drafters for draft, shape in drafts]
    rows = []
    for kind in kinds:
        asked = kind_prompts(kind, prompts, requests)
        measured = [u.result for u in runner.measure(engine, asked, [m for m, _ in methods], max_tokens) if u.result]
        answer = torch.tensor([t for r in measured for t in r.answer], dtype=torch.long)
        for method, draft in methods:
            drafter = engine.drafter(method.drafter)
            draftable = float(drafter.t2d[answer].float().mean()) if drafter is not None else float("nan")
            totals = [r.runs[method.name] for r in measured]
            per_document = runner.by_document(measured, method.name)
            rows.append(EvalRow(method.drafter, kind, Pooled.of(totals), draftable,
                                tuple(t.counts for t in per_document), draft,
                                drafter.config.variant if drafter is not None else ""))
    return rows


def _interval(ci: tuple[float, float] | None) -> str:
    return "{:.2f}-{:.2f}".format(*ci) if ci is not None else "– (one document)"


def format_rows(rows: list[EvalRow]) -> str:
    head = ["kind", "drafter", "prompts", "min prompt tokens", "tau", "tau 95% CI", "acceptance by depth",
            *(f"{q.label} by depth" for q in DEPTH_QUANTITIES), "draftable"]
    return markdown_table(head, ([r.kind, r.label, r.pooled.runs, r.pooled.min_prompt_tokens,
                                  f"{r.pooled.mean_acceptance_length:.2f}", _interval(r.tau_interval()),
                                  " ".join(f"{x:.2f}" for x in r.pooled.acceptance),
                                  *(" ".join(map(q.format, r.pooled.mean(q))) for q in DEPTH_QUANTITIES),
                                  f"{r.draftable:.3f}"] for r in rows))


def tau_ratio(a: EvalRow, b: EvalRow) -> tuple[float, tuple[float, float] | None]:
    """tau of `a` over tau of `b`, with a 95% paired bootstrap interval over documents (None for one):
    both answered the same prompts (and, greedy, with the same tokens)."""
    value, ci = paired_ratio(tau_of(a.counts), tau_of(b.counts), len(b.counts))
    return value, ci if len(b.counts) > 1 else None


def tau_ratios(rows: list[EvalRow]) -> list[tuple[str, str, str, float, tuple[float, float] | None]]:
    """Per kind, each later drafter's chain tau over the first one's, and a trained drafter's (a checkpoint
    folder) over the shipped drafter of its variant where both ran and that one is not the first (a
    retrained pair against the pair it replaces); then, where trees were drafted, each drafter's tree tau
    over its chain tau."""
    ratios = []
    for kind in dict.fromkeys(r.kind for r in rows):
        base, *others = [r for r in rows if r.kind == kind and r.draft == "chain"]
        ratios += [(kind, other.drafter, base.drafter, *tau_ratio(other, base)) for other in others]
        shipped = {r.drafter: r for r in others if r.drafter in SHIPPED}
        ratios += [(kind, other.drafter, other.variant, *tau_ratio(other, shipped[other.variant]))
                   for other in others if other.drafter not in SHIPPED and other.variant in shipped]
    chains = {(r.kind, r.drafter): r for r in rows if r.draft == "chain"}
    ratios += [(r.kind, r.label, f"{r.drafter} chain", *tau_ratio(r, chains[r.kind, r.drafter]))
               for r in rows if r.draft != "chain"]
    return ratios


def format_ratios(rows: list[EvalRow]) -> str:
    ratios = tau_ratios(rows)
    if not ratios:
        return ""
    return markdown_table(["kind", "tau ratio", "value", "95% CI"],
                          ([kind, f"{a} / {b}", f"{value:.2f}", _interval(ci)] for kind, a, b, value, ci in ratios))


def write_figures(rows: list[EvalRow], path: Path) -> None:
    """Per kind, a row of the drafters' acceptance and each DEPTH_QUANTITIES value by depth, in one
    standalone HTML file."""
    figs = []
    for kind in dict.fromkeys(r.kind for r in rows):
        pooled = {r.label: r.pooled for r in rows if r.kind == kind}
        figs += [plots.by_depth({n: p.acceptance for n, p in pooled.items()}, f"{kind}: acceptance by depth",
                                  "acceptance rate", [0, 1.05]),
                 *(plots.by_depth({n: p.mean(q) for n, p in pooled.items()}, f"{kind}: {q.label}", q.unit)
                   for q in DEPTH_QUANTITIES)]
    plots.html_page(figs, "Drafter evaluation by depth", path, columns=1 + len(DEPTH_QUANTITIES))   # a row per kind
