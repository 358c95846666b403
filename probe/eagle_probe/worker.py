"""What the hooks keep between calls in one worker process: the probe's settings and record store, the
state of the requests being recorded, and `guarded`, the frame every hook's own work runs in."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from eagle_probe import REQUEST_FIELD
from eagle_probe.attention import Budget, KeyCopy
from eagle_probe.records import error_record
from eagle_probe.settings import Settings
from eagle_probe.store import Store

log = logging.getLogger("eagle_probe")
# a file whose text names the hooks that raise (tests: every failure of the probe must leave vLLM serving)
FAULT_FILE = "EAGLE_PROBE_FAULT_FILE"
FAULTS = os.environ.get(FAULT_FILE)

SETTINGS = Settings.read()
STORE = Store(SETTINGS)
BUDGET = Budget(SETTINGS.max_key_bytes, SETTINGS.max_positions)


def extra_args(runner, req_id: str) -> dict:
    """The request's `vllm_xargs` ({} when it has none, or has left the runner)."""
    state = runner.requests.get(req_id)
    return (state.sampling_params.extra_args if state is not None and state.sampling_params else None) or {}


Attention = list   # by depth: the Masses of that depth's query, or why there are none (a str)


@dataclass
class Query:
    """One depth's query row and the backend's output for it, kept until the round's drafts are all made:
    the depths of a round are measured together, reading the request's key copy once."""
    query: torch.Tensor    # [heads, head_dim]
    output: torch.Tensor   # [heads, value_dim]
    position: int


@dataclass
class Proposal:
    """A request's drafts from one `propose` call, with what the probe measured while they were made;
    recorded with the step that verifies them."""
    drafts: list[int]
    rms: list[float] = field(default_factory=list)
    attention: Attention = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    probe_ms: float = 0.0


@dataclass
class Capture:
    """What one `propose` call records: the batch rows to measure and, per row, the RMS and the
    attention by depth."""
    rows: dict[int, str]                      # batch row -> internal request id
    prompt_tokens: dict[int, int]             # batch row -> its prompt's length (sinks lie within it)
    first_rows: dict[int, int] | None = None  # batch row -> its row in call 0 (token_indices_to_sample)
    calls: int = 0
    positions: object = None                  # the current call's positions tensor
    round_start: dict[int, int] = field(default_factory=dict)   # batch row -> position of its first draft
    scale: float = 1.0                        # the drafter attention's softmax scale
    rms: dict[int, list[float]] = field(default_factory=dict)
    attention: dict[int, list[Query | str]] = field(default_factory=dict)   # measured when the round ends
    probs: dict[int, list[float]] = field(default_factory=dict)
    sampling: bool = False     # set while vLLM samples this call's drafts
    logits: object = None      # the logits vLLM computed for them, the probed rows in float32
    spent_s: float = 0.0   # time the probe's measurements took in this call, for all its rows


@dataclass
class Worker:
    """What the hooks keep between calls in one worker process (the runner calls them one at a time).
    Every dict is keyed by vLLM's internal request id and emptied when vLLM reports the request finished."""
    keys: dict[str, str] = field(default_factory=dict)           # admitted requests -> their client's key
    passed: set[str] = field(default_factory=set)                # requests not recorded (not asked, or refused)
    broken: set[str] = field(default_factory=set)                # admitted requests whose recording failed
    pending: dict[str, Proposal] = field(default_factory=dict)   # admitted requests -> their next drafts
    copies: dict[str, KeyCopy] = field(default_factory=dict)     # admitted requests -> their drafter keys
    no_copy: dict[str, str] = field(default_factory=dict)        # admitted requests -> why they have no copy
    capture: Capture | None = None   # set while a propose call for probed requests runs
    steps: int = 0                   # steps the hooks have seen: 0 under traffic means they do not run
    attention_backend: str = ""      # the drafter attention backend's class, once the drafter loads
    vllm: tuple[str, str] = ("", "")  # this vLLM's version, and how it is known to fit the probe

    def admitted(self, runner) -> dict[str, str]:
        """The requests of the runner's batch being recorded: internal id -> the client's key. A request
        is admitted or refused once, at its first step."""
        keys = {}
        for req in runner.input_batch.req_ids:
            if req in self.passed or req in self.broken:
                continue
            if req not in self.keys:
                key = extra_args(runner, req).get(REQUEST_FIELD)
                if key is None or STORE.admit(key, req) is not None:
                    self.passed.add(req)
                    continue
                self.keys[req] = key
            keys[req] = self.keys[req]
        return keys

    def forget(self, finished: set[str]) -> None:
        """Requests the scheduler reports finished (aborted ones too): their records are complete."""
        for req in finished:
            self.passed.discard(req)
            self.broken.discard(req)
            self.pending.pop(req, None)
            self.no_copy.pop(req, None)
            self.drop_copy(req)
            if req in self.keys:
                STORE.finish(self.keys.pop(req), req)

    def drop_copy(self, req: str) -> None:
        copy = self.copies.pop(req, None)
        if copy is not None:
            copy.release()

    def fail(self, why: str) -> None:
        """End the recording of every request being recorded now: the last record of each says why."""
        self.capture = None
        for req, key in self.keys.items():
            if req not in self.broken:
                self.broken.add(req)
                self.pending.pop(req, None)
                self.drop_copy(req)
                STORE.add(key, req, error_record(req, why))


WORKER = Worker()


def guarded(hook: str, part: Callable, *args, **kwargs):
    """`part(*args, **kwargs)`, the probe's share of a hook: an exception in it ends the recording of the
    requests in this step (their records say why), and returns None."""
    try:
        if FAULTS and hook in Path(FAULTS).read_text().split():
            raise RuntimeError(f"a fault injected into {hook} ({FAULT_FILE})")
        return part(*args, **kwargs)
    except Exception as e:
        log.warning("eagle_probe failed in %s: %r; the requests it was recording are no longer recorded", hook, e)
        WORKER.fail(f"the probe failed in {hook}: {type(e).__name__}: {e}")
        return None
