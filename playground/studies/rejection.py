"""What predicts a rejected draft: every draft the target verified, with what the drafter showed
when it drafted it, and how well each signal separates the accepted drafts from the rejected ones.

    python -m playground bench rejection [--drafters eagle3 eagle3.1] [--k 5] [--max-tokens 128]
                                         [--prompts N] [--out assets/benchmark/rejection]

The prompts are the shipped sample (assets/prompts/chat.jsonl) and the held-out sets (chat, code,
long context, perturbed formats), greedy, through evaluation.runner. A draft counts once the target
verified it: the accepted ones and the first rejected one of each step (those after it were never
checked). For each drafter, depth and signal (draft probability, sink attention, own-draft attention,
fed-back RMS) the report gives the AUC: the chance that an accepted draft's value is higher than a
rejected draft's at the same depth (0.5: the signal tells nothing; below 0.5: higher values go with
rejection), with a 95% bootstrap interval over prompts. Beside it: the acceptance rate by the signal's
quartile within each depth; the within-prompt AUC, over pairs of drafts from the same prompt only
(what a signal tells beyond which prompt a draft came from: prompts differ in how much is accepted
and in their signals' levels alike); a negative control, the band where 95% of the probability's
AUCs fall when each prompt's verdicts at that depth are shuffled among its own drafts (what "no
information beyond the prompt" looks like at that many drafts: a signal outside it tells something);
and whether attention and RMS add anything to the probability: logistic
models of probability (and depth) with and without them, fitted on other prompts than they are scored
on (prompts in five folds), and the paired difference of their AUCs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from playground.engines.intervals import bootstrap_interval
from playground.engines.quantities import REST_ATTENTION
from playground.engines.reference import ReferenceEngine
from playground.evaluation import runner
from playground.evaluation.heldout import kind_prompts
from playground.evaluation.machine import machine
from playground.evaluation.runner import Method, PromptResult
from playground.evaluation.tables import write_results
from playground.model.variants import EAGLE3, EAGLE31
from playground.prompts.files import read_prompt_file
from playground.prompts.sets import EVAL_KINDS
from playground.studies.rejection_report import (DRIFT, SIGNALS, AddedValue, AucRow, DrafterVerdicts, RejectionReport,
                                                 markdown)

# the model's inputs: the attention on the rest of the context is what sink and own leave, so it adds nothing
# to a model that has both
MODEL_INPUTS = tuple(name for name in DRIFT if name != REST_ATTENTION.name)
SAMPLE = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "chat.jsonl"
SAVED_FORMAT = 1
FOLDS = 5
SEED = 0
SHUFFLES = 200   # of the verdicts, for the control's band


@dataclass(frozen=True)
class RejectionConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)
    kinds: tuple[str, ...] = (EVAL_KINDS["chat"], EVAL_KINDS["code"], EVAL_KINDS["long-context"],
                              EVAL_KINDS["perturbed"])
    k: int = 5
    max_tokens: int = 128
    prompts: int | None = None            # per held-out kind, and of the sample (None: all)


def prompt_set(config: RejectionConfig) -> list:
    sample = read_prompt_file(SAMPLE).prompts[:config.prompts]
    return [*sample, *(p for kind in config.kinds for p in kind_prompts(kind, config.prompts))]


def collect(config: RejectionConfig, progress: Path | None = None) -> list[PromptResult]:
    """Every prompt through every drafter on the embedded engine, keeping each run's verified drafts."""
    methods = [Method(drafter, drafter, config.k) for drafter in config.drafters]
    return runner.run(ReferenceEngine.load(), prompt_set(config), methods, config.max_tokens, progress,
                      [SAVED_FORMAT, asdict(config)], "rejection", keep_drafts=True)


