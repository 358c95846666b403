"""`python -m playground bench`: the prompt suite through every drafter, side by side in one run.

    python -m playground bench [--categories ...] [--per-category 2] [--drafters ...] [--k 5] [--out DIR]
    python -m playground bench --backend vllm [--vllm-url NAME=URL ...]   # or the servers it starts

For each prompt the methods run back to back (transformers' generate, no speculation, each
drafter's chain, then its draft tree), so machine drift hits them alike; rates are pooled per
category. At temperature 0 all must emit the same tokens; any difference is recorded and reported,
never hidden.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING


from playground.engines.protocol import Engine
from playground.engines.reference import ReferenceEngine
from playground.engines.intervals import bootstrap_interval
from playground.engines.stats import Pooled
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation import drift_signals, report, runner
from playground.evaluation.bench_report import BenchReport, ChainVsTree, Mismatch, MethodRow, SweepRow
from playground.evaluation.ceiling import Ceiling, measure as measure_ceiling
from playground.evaluation.generate_baseline import transformers_greedy
from playground.evaluation.machine import machine
from playground.evaluation.runner import Method, PromptResult
from playground.model.variants import EAGLE3, EAGLE31, NONE, run_name
from playground.prompts.sets import CATEGORIES, BenchPrompt, suite

if TYPE_CHECKING:   # the vLLM client is imported only where the vLLM backend runs
    from playground.evaluation.vllm_load import Servers


@dataclass(frozen=True)
class BenchConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)
    k: int | str = 5                   # or "auto": each prompt's chain at the k this host's costs choose
    max_tokens: int = 128
    categories: tuple[str, ...] = CATEGORIES
    per_category: int | None = None
    sweep_drafter: str = EAGLE31
    sweep_ks: tuple[int, ...] = tuple(range(1, 9))
    sweep_categories: tuple[str, ...] = ("chat", "coding")
    compare_generate: bool = True      # the reference backend only
    backend: str = "reference"
    tree: TreeShape | None = None   # each drafter also drafts this tree (the reference backend only)

    def tree_methods(self) -> dict[str, str]:
        """run name -> drafter, for the tree runs."""
        return {run_name(d, str(self.tree)): d for d in self.drafters} if self.tree else {}

    def runnable_on(self, engine: Engine) -> BenchConfig:
        """This configuration as `engine` runs it: the drafters it has; on vLLM servers no k sweep, no
        transformers generate and no trees (those need the embedded engine)."""
        if NONE not in engine.drafter_names:
            raise PlaygroundError("the suite measures speedups over a server without speculation: add "
                                  "--vllm-url none=URL, or run `bench vllm`")
        vllm = self.backend == "vllm"
        if vllm and self.k == "auto":
            raise PlaygroundError("--k auto chooses a chain's k on the embedded engine: not with --backend vllm")
        missing = [d for d in self.drafters if d not in engine.drafter_names and (vllm or not Path(d).is_dir())]
        if missing:
            raise PlaygroundError(f"no drafter named {', '.join(missing)} here: the backend runs "
                                  f"{', '.join(engine.drafter_names)} (pick with --drafters)")
        return replace(self, sweep_ks=() if vllm else self.sweep_ks, compare_generate=self.compare_generate and not vllm,
                       tree=None if vllm else self.tree)


SAVED_FORMAT = 3   # of the measured prompts a rerun goes on from: another format starts afresh


def sweep_name(drafter: str, k: int) -> str:
    return f"{drafter} k={k}"


def fixed_k(config: BenchConfig) -> int:
    """The k of the methods that do not choose theirs: the trees', and the chains' unless k is auto."""
    return 5 if config.k == "auto" else config.k


ChainKs = dict[tuple[str, str], tuple[str, int]]   # (prompt id, drafter) -> the drafter its chain runs, its k


def chain_ks(engine, config: BenchConfig, prompts: list[BenchPrompt]) -> ChainKs:
    """Each drafter's chain on each prompt: at config.k, or with k auto as `--k auto` would run it (the k
    this host's costs choose for the prompt's length; plain decoding where that is expected to be faster)."""
    from playground.evaluation.k_choice import chosen

    if config.k != "auto":
        return {(p.id, d): (d, config.k) for p in prompts for d in config.drafters}
    runs = {(p.id, d): chosen(engine, p.request(d, 5, config.max_tokens))[0] for p in prompts for d in config.drafters}
    return {key: (request.drafter, request.k) for key, request in runs.items()}


def methods_of(config: BenchConfig, prompt: BenchPrompt, chains: ChainKs) -> list[Method]:
    """No speculation, each drafter's chain, its tree, then (on the swept categories) the k sweep."""
    methods = [Method(NONE, NONE, fixed_k(config))]
    methods += [Method(d, *chains[prompt.id, d]) for d in config.drafters]
    methods += [Method(name, drafter, fixed_k(config), config.tree) for name, drafter in config.tree_methods().items()]
    if prompt.category in config.sweep_categories:
        methods += [Method(sweep_name(config.sweep_drafter, k), config.sweep_drafter, k) for k in config.sweep_ks]
    return methods


