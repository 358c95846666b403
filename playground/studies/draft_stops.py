"""`python -m playground bench draft-stop`: chains that end at a rule (engines/draft_stop.py) against
fixed k, on the embedded engine, greedy.

    python -m playground bench draft-stop [--drafters ...] [--draft-stop RULE] [--prompts 8] [--documents 2]

First each rule's threshold is chosen, per drafter and signal, on held-out chat and code prompts
(prompts.sets' HELDOUT_CHAT and HELDOUT_CODE, less any prompt of the chat sample): every candidate of
CANDIDATES with chains of up to LONGEST drafts, the one of highest tokens/s kept. Then on prompts the
choice never saw, the shipped chat sample and the suite's long documents, fixed k=5, 1, 2 and 10 and
the chosen rules answer every prompt back to back (the machine's drift falls on all alike).

A row gives tau (over the steps that drafted, as everywhere) and the tokens per verify step (over
every step: a rule that drops a depth's first draft leaves a step that drafts nothing yet runs the
target once, which tau leaves out), tokens/s (engine time) against k=5 paired over prompts with a 95%
interval, the drafts the target refused per step (drafted, not accepted), and the draft and verify ms
per step. A greedy chain of fixed k drafts in one call (kernels/eagle_step.cpp's eagle_chain) where a
chain under a rule drafts one call per depth, to look at each draft: the row "k=5, a call per depth"
(a rule that never holds) measures that difference alone. Every method's answer is checked against
k=5's, token for token. `--draft-stop RULE` measures that rule and skips the choice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

from playground.engines.draft_stop import DraftStop
from playground.engines.reference import ReferenceEngine
from playground.engines.intervals import paired_ratio, rate_of
from playground.engines.stats import Pooled, RunTotals, rate_of_runs
from playground.evaluation import runner
from playground.evaluation.heldout import kind_prompts
from playground.evaluation.machine import machine
from playground.evaluation.runner import Method, PromptResult
from playground.evaluation.tables import write_results
from playground.model.variants import EAGLE3, EAGLE31
from playground.prompts.files import read_prompt_file
from playground.prompts.sets import EVAL_KINDS, suite
from playground.studies.draft_stop_report import DraftStopReport, StopRow, markdown
from playground.studies.rejection import SAMPLE

LONGEST = 10
FIXED = (5, 1, 2, LONGEST)   # k=5 first: every ratio's base; k=1 and 2: the fastest of the suite's sweep on 2 cores
CANDIDATES = {"probability": ("probability<0.1", "probability<0.3", "probability<0.5", "probability<0.7",
                              "probability<0.9"),
              "self_attention": ("self_attention>0.1", "self_attention>0.2", "self_attention>0.3")}
NEVER = DraftStop.parse("probability<0")
DOCUMENTS = ("long context 1k", "long context 2k", "long context 4k")


@dataclass(frozen=True)
class DraftStopConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)
    rules: tuple[str, ...] = ()   # given: measured without a choice
    prompts: int = 8              # held-out prompts per kind for the choice, and of the chat sample
    documents: int = 2            # per long-document category (0: none)
    max_tokens: int = 128


def fixed(k: int, drafter: str) -> Method:
    return Method(f"k={k}", drafter, k)


def per_depth(k: int, drafter: str) -> Method:
    """Fixed k, drafted one call per depth as a chain under a rule is (NEVER holds)."""
    return Method(f"k={k}, a call per depth", drafter, k, draft_stop=NEVER)


def ruled(rule: str, drafter: str) -> Method:
    return Method(f"k<={LONGEST} until {rule}", drafter, LONGEST, draft_stop=DraftStop.parse(rule))


def choice_prompts(config: DraftStopConfig) -> list:
    sample = {p.prompt for p in read_prompt_file(SAMPLE).prompts}
    return [p for kind in (EVAL_KINDS["chat"], EVAL_KINDS["code"]) for p in kind_prompts(kind, config.prompts)
            if p.request("none", 1, 1).prompt not in sample]


def evaluation_sets(config: DraftStopConfig, tokenizer) -> dict[str, list]:
    sets = {"chat sample": read_prompt_file(SAMPLE).prompts[:config.prompts]}
    if config.documents:
        sets["long documents"] = suite(tokenizer, DOCUMENTS, config.documents)
    return sets


def choose(engine, drafter: str, config: DraftStopConfig, progress: Path | None = None
           ) -> tuple[list[StopRow], list[str]]:
    """Every candidate on the held-out prompts (k=5 beside them): rows, and the fastest rule per signal."""
    methods = [fixed(5, drafter)] + [ruled(rule, drafter) for rules in CANDIDATES.values() for rule in rules]
    results = _measured(engine, choice_prompts(config), methods, config, progress, f"choice {drafter}")
    rows = [_row("held-out chat and code", drafter, m, results, methods[0]) for m in methods]
    chosen = [max((r for r in rows if r.rule in rules), key=lambda r: r.tokens_per_s).rule
              for rules in CANDIDATES.values()]
    return rows, chosen


def evaluate(engine, drafter: str, rules: Sequence[str], config: DraftStopConfig, progress: Path | None = None
             ) -> list[StopRow]:
    methods = [fixed(k, drafter) for k in FIXED] + [per_depth(5, drafter)] + [ruled(rule, drafter) for rule in rules]
    rows = []
    for name, prompts in evaluation_sets(config, engine.tokenizer).items():
        results = _measured(engine, prompts, methods, config, progress, f"{name} {drafter}")
        rows += [_row(name, drafter, m, results, methods[0]) for m in methods]
    return rows


def _measured(engine, prompts: list, methods: list[Method], config: DraftStopConfig, progress: Path | None,
              stage: str) -> list[PromptResult]:
    """The prompts through every method, saved after each prompt under `progress` (a folder) where given."""
    path = progress / f"progress-{stage.replace(' ', '-')}.pkl" if progress else None
    results = runner.run(engine, prompts, methods, config.max_tokens, path, [asdict(config), stage,
                         [m.name for m in methods]], stage)
    return [r for r in results if not r.skipped]


def _row(prompt_set: str, drafter: str, method: Method, results: list[PromptResult], base: Method) -> StopRow:
    """The method against `base` on the prompts, its intervals over their units (the questions about one
    long document resampled together)."""
    runs: list[RunTotals] = [r.runs[method.name] for r in results]
    units = runner.by_unit(results)
    unit_runs, unit_bases = [u.runs[method.name] for u in units], [u.runs[base.name] for u in units]
    pooled = Pooled.of(runs)
    speedup, speedup_ci = paired_ratio(rate_of_runs(unit_runs), rate_of_runs(unit_bases), len(units))
    per_step = lambda totals: rate_of([r.decode_tokens for r in totals], [r.verify_steps for r in totals])
    step_ratio, step_ratio_ci = paired_ratio(per_step(unit_runs), per_step(unit_bases), len(units))
    steps = max(1, pooled.steps)
    rule = method.draft_stop if method.draft_stop != NEVER else None
    return StopRow(prompt_set, drafter, method.name, method.k, str(rule) if rule else None, len(runs),
                   pooled.mean_acceptance_length, sum(r.decode_tokens for r in runs) / steps, step_ratio,
                   list(step_ratio_ci), pooled.tokens_per_s, speedup, list(speedup_ci),
                   sum(r.drafted for r in runs) / steps, sum(r.drafted - r.accepted for r in runs) / steps,
                   pooled.draft_ms, pooled.verify_ms,
                   sum(1 for r in results if any(m == method.name for m, _ in r.mismatches)), len(units))


def measure(engine, config: DraftStopConfig = DraftStopConfig(), progress: Path | None = None) -> DraftStopReport:
    """The choice (unless rules were given) and the evaluation. With `progress` (a folder), each stage is
    saved prompt by prompt, and the same call goes on after an interruption."""
    choice, chosen, evaluation = [], {}, []
    for drafter in config.drafters:
        if config.rules:
            chosen[drafter] = list(config.rules)
        else:
            rows, chosen[drafter] = choose(engine, drafter, config, progress)
            choice += rows
        evaluation += evaluate(engine, drafter, chosen[drafter], config, progress)
    return DraftStopReport(choice, chosen, evaluation, asdict(config))


def run(config: DraftStopConfig, out: Path) -> tuple[DraftStopReport, list[Path]]:
    """Measure on the embedded engine; write results.json and results.md to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    result = replace(measure(ReferenceEngine.load(), config, out), machine=machine())
    return result, write_results(out, result.to_json(), markdown(result))
