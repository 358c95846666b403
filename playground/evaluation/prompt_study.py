"""`python -m playground bench prompts FILE`: your prompts through each drafter, side by side.

    python -m playground bench prompts my_prompts.jsonl [--sample 200 --seed 0] [--drafters eagle3 eagle3.1 none]
    python -m playground bench prompts my_prompts.jsonl --trees          # each drafter's draft tree too
    python -m playground bench prompts my_prompts.jsonl --backend vllm --vllm-url eagle3=URL \\
        --vllm-url eagle3.1=URL [--vllm-url none=URL] --concurrency 4

The prompts run through evaluation.runner (every method back to back, answers checked, a checkpoint
in OUT/progress.pkl after every prompt, so after Ctrl-C the same command goes on where it stopped),
greedy, so all methods answer with the same tokens and their tokens per target pass compare the same text.
The report (prompt_report) pools each method over the prompts, with paired bootstrap intervals, and its
`run` runs a study and writes the report.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

from playground.engines.protocol import Engine
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation import runner
from playground.evaluation.runner import Method, Progress, PromptResult
from playground.model.variants import EAGLE3, EAGLE31, NONE, run_name
from playground.prompts.files import PromptFile


@dataclass(frozen=True)
class StudyConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)   # `none` among them: speedups over no speculation
    k: int = 5
    max_tokens: int = 128
    tree: TreeShape | None = None    # each drafter also drafts this tree (the embedded engine)
    backend: str = "reference"
    concurrency: int = 1             # prompts in flight at once (vLLM servers)

    def methods(self) -> list[Method]:
        """Each drafter's chain, then its tree when asked."""
        chains = [Method(d, d, self.k) for d in self.drafters]
        trees = [Method(run_name(d, str(self.tree)), d, self.k, self.tree) for d in self.drafters if d != NONE]
        return chains + (trees if self.tree else [])

    def runnable_on(self, engine: Engine) -> StudyConfig:
        missing = [d for d in self.drafters if d not in engine.drafter_names]
        if missing:
            raise PlaygroundError(f"the {engine.name} backend has no {', '.join(missing)}: it runs "
                                  f"{', '.join(engine.drafter_names)}")
        if self.concurrency < 1:
            raise PlaygroundError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.concurrency != 1 and not engine.capabilities.concurrent:
            raise PlaygroundError(f"the {engine.name} backend runs one prompt at a time: --concurrency is for "
                                  "vLLM servers")
        if self.tree is not None and not engine.capabilities.trees:
            raise PlaygroundError(f"the {engine.name} backend drafts chains only: drop --trees")
        return self


SAVED_FORMAT = 5   # of the PromptResults a study saves: a study saved in another format starts afresh


def study_key(config: StudyConfig, prompts: PromptFile) -> str:
    """What a saved study must match to be resumed: the format, the configuration and every prompt
    (concurrency too: tokens/s measured under other loads do not pool)."""
    digest = hashlib.sha256(json.dumps([SAVED_FORMAT, asdict(config), [asdict(p) for p in prompts.prompts]],
                                       default=str).encode())
    return digest.hexdigest()


def measure(engine: Engine, prompts: PromptFile, config: StudyConfig,
            done: Sequence[PromptResult] = ()) -> Iterator[Progress]:
    """The study's runs (runner.measure) of the prompts not in `done`."""
    return runner.measure(engine, prompts.prompts, config.methods(), config.max_tokens, done, config.concurrency)