def collect(engine, reference, config: BenchConfig, progress: Path | None = None) -> list[PromptResult]:
    """Run the suite. `engine` streams (reference or vLLM); `reference` gives transformers' generate,
    whose answer every method must equal. With `progress`, what is measured is saved after every
    prompt and a rerun of the same configuration goes on from there."""
    prompts = suite(reference.tokenizer, config.categories, config.per_category)
    greedy = lambda p: transformers_greedy(reference, p.request(NONE, fixed_k(config), config.max_tokens))
    chains = chain_ks(engine, config, prompts)
    return runner.run(engine, prompts, lambda p: methods_of(config, p, chains), config.max_tokens, progress,
                      [SAVED_FORMAT, asdict(config)], "bench",
                      reference=greedy if config.compare_generate else None)


def _rate(runs: list[tuple[int, float]]) -> float | None:
    """Pooled tokens/s of (tokens, seconds) runs; None when there are none."""
    return sum(t for t, _ in runs) / sum(s for _, s in runs) if runs else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def results(measured: list[PromptResult], config: BenchConfig, ceiling: Ceiling | None = None,
            weights: str | None = None) -> BenchReport:
    """The report, of the prompts that ran."""
    ran = [r for r in measured if r.skipped is None]
    of = lambda categories, method: Pooled.of([r.runs[method] for r in ran if r.category in categories])
    generate_rate = lambda categories: _rate([(len(r.answer), r.reference_seconds) for r in ran
                                              if r.category in categories and r.reference_seconds is not None])
    rows, trees = [], []
    for category in dict.fromkeys(r.category for r in ran):
        pooled = {m: of((category,), m) for m in (NONE, *config.drafters, *config.tree_methods())}
        none = pooled[NONE]
        generate_tps = generate_rate((category,))
        for method in (NONE, *config.drafters):
            p = pooled[method]
            ks = Counter(r.runs[method].longest_chain for r in ran if r.category == category)
            rows.append(MethodRow(category, method, p, p.tokens_per_s / none.tokens_per_s,
                                  p.tokens_per_s / generate_tps if generate_tps else None, generate_tps,
                                  _ratio(p.decode_tokens_per_s, none.decode_tokens_per_s),
                                  {str(k): n for k, n in sorted(ks.items())}))
        trees += [ChainVsTree.of(category, drafter, method, config.tree, pooled[method], pooled[drafter], none)
                  for method, drafter in config.tree_methods().items()]
    sweep = []
    swept = [c for c in config.sweep_categories if any(r.category == c for r in ran)]
    for k in config.sweep_ks if swept else ():
        p = of(swept, sweep_name(config.sweep_drafter, k))
        none, gen_tps = of(swept, NONE), generate_rate(swept)
        sweep.append(SweepRow(k, config.sweep_drafter, p, p.tokens_per_s / none.tokens_per_s,
                              p.tokens_per_s / gen_tps if gen_tps else None))
    mismatches = [Mismatch(r.category, r.id, method, first) for r in ran for method, first in r.mismatches]
    units = runner.by_unit(ran)   # a long context's questions resampled together
    return BenchReport(asdict(config), machine(), rows, sweep, trees,
                       drift_signals.by_depth(units, config.drafters, bootstrap_interval) if ran else [], ceiling,
                       not mismatches, mismatches, weights, signal_units=len(units) if ran else None)


def run(config: BenchConfig, out: Path, servers: Servers | None = None) -> tuple[BenchReport, list[Path]]:
    """The suite on the embedded engine, or on the vLLM `servers` (backend "vllm"; then the same
    servers under load too); the report written to `out`. What is measured is saved to
    out/progress.pkl as it goes, so a rerun of the same configuration goes on from there."""
    if config.backend == "vllm" and servers is None:
        raise PlaygroundError("the suite on vLLM needs its servers: running ones or a launch spec")
    reference = ReferenceEngine.load()
    progress = out / "progress.pkl"
    if config.backend == "vllm":
        from playground.evaluation.vllm_load import LoadConfig, serving, throughput

        with serving(reference, servers) as engine:
            config = config.runnable_on(engine)
            res = replace(results(collect(engine, reference, config, progress), config),
                          concurrency=throughput(engine, LoadConfig(max_tokens=min(64, config.max_tokens), k=config.k)))
    else:
        config = config.runnable_on(reference)
        measured_ceiling = measure_ceiling(reference.target, (1, fixed_k(config) + 1))
        res = results(collect(reference, reference, config, progress), config, measured_ceiling,
                      reference.target.weights)
    paths = report.write(res, out)
    progress.unlink(missing_ok=True)
    return res, paths
