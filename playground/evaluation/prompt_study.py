"""`python -m playground bench prompts FILE`: your prompts through each drafter, side by side.

    python -m playground bench prompts my_prompts.jsonl [--sample 200 --seed 0] [--drafters eagle3 eagle3.1 none]
    python -m playground bench prompts my_prompts.jsonl --trees          # each drafter's draft tree too
    python -m playground bench prompts my_prompts.jsonl --backend vllm --vllm-url eagle3=URL \\
        --vllm-url eagle3.1=URL [--vllm-url none=URL] --concurrency 4

Every prompt goes through every method back to back (so machine drift hits them alike), greedy, so
all methods answer with the same tokens and tau compares the same text; any difference is reported.
A prompt the engine refuses (past its context) is skipped with the reason. What is measured is
saved after every prompt (OUT/progress.pkl): after Ctrl-C, the same command goes on where it stopped.
The report (prompt_report) pools each method over the prompts, with paired bootstrap intervals.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

from playground.engines.protocol import Engine
from playground.engines.stats import RunTotals
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation.checkpoint import Checkpoint
from playground.evaluation.prompt_files import PromptFile, UserPrompt
from playground.model.variants import EAGLE3, EAGLE31, NONE, run_name


@dataclass(frozen=True)
class StudyConfig:
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)   # `none` among them: speedups over no speculation
    k: int = 5
    max_tokens: int = 128
    tree: TreeShape | None = None    # each drafter also drafts this tree (the embedded engine)
    backend: str = "reference"
    concurrency: int = 1             # prompts in flight at once (vLLM servers)

    def methods(self) -> dict[str, tuple[str, TreeShape | None]]:
        """run name -> (drafter, tree or None): each drafter's chain, then its tree when asked."""
        chains = {d: (d, None) for d in self.drafters}
        trees = {run_name(d, str(self.tree)): (d, self.tree) for d in self.drafters if d != NONE} if self.tree else {}
        return {**chains, **trees}

    def runnable_on(self, engine: Engine) -> StudyConfig:
        missing = [d for d in self.drafters if d not in engine.drafter_names]
        if missing:
            raise PlaygroundError(f"the {engine.name} backend has no {', '.join(missing)}: it runs "
                                  f"{', '.join(engine.drafter_names)}")
        if self.concurrency < 1:
            raise PlaygroundError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.backend != "vllm" and self.concurrency != 1:
            raise PlaygroundError("the embedded engine runs one prompt at a time: --concurrency is for vLLM servers")
        if self.backend == "vllm" and self.tree is not None:
            raise PlaygroundError("draft trees run on the embedded engine only: drop --trees")
        return self


@dataclass(frozen=True)
class PromptResult:
    index: int                            # the prompt's place in the run
    id: str
    category: str | None
    prompt_tokens: int = 0
    runs: dict[str, RunTotals] = field(default_factory=dict)   # by method
    mismatches: tuple[tuple[str, int], ...] = ()   # (method, first token that differs from the first method's)
    skipped: str | None = None            # why the engine refused the prompt


class Stopped(Exception):
    """A prompt's runs abandoned because the study was closed."""


@dataclass(frozen=True)
class Progress:
    """What a running study reports: after every step of a prompt's runs, and with `result` when a
    prompt has finished (in the order they finish)."""
    done: int
    total: int
    current: str = ""                     # "prompt 12 · eagle3.1 · 40 tokens"
    result: PromptResult | None = None


SAVED_FORMAT = 3   # of the PromptResults a study saves: a study saved in another format starts afresh


def study_key(config: StudyConfig, prompts: PromptFile) -> str:
    """What a saved study must match to be resumed: the format, the configuration and every prompt
    (concurrency too: tokens/s measured under other loads do not pool)."""
    digest = hashlib.sha256(json.dumps([SAVED_FORMAT, asdict(config), [asdict(p) for p in prompts.prompts]],
                                       default=str).encode())
    return digest.hexdigest()


