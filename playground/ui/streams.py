"""Turning page inputs into engine streams: validation, limits, and interleaving several runs."""

from __future__ import annotations

import logging
import random
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping, NamedTuple

import gradio as gr

from playground.engines.draft_stop import DraftStop
from playground.engines.events import StepEvent
from playground.engines.protocol import Engine
from playground.engines.request import GenerationRequest
from playground.engines.tree import TreeShape
from playground.errors import PlaygroundError
from playground.malloc_arenas import release_freed
from playground.ui.endpoints import RunSettings, choice, number, refusal, text, whole_number
from playground.ui.frames import DRAWN_FRAMES
from playground.ui.runs import PLOTS_EVERY_S, TEXT_EVERY_S, Pacer, RunLog

log = logging.getLogger("playground.ui")


@dataclass(frozen=True)
class Limits:
    """What one request from the page may ask for (public-demo safety)."""
    max_prompt_chars: int = 20_000
    max_tokens: int = 1024
    queue_size: int = 32        # requests waiting beyond this get a "busy" message
    concurrency: int = 1        # runs computing at once (they take turns step by step)
    sessions: int = 500         # browser sessions whose page state the server keeps (Gradio's default is 10,000)
    study_prompts: int = 200    # prompts of one file the Your prompts tab runs
    watch_any_url: bool = False  # whether the Your servers tab reads /metrics of any URL a visitor types


DRAFT_MODES = ("chain", "tree")
MAX_SEED = 2**31 - 1
NEW_SEED = -1   # the seed control's value for "a new seed every run"


def make_request(limits: Limits, settings: RunSettings, engine: Engine) -> GenerationRequest:
    """A validated request for `engine`; every problem is a PlaygroundError with a one-line reason and the
    setting at fault."""
    prompt, system = text(settings.prompt, "prompt"), text(settings.system, "system")
    # the page never loads a checkpoint from a path it is given: a drafter is one the engine names
    if choice(settings.drafter, "drafter") not in engine.drafter_names:
        raise unknown_drafter(settings.drafter, engine, "drafter")
    draft = draft_mode(settings.draft)
    if len(prompt) > limits.max_prompt_chars:
        raise PlaygroundError(f"the prompt is {len(prompt):,} characters; this playground accepts up to "
                              f"{limits.max_prompt_chars:,}: shorten it", "prompt")
    if len(system) > limits.max_prompt_chars:
        raise PlaygroundError(f"the system prompt is limited to {limits.max_prompt_chars:,} characters", "system")
    wholes = {setting: whole_number(getattr(settings, setting), setting)
              for setting in ("k", "max_tokens", "seed", "tree_top_k", "tree_depth", "tree_nodes")}
    seed = wholes["seed"]
    if not NEW_SEED <= seed <= MAX_SEED:
        raise PlaygroundError(f"the seed must be between {NEW_SEED} (a new one every run) and {MAX_SEED}", "seed")
    shape = TreeShape(*(wholes[setting] for setting in ("tree_top_k", "tree_depth", "tree_nodes")))
    request = GenerationRequest(prompt=prompt, system=system or None, template=choice(settings.template, "template"),
                                drafter=settings.drafter, k=wholes["k"],
                                temperature=number(settings.temperature, "temperature"),
                                top_p=number(settings.top_p, "top_p"), max_tokens=wholes["max_tokens"],
                                seed=random.randint(0, MAX_SEED) if seed == NEW_SEED else seed,
                                tree=shape if draft == "tree" else None, draft_stop=draft_stop(settings.draft_stop))
    return request.validate(limits.max_tokens)


def draft_stop(value: object) -> DraftStop | None:
    """The stop rule control's value: None when empty."""
    rule = text(value, "draft_stop").strip()
    return DraftStop.parse(rule) if rule else None


def draft_mode(value: object) -> str:
    """The draft control's value, checked: one of DRAFT_MODES (the Playground's, the Comparison's and the study's)."""
    if choice(value, "draft") not in DRAFT_MODES:
        raise PlaygroundError(f"draft must be {' or '.join(map(repr, DRAFT_MODES))}, got {value!r:.40}", "draft")
    return value


def unknown_drafter(name: str, engine: Engine, setting: str) -> PlaygroundError:
    return PlaygroundError(f"unknown drafter {name!r}; this backend runs {', '.join(engine.drafter_names)}", setting)


def backend(backends: Mapping[str, Engine], backend_name: str) -> Engine:
    if choice(backend_name, "backend_name") not in backends:
        raise PlaygroundError(f"unknown backend {backend_name!r}; this playground runs {', '.join(backends)}",
                              "backend_name")
    return backends[backend_name]


def interleave(streams: Mapping[str, Iterator[StepEvent]]) -> Iterator[tuple[str, StepEvent]]:
    """One step of each run in turn until all end, so side-by-side columns grow together."""
    active = dict(streams)
    while active:
        for name, stream in list(active.items()):
            event = next(stream, None)
            if event is None:
                del active[name]
            else:
                yield name, event


class Frame(NamedTuple):
    """A moment the page is due an update: whether the plots are redrawn, and whether it is the last."""
    redraw: bool
    final: bool
    shared: bool = False   # the last frame of runs during which another visitor's job ran on this CPU
    error: str = ""        # the last frame of runs a failure ended: its one line
    run: str = ""          # the page event's id and the frame's number in it, which the page tells back once
    number: int = 0        # drawn (frames.py)


STARTING = Frame(redraw=False, final=False)   # before the first step: the page cleared


