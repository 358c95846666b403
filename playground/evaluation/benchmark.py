"""`python -m playground bench`: the prompt suite through every drafter, side by side in one run.

    python -m playground bench [--categories ...] [--per-category 2] [--drafters ...] [--k 5] [--out DIR]
    python -m playground bench --backend vllm [--vllm-url NAME=URL ...]   # or the servers it starts

For each prompt the methods run back to back (transformers' generate, no speculation, each
drafter's chain, then its draft tree), so machine drift hits them alike; rates are pooled per
category. At temperature 0 all must emit the same tokens; any difference is recorded and reported,
never hidden.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from playground.engines.events import StepEvent
from playground.engines.protocol import Engine
from playground.engines.reference import ReferenceEngine
from playground.engines.stats import pool
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation import report
from playground.evaluation.checkpoint import Checkpoint
from playground.evaluation.ceiling import Ceiling, measure as measure_ceiling
from playground.evaluation.generate_baseline import transformers_greedy
from playground.evaluation.prompt_sets import CATEGORIES, BenchPrompt, suite
from playground.evaluation.trees import chain_vs_tree_row
from playground.model.variants import EAGLE3, EAGLE31, NONE, run_name

if TYPE_CHECKING:   # the vLLM client is imported only where the vLLM backend runs
    from playground.evaluation.vllm_load import Servers


@dataclass(frozen=True)
class BenchConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)
    k: int = 5
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
        missing = [d for d in self.drafters if d not in engine.drafter_names and (vllm or not Path(d).is_dir())]
        if missing:
            raise PlaygroundError(f"no drafter named {', '.join(missing)} here: the backend runs "
                                  f"{', '.join(engine.drafter_names)} (pick with --drafters)")
        return replace(self, sweep_ks=() if vllm else self.sweep_ks, compare_generate=self.compare_generate and not vllm,
                       tree=None if vllm else self.tree)


@dataclass
class Collected:
    """Everything measured: runs[(category, method)] and sweep[(category, k)], lists of event lists."""
    runs: dict[tuple[str, str], list[list[StepEvent]]] = field(default_factory=dict)
    generate: dict[str, list[tuple[int, float]]] = field(default_factory=dict)   # category -> (tokens, s)
    sweep: dict[tuple[str, int], list[list[StepEvent]]] = field(default_factory=dict)
    mismatches: list[dict] = field(default_factory=list)
    prompts_done: int = 0


def _tokens(events: list[StepEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def collect(engine, reference, config: BenchConfig, progress: Path | None = None) -> Collected:
    """Run the suite. `engine` streams (reference or vLLM); `reference` gives tokenizer and generate.

    With `progress`, what is measured is saved after every prompt and a rerun of the same
    configuration goes on from there.
    """
    prompts: list[BenchPrompt] = suite(reference.tokenizer, config.categories, config.per_category)
    methods = (NONE, *config.drafters)
    trees = config.tree_methods()
    sweeping = [p for p in prompts if p.category in config.sweep_categories] if config.sweep_ks else []

    def runs_of(p: BenchPrompt) -> int:
        return len(methods) + len(trees) + config.compare_generate + (p in sweeping) * len(config.sweep_ks)

    checkpoint = Checkpoint(progress, asdict(config)) if progress else None
    out = (checkpoint.load() if checkpoint else None) or Collected()
    with tqdm(total=sum(map(runs_of, prompts)), initial=sum(map(runs_of, prompts[:out.prompts_done])),
              desc="bench", unit="run") as bar:
        for p in prompts[out.prompts_done:]:
            expected = None
            if config.compare_generate:
                expected, seconds = transformers_greedy(reference, p.request(NONE, config.k, config.max_tokens))
                out.generate.setdefault(p.category, []).append((len(expected), seconds))
                bar.update()
            for method in methods:
                bar.set_postfix_str(f"{p.category} · {method}")
                events = list(engine.generate(p.request(method, config.k, config.max_tokens)))
                out.runs.setdefault((p.category, method), []).append(events)
                expected = _check(out, p, method, _tokens(events), expected)
                bar.update()
            for method, drafter in trees.items():
                bar.set_postfix_str(f"{p.category} · {method}")
                request = replace(p.request(drafter, config.k, config.max_tokens), tree=config.tree)
                events = list(engine.generate(request))
                out.runs.setdefault((p.category, method), []).append(events)
                _check(out, p, method, _tokens(events), expected)
                bar.update()
            if p in sweeping:
                for k in config.sweep_ks:
                    events = list(engine.generate(p.request(config.sweep_drafter, k, config.max_tokens)))
                    out.sweep.setdefault((p.category, k), []).append(events)
                    _check(out, p, f"{config.sweep_drafter} k={k}", _tokens(events), expected)
                    bar.update()
            out.prompts_done += 1
            if checkpoint:
                checkpoint.save(out)
    return out


def _check(out: Collected, p: BenchPrompt, method: str, tokens: list[int], expected: list[int] | None) -> list[int]:
    if expected is not None and tokens != expected:
        first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), min(len(tokens), len(expected)))
        out.mismatches.append({"category": p.category, "prompt": p.prompt[:60], "method": method,
                               "first_differing_token": first})
    return expected if expected is not None else tokens


def _rate(runs: list[tuple[int, float]]) -> float | None:
    """Pooled tokens/s of (tokens, seconds) runs; None when there are none."""
    return sum(t for t, _ in runs) / sum(s for _, s in runs) if runs else None


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name: runs on different hosts differ most in it (and in native bf16)."""
    line = next((line for line in _cpuinfo().splitlines() if line.startswith("model name")), "")
    return line.partition(":")[2].strip() or platform.processor() or platform.machine()