def measure(engine: Engine, prompts: PromptFile, config: StudyConfig,
            done: Sequence[PromptResult] = ()) -> Iterator[Progress]:
    """Run the prompts not in `done` through every method; closing the iterator stops the run
    after the step in progress (with concurrency, after the prompts in flight)."""
    finished = {r.index for r in done}
    todo = [(i, p) for i, p in enumerate(prompts.prompts) if i not in finished]
    total, count = len(prompts.prompts), len(finished)
    if config.concurrency == 1:
        for i, prompt in todo:
            for update in _prompt_runs(engine, i, prompt, config):
                if isinstance(update, PromptResult):
                    count += 1
                    yield Progress(count, total, result=update)
                else:
                    yield Progress(count, total, update)
        return
    stop = threading.Event()
    drain = lambda i, p: next(u for u in _prompt_runs(engine, i, p, config, stop) if isinstance(u, PromptResult))
    with ThreadPoolExecutor(config.concurrency, thread_name_prefix="study") as pool:
        pending: dict[Future, str] = {}
        queue = iter(todo)
        try:
            while True:
                pending |= {pool.submit(drain, i, p): p.id for i, p in _take(queue, config.concurrency - len(pending))}
                if not pending:
                    return
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                failed = [f for f in ready if f.exception() is not None]
                for future in ready:
                    del pending[future]
                    if future.exception() is None:   # what finished is kept before an error ends the study
                        count += 1
                        yield Progress(count, total, f"{len(pending)} prompts in flight", future.result())
                if failed:
                    raise failed[0].exception()
        finally:
            stop.set()
            for future in pending:
                future.cancel()


def _take(queue: Iterator, n: int) -> list:
    return [item for _, item in zip(range(n), queue)]


def _prompt_runs(engine: Engine, index: int, prompt: UserPrompt, config: StudyConfig,
                 stop: threading.Event | None = None) -> Iterator[str | PromptResult]:
    """Every method on one prompt: a line of progress per step, then the prompt's result."""
    runs, mismatches, first_tokens, prompt_tokens = {}, [], None, 0
    for method, (drafter, tree) in config.methods().items():
        if stop is not None and stop.is_set():
            raise Stopped
        request = replace(prompt.request(drafter, config.k, config.max_tokens), tree=tree)
        try:
            engine.check(request)
        except PlaygroundError as e:
            yield PromptResult(index, prompt.id, prompt.category, skipped=str(e))
            return
        events = []
        for event in engine.generate(request):
            if stop is not None and stop.is_set():
                raise Stopped
            events.append(event)
            yield f"{prompt.id} · {method} · {sum(len(e.token_ids) for e in events)} tokens"
        tokens = [t for e in events for t in e.token_ids]
        if first_tokens is None:
            first_tokens, prompt_tokens = tokens, events[0].position
        elif tokens != first_tokens:
            differs = next((j for j, (a, b) in enumerate(zip(tokens, first_tokens)) if a != b),
                           min(len(tokens), len(first_tokens)))
            mismatches.append((method, differs))
        runs[method] = RunTotals.of(events)
    yield PromptResult(index, prompt.id, prompt.category, prompt_tokens, runs, tuple(mismatches))


def run(engine: Engine, config: StudyConfig, prompts: PromptFile, source: str, out: Path) -> tuple[dict, list[Path]]:
    """The study on `engine` with a progress bar; the report written to `out`. Measured prompts are saved
    to out/progress.pkl as they finish, so that the same call goes on after an interruption (a
    KeyboardInterrupt propagates once the last finished prompt is saved)."""
    from tqdm import tqdm

    from playground.evaluation import prompt_report

    config = config.runnable_on(engine)
    checkpoint = Checkpoint(out / "progress.pkl", study_key(config, prompts))
    done: list[PromptResult] = checkpoint.load() or []
    with tqdm(total=len(prompts.prompts), initial=len(done), desc="prompts", unit="prompt") as bar:
        for update in measure(engine, prompts, config, done):
            if update.result is None:
                bar.set_postfix_str(update.current, refresh=False)
                continue
            done.append(update.result)
            checkpoint.save(done)
            bar.update()
    res = prompt_report.results(config, prompts, source, done)
    paths = prompt_report.write(res, out)
    checkpoint.clear()
    return res, paths