def auc(higher: np.ndarray, lower: np.ndarray) -> float:
    """P(a value of `higher` exceeds one of `lower`), ties counting half (Mann-Whitney U over the pairs)."""
    if not len(higher) or not len(lower):
        return float("nan")
    values = np.concatenate([higher, lower])
    _, where, counts = np.unique(values, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[where]   # tied values share their mean rank
    n = len(higher)
    return float((ranks[:n].sum() - n * (n + 1) / 2) / (n * len(lower)))


@dataclass(frozen=True)
class Drafts:
    """One drafter's verified drafts: a row each, with the prompt it came from."""
    prompt: np.ndarray                    # the prompt's place in the results
    depth: np.ndarray
    accepted: np.ndarray                  # bool
    signals: dict[str, np.ndarray]        # by SIGNALS name; NaN where not reported

    @classmethod
    def of(cls, results: Sequence[PromptResult], method: str) -> Drafts:
        rows = [(i, d) for i, r in enumerate(results) for d in r.drafts.get(method, ())]
        value = lambda d, name: np.nan if d.value(name) is None else d.value(name)
        return cls(np.array([i for i, _ in rows], dtype=int), np.array([d.depth for _, d in rows], dtype=int),
                   np.array([d.accepted for _, d in rows], dtype=bool),
                   {name: np.array([value(d, name) for _, d in rows], dtype=float) for name in SIGNALS})

    def at(self, depth: int) -> np.ndarray:
        return self.depth == depth


def _by_prompt(mask: np.ndarray, drafts: Drafts, units: int) -> list[np.ndarray]:
    """The row indices of `mask` grouped by prompt, so that a bootstrap resample gathers whole prompts."""
    rows = np.flatnonzero(mask)
    return [rows[drafts.prompt[rows] == u] for u in range(units)]


def over_resamples(score, groups: list[np.ndarray]):
    """A bootstrap statistic: `score` of the groups (prompts' rows) each resample draws, a value per resample."""
    return lambda resamples: np.array([score([groups[u] for u in row]) for row in np.atleast_2d(resamples)])


def auc_statistic(values: np.ndarray, accepted: np.ndarray, groups: list[np.ndarray]):
    """A bootstrap statistic: the AUC of `values` between accepted and rejected rows of the resampled prompts."""
    def pooled(drawn: list[np.ndarray]) -> float:
        picked = np.concatenate(drawn)
        return auc(values[picked][accepted[picked]], values[picked][~accepted[picked]])
    return over_resamples(pooled, groups)


def within_prompt_auc(values: np.ndarray, accepted: np.ndarray, groups: list[np.ndarray]) -> float:
    """The AUC over pairs of an accepted and a rejected draft of the same prompt (group), pooled over
    prompts: each prompt's pairs count once, a prompt without both kinds adds none."""
    concordant = pairs = 0.0
    for rows in groups:
        ok, no = values[rows][accepted[rows]], values[rows][~accepted[rows]]
        if len(ok) and len(no):
            concordant += auc(ok, no) * len(ok) * len(no)
            pairs += len(ok) * len(no)
    return concordant / pairs if pairs else float("nan")


def within_statistic(values: np.ndarray, accepted: np.ndarray, groups: list[np.ndarray]):
    """within_prompt_auc as a bootstrap statistic over resampled prompts"""
    return over_resamples(lambda drawn: within_prompt_auc(values, accepted, drawn), groups)


def shuffled_within(accepted: np.ndarray, groups: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """The verdicts with each prompt's shuffled among its own rows: every prompt keeps its count accepted."""
    shuffled = accepted.copy()
    for rows in groups:
        shuffled[rows] = rng.permutation(accepted[rows])
    return shuffled


def interval_of(statistic, units: int, resamples: int) -> tuple[float, float]:
    return bootstrap_interval(lambda idx: np.nan_to_num(statistic(idx), nan=0.5), units, resamples=resamples)


def depth_rows(drafts: Drafts, units: int, depths: int, resamples: int) -> list[AucRow]:
    """Per depth and signal: the AUC with its interval, the within-prompt AUC with its own, the counts,
    and the shuffled-verdict controls (pooled, and within prompts)."""
    rows, shuffle = [], np.random.default_rng(SEED)
    for depth in range(1, depths + 1):
        at = drafts.at(depth)
        for name in SIGNALS:
            reported = at & ~np.isnan(drafts.signals[name])
            if len(np.unique(drafts.signals[name][reported])) < 2:   # unreported, or one value (at depth 1
                continue                                               # there are no own drafts to attend to)
            groups, values = _by_prompt(reported, drafts, units), drafts.signals[name]
            statistic = auc_statistic(values, drafts.accepted, groups)
            within = within_statistic(values, drafts.accepted, groups)
            row = AucRow(depth, name, int(drafts.accepted[reported].sum()), int((~drafts.accepted[reported]).sum()),
                         float(statistic(np.arange(units))[0]), interval_of(statistic, units, resamples),
                         quartile_rates(values[reported], drafts.accepted[reported]),
                         float(within(np.arange(units))[0]), interval_of(within, units, resamples))
            if name == "probability":   # the negative controls, on the strongest signal
                verdicts = drafts.accepted[reported]
                null = [auc(values[reported][v], values[reported][~v])
                        for v in (shuffle.permutation(verdicts) for _ in range(SHUFFLES))]
                null_within = [auc(values[reported][v[reported]], values[reported][~v[reported]])
                               for v in (shuffled_within(drafts.accepted, groups, shuffle) for _ in range(SHUFFLES))]
                row = replace(row, null_auc=float(np.mean(null)), null_band=_band(null),
                              null_within_auc=float(np.mean(null_within)), null_within_band=_band(null_within))
            rows.append(row)
    return rows


def _band(values: list[float]) -> list[float]:
    return [float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))]


