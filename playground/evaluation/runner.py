"""One loop for every measurement of prompts x methods: the suite, your prompts, the held-out
evaluation and the tree bench all run through `measure`.

Each prompt goes through every method back to back, so the machine's drift falls on all of them
alike. Each method's answer must equal the prompt's reference answer token for token (transformers'
greedy decoding where a measurement gives one, else the first method's answer): a difference is
recorded with its first differing token, never hidden. A prompt the engine refuses (past its
context) is skipped with the reason. Every run is reduced once, to stats.RunTotals, which is what
pooling needs and what a checkpoint keeps. `run` adds a progress bar and a checkpoint after every
prompt, so the same call goes on after an interruption.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

from playground.engines.draft_stop import DraftStop
from playground.engines.events import ended
from playground.engines.protocol import Engine
from playground.engines.request import GenerationRequest
from playground.engines.stats import RunTotals, VerifiedDraft, first_difference, verified_drafts
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.evaluation.checkpoint import Checkpoint
from playground.plots import label


class Prompt(Protocol):
    """What the runner needs of a prompt (prompts.sets.BenchPrompt, prompts.files.UserPrompt, EvalPrompt)."""
    id: str
    category: str | None
    document: str | None   # the text it asks about, where prompts share one (they are resampled together)

    def request(self, drafter: str, k: int, max_tokens: int) -> GenerationRequest: ...


@dataclass(frozen=True)
class Method:
    """One way of answering: a run name (the report's row) and how its request is made."""
    name: str
    drafter: str
    k: int
    tree: TreeShape | None = None
    draft_stop: DraftStop | None = None

    def request(self, prompt: Prompt, max_tokens: int) -> GenerationRequest:
        return replace(prompt.request(self.drafter, self.k, max_tokens), tree=self.tree, draft_stop=self.draft_stop)


@dataclass(frozen=True)
class PromptResult:
    index: int                            # the prompt's place in the run
    id: str
    category: str | None
    prompt_tokens: int = 0
    runs: dict[str, RunTotals] = field(default_factory=dict)   # by method
    mismatches: tuple[tuple[str, int], ...] = ()   # (method, first token that differs from the reference answer)
    skipped: str | None = None            # why the engine refused the prompt
    answer: tuple[int, ...] = ()          # the reference answer's tokens
    reference_seconds: float | None = None   # the reference answer's time, where a measurement gives one
    drafts: dict[str, tuple[VerifiedDraft, ...]] = field(default_factory=dict)   # by method, where kept
    document: str | None = None           # the prompt's (Prompt.document)

    @property
    def unit(self) -> str:
        """What an interval resamples this prompt with: its document's prompts, or itself alone."""
        return f"document {self.document}" if self.document is not None else f"prompt {self.index}"


def by_document(results: Sequence[PromptResult], method: str,
                document: Callable[[PromptResult], str] = lambda r: r.unit) -> list[RunTotals]:
    """One method's runs summed per document (the unit a clustered interval resamples; by default each
    prompt's `unit`), in the order the documents first come; skipped prompts left out."""
    return [RunTotals.summed([r.runs[method] for r in members]) for members in _grouped(results, document).values()]


def by_unit(results: Sequence[PromptResult]) -> list[PromptResult]:
    """The results merged per `unit` (a document's prompts, or a prompt alone), each method's runs summed, in
    the order the units first come: what a clustered interval resamples. Skipped prompts left out."""
    return [members[0] if len(members) == 1 else
            PromptResult(members[0].index, unit, members[0].category, sum(r.prompt_tokens for r in members),
                         {m: RunTotals.summed([r.runs[m] for r in members]) for m in members[0].runs},
                         document=members[0].document)
            for unit, members in _grouped(results, lambda r: r.unit).items()]


def _grouped(results: Sequence[PromptResult], key: Callable[[PromptResult], str]) -> dict[str, list[PromptResult]]:
    """The measured results by `key`, in the order the keys first come; skipped prompts left out."""
    grouped: dict[str, list[PromptResult]] = {}
    for r in results:
        if r.skipped is None:
            grouped.setdefault(key(r), []).append(r)
    return grouped


@dataclass(frozen=True)
class Progress:
    """What a running measurement reports: after every step of a prompt's runs, and with `result`
    when a prompt has finished (in the order they finish)."""
    done: int
    total: int
    current: str = ""                     # "prompt 12 · EAGLE 3.1 · 40 tokens"
    result: PromptResult | None = None


class Stopped(Exception):
    """A prompt's runs abandoned because the measurement was closed."""


Methods = Sequence[Method] | Callable[[Prompt], Sequence[Method]]
Reference = Callable[[Prompt], tuple[list[int], float]]   # a prompt's reference answer (greedy) and its seconds


def measure(engine: Engine, prompts: Sequence[Prompt], methods: Methods, max_tokens: int,
            done: Sequence[PromptResult] = (), concurrency: int = 1,
            reference: Reference | None = None, keep_drafts: bool = False) -> Iterator[Progress]:
    """Run the prompts not in `done` through every method (a list, or the methods of each prompt);
    closing the iterator stops the run after the step in progress (with concurrency, after the
    prompts in flight). `keep_drafts`: each result also keeps every verified draft of each run."""
    finished = {r.index for r in done}
    todo = [(i, p) for i, p in enumerate(prompts) if i not in finished]
    total, count = len(prompts), len(finished)
    methods_of = methods if callable(methods) else lambda prompt: methods
    runs_of = lambda i, p, stop=None: _prompt_runs(engine, i, p, methods_of(p), max_tokens, reference, stop,
                                                   keep_drafts)
    if concurrency == 1:
        for i, prompt in todo:
            for update in runs_of(i, prompt):
                if isinstance(update, PromptResult):
                    count += 1
                    yield Progress(count, total, result=update)
                else:
                    yield Progress(count, total, update)
        return
    stop = threading.Event()
    drain = lambda i, p: next(u for u in runs_of(i, p, stop) if isinstance(u, PromptResult))
    with ThreadPoolExecutor(concurrency, thread_name_prefix="measure") as pool:
        pending: dict[Future, str] = {}
        queue = iter(todo)
        try:
            while True:
                pending |= {pool.submit(drain, i, p): p.id for i, p in _take(queue, concurrency - len(pending))}
                if not pending:
                    return
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                failed = [f for f in ready if f.exception() is not None]
                for future in ready:
                    del pending[future]
                    if future.exception() is None:   # what finished is kept before an error ends the run
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


def _prompt_runs(engine: Engine, index: int, prompt: Prompt, methods: Sequence[Method], max_tokens: int,
                 reference: Reference | None, stop: threading.Event | None,
                 keep_drafts: bool = False) -> Iterator[str | PromptResult]:
    """Every method on one prompt: a line of progress per step, then the prompt's result."""
    runs, drafts, mismatches, answer, prompt_tokens, seconds = {}, {}, [], None, 0, None
    for method in methods:
        if stop is not None and stop.is_set():
            raise Stopped
        request = method.request(prompt, max_tokens)
        try:
            engine.check(request)
        except PlaygroundError as e:
            yield PromptResult(index, prompt.id, prompt.category, skipped=str(e), document=prompt.document)
            return
        if answer is None and reference is not None:
            answer, seconds = reference(prompt)
        events, made = [], 0
        for event in engine.generate(request):
            if stop is not None and stop.is_set():
                raise Stopped
            events.append(event)
            made += len(event.token_ids)
            yield f"{prompt.id} · {label(method.name)} · {made} token{'s' * (made != 1)}"
        events = ended(events)
        tokens = [t for e in events for t in e.token_ids]
        if answer is None:
            answer = tokens
        if not runs:
            prompt_tokens = events[0].position
        differs = first_difference(tokens, answer)
        if differs is not None:
            mismatches.append((method.name, differs))
        runs[method.name] = RunTotals.of(events)
        if keep_drafts:
            drafts[method.name] = verified_drafts(events)
    yield PromptResult(index, prompt.id, prompt.category, prompt_tokens, runs, tuple(mismatches),
                       answer=tuple(answer or ()), reference_seconds=seconds, drafts=drafts, document=prompt.document)


def run(engine: Engine, prompts: Sequence[Prompt], methods: Methods, max_tokens: int, progress: Path | None,
        key: Any, desc: str, concurrency: int = 1, reference: Reference | None = None,
        keep_drafts: bool = False) -> list[PromptResult]:
    """`measure` with a progress bar; with `progress`, measured prompts are saved there as they finish
    (identified by `key`), so that the same call goes on after an interruption (a KeyboardInterrupt
    propagates once the last finished prompt is saved). The results in the prompts' order."""
    from tqdm import tqdm

    checkpoint = Checkpoint(progress, key) if progress is not None else None
    done: list[PromptResult] = (checkpoint.load() if checkpoint else None) or []
    with tqdm(total=len(prompts), initial=len(done), desc=desc, unit="prompt") as bar:
        for update in measure(engine, prompts, methods, max_tokens, done, concurrency, reference, keep_drafts):
            if update.result is None:
                bar.set_postfix_str(update.current, refresh=False)
                continue
            done.append(update.result)
            if checkpoint:
                checkpoint.save(done)
            bar.update()
    return sorted(done, key=lambda r: r.index)