def follow(streams: Mapping[str, Iterator[StepEvent]], logs: Mapping[str, RunLog],
           stop_pressed: Callable[[], bool], pacer: Pacer | None = None,
           page_behind: Callable[[], bool] = lambda: False) -> Iterator[Frame]:
    """The runs of one page event, step by step in turn: each event goes to its run's log, and a Frame
    comes out whenever the page is due an update (paced) and not `page_behind` in drawing them, and always
    last. After Stop every run that has begun ends as stopped, one that has not stays empty. A stream that
    ends unfinished (a run that failed alone, its failure told elsewhere) holds up no one; a stream that
    raises ends them all."""
    # columns side by side stream at one column's pace in all: the browser draws every column's answer at
    # each update and each plot (~0.1 s apiece there) at each plot update, and at one column's pace each it
    # fell behind on a 2-core host (a comparison's Stop clicked 30 s late)
    columns = len(streams)
    pacer, ended = pacer or Pacer(TEXT_EVERY_S * columns, PLOTS_EVERY_S * columns), set()

    def watched(name: str, stream: Iterator[StepEvent]) -> Iterator[StepEvent]:
        yield from stream
        ended.add(name)

    for name, event in interleave({name: watched(name, stream) for name, stream in streams.items()}):
        logs[name].add(event)
        stopping = stop_pressed()
        if stopping:
            for log in logs.values():
                if log.events and not log.finished:
                    log.events[-1] = stopped(log.events[-1])
        final = stopping or all(log.finished or name in ended for name, log in logs.items())
        if final or (not page_behind() and pacer.due("text")):
            yield Frame(redraw=final or pacer.due("plots"), final=final)
        if final:
            return
    yield Frame(redraw=True, final=True)


STOPPED = "stopped"   # the finish reason of a run its page stopped


class StopRequests:
    """The Stop button of one tab, by page session. A run asks between steps whether Stop was pressed
    since it started, and then ends like a finished run: its last step is marked `stopped`, and the
    answer, plots, inspector and downloads stay. (Cancelling Gradio's event instead would end the run
    as an error on every output.)"""

    def __init__(self):
        self._lock = threading.Lock()
        self._pressed: set[str | None] = set()

    def press(self, session: str | None) -> None:
        with self._lock:
            self._pressed.add(session)

    def take(self, session: str | None) -> bool:
        """Whether Stop was pressed since the last call; a run calls it once as it starts."""
        with self._lock:
            pressed = session in self._pressed
            self._pressed.discard(session)
            return pressed


def stop_handler(stops: StopRequests) -> Callable[[gr.Request], None]:
    """The Stop button's click: it presses Stop for the page that clicked."""
    def press(request: gr.Request) -> None:
        stops.press(request.session_hash)
    return press


def stopped(event: StepEvent) -> StepEvent:
    """The last step of a run its page stopped."""
    return replace(event, finish_reason=event.finish_reason or STOPPED)





class SharedCpu:
    """The page's jobs that run the engine in this process (runs, comparisons, studies, each in its
    own queue): a job learns whether another ran at any moment during it, and its page says so beside
    the speeds, which two jobs on one CPU both lower. Why not one queue for all: a study takes
    minutes, and a visitor's Run should not wait behind another visitor's file. When the last job
    ends, `on_idle` runs (the page hands the memory its jobs freed back to the system)."""

    def __init__(self, on_idle: Callable[[], None] = lambda: None):
        self._on_idle = on_idle
        self._lock = threading.Lock()
        self._running: dict[int, bool] = {}   # job -> whether another job ran beside it
        self._next = 0

    @contextmanager
    def job(self) -> Iterator[Callable[[], bool]]:
        """While the block runs it is a job; it gets a call that says whether another job overlapped it."""
        with self._lock:
            me, self._next = self._next, self._next + 1
            self._running[me] = bool(self._running)
            for other in self._running:
                self._running[other] |= self._running[me]
        seen = [False]

        def overlapped() -> bool:
            with self._lock:
                seen[0] = self._running.get(me, seen[0])
                return seen[0]
        try:
            yield overlapped
        finally:
            with self._lock:
                seen[0] = self._running.pop(me)
                idle = not self._running
            if idle:
                self._on_idle()


SHARED_CPU = SharedCpu(on_idle=release_freed)
SHARED_NOTE = ("Another visitor's job ran on this CPU during this run: its speeds are lower than the run alone "
               "would give.")


def drive(streams: Mapping[str, Iterator[StepEvent]], logs: Mapping[str, RunLog], stop_pressed: Callable[[], bool],
          draw: Callable[[Frame], dict], opening: Frame = STARTING) -> Iterator[dict]:
    """A page event's updates while its runs stream: draw(opening) before the first step, then draw(frame)
    for each of follow()'s frames, the last saying whether another job shared the CPU; where a stream
    raises, draw of a last frame with the failure's line, then the refusal raised (the API caller's error).
    Every frame is numbered for the page to tell back once drawn, and none is sent while it is far behind."""
    with SHARED_CPU.job() as overlapped, DRAWN_FRAMES.event() as page:
        numbered = lambda frame: frame._replace(run=page.run, number=DRAWN_FRAMES.send(page))
        yield draw(numbered(opening))
        try:
            for frame in follow(streams, logs, stop_pressed, page_behind=lambda: DRAWN_FRAMES.behind(page)):
                yield draw(numbered(frame._replace(shared=frame.final and overlapped())))
        except Exception as e:
            error = refusal(e)
            yield draw(numbered(Frame(redraw=True, final=True, error=error.message)))
            raise error from None