def quartile_rates(values: np.ndarray, accepted: np.ndarray) -> list[float | None]:
    """The acceptance rate among the drafts in each quartile of `values` (lowest first)."""
    order = np.argsort(values, kind="stable")
    return [float(accepted[part].mean()) if len(part) else None for part in np.array_split(order, 4)]


def features(drafts: Drafts, names: Sequence[str], depths: int) -> np.ndarray:
    """The models' inputs, a row per draft: the depth (one-hot) and the named signals standardised over all
    drafts (the log of the probability; a missing value is the mean)."""
    one_hot = np.eye(depths)[drafts.depth - 1]
    columns = []
    for name in names:
        x = drafts.signals[name]
        x = np.log(np.clip(x, 1e-6, None)) if name == "probability" else x
        columns.append(np.nan_to_num((x - np.nanmean(x)) / (np.nanstd(x) or 1.0)))
    return np.column_stack([one_hot, *columns])


def fit_logistic(x: np.ndarray, y: np.ndarray, ridge: float = 1e-2, steps: int = 25) -> np.ndarray:
    """Weights of a ridge-penalised logistic regression (Newton's method)."""
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(x @ w)))
        gradient = x.T @ (p - y) + ridge * w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + ridge * np.eye(len(w))
        w -= np.linalg.solve(hessian, gradient)
    return w


def out_of_fold_scores(drafts: Drafts, names: Sequence[str], units: int, depths: int) -> np.ndarray:
    """Each draft's score from a model fitted on the other folds' prompts."""
    folds = np.random.default_rng(SEED).permutation(units) % FOLDS
    x, scores = features(drafts, names, depths), np.full(len(drafts.depth), np.nan)
    for fold in range(FOLDS):
        held = folds[drafts.prompt] == fold
        if not held.any() or held.all():
            continue
        w = fit_logistic(x[~held], drafts.accepted[~held].astype(float))
        scores[held] = x[held] @ w
    return scores


def added_value(drafts: Drafts, units: int, depths: int, resamples: int) -> AddedValue:
    """AUC of probability (and depth) alone, with attention and RMS added, and their paired difference."""
    base = out_of_fold_scores(drafts, ["probability"], units, depths)
    full = out_of_fold_scores(drafts, ["probability", *MODEL_INPUTS], units, depths)
    groups = _by_prompt(~np.isnan(base), drafts, units)
    alone, both = (auc_statistic(s, drafts.accepted, groups) for s in (base, full))
    gain = lambda idx: both(idx) - alone(idx)
    everything = np.arange(units)
    return AddedValue(float(alone(everything)[0]), interval_of(alone, units, resamples), float(both(everything)[0]),
                      interval_of(both, units, resamples), float(gain(everything)[0]),
                      bootstrap_interval(gain, units, resamples=resamples))


def analyse(results: Sequence[PromptResult], config: RejectionConfig, resamples: int = 1000) -> RejectionReport:
    units = len(results)
    verdicts = {}
    for drafter in config.drafters:
        drafts = Drafts.of(results, drafter)
        verdicts[drafter] = DrafterVerdicts(len(drafts.depth), depth_rows(drafts, units, config.k, resamples),
                                            added_value(drafts, units, config.k, resamples))
    return RejectionReport(asdict(config), units, verdicts)


def run(config: RejectionConfig, out: Path) -> tuple[RejectionReport, list[Path]]:
    """Measure (resuming from out/progress.pkl), analyse, and write results.json and results.md to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    results = collect(config, out / "progress.pkl")
    report = replace(analyse(results, config), machine=machine())
    return report, write_results(out, report.to_json(), markdown(report))