def _has_native_bf16() -> bool:
    flags = _cpuinfo()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def results(collected: Collected, config: BenchConfig, ceiling: Ceiling | None = None) -> dict:
    """The JSON the report is written from."""
    rows, trees = [], []
    for category in dict.fromkeys(c for c, _ in collected.runs):
        pooled = {method: pool(runs) for (c, method), runs in collected.runs.items() if c == category}
        none = pooled[NONE]
        generate_tps = _rate(collected.generate.get(category, []))
        for method in (NONE, *config.drafters):
            p = pooled[method]
            rows.append({"category": category, "method": method, **p.to_json(),
                         "speedup_vs_none": p.tokens_per_s / none.tokens_per_s,
                         "vs_generate": p.tokens_per_s / generate_tps if generate_tps else None,
                         "generate_tokens_per_s": generate_tps})
        trees += [chain_vs_tree_row(category, drafter, method, config.tree, pooled[method], pooled[drafter], none)
                  for method, drafter in config.tree_methods().items()]
    sweep = []
    for k in config.sweep_ks:
        runs = [r for (c, kk), rs in collected.sweep.items() if kk == k for r in rs]
        if not runs:
            continue
        p = pool(runs)
        none = pool([r for c in config.sweep_categories for r in collected.runs.get((c, NONE), [])])
        gen_tps = _rate([g for c in config.sweep_categories for g in collected.generate.get(c, [])])
        sweep.append({"k": k, "drafter": config.sweep_drafter, **p.to_json(),
                      "speedup_vs_none": p.tokens_per_s / none.tokens_per_s,
                      "vs_generate": p.tokens_per_s / gen_tps if gen_tps else None})
    return {
        "config": asdict(config),
        "machine": {"processor": platform.processor() or platform.machine(), "cpu": cpu_model(),
                    "native_bf16": _has_native_bf16(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "rows": rows, "sweep": sweep, "trees": trees,
        "ceiling": ceiling.to_json() if ceiling is not None else None,
        "lossless": not collected.mismatches, "mismatches": collected.mismatches,
    }


def run(config: BenchConfig, out: Path, servers: Servers | None = None) -> tuple[dict, list[Path]]:
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
            res = results(collect(engine, reference, config, progress), config)
            res["concurrency"] = throughput(engine, LoadConfig(max_tokens=min(64, config.max_tokens), k=config.k))
    else:
        config = config.runnable_on(reference)
        measured_ceiling = measure_ceiling(reference.target, (1, config.k + 1))
        res = results(collect(reference, reference, config, progress), config, measured_ceiling)
    paths = report.write(res, out)
    progress.unlink(missing_ok=True)
    return res, paths
