"""Building the vLLM backend next to the reference engine: given server URLs, or servers it starts."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import torch

from playground.engines.drafters import random_drafter
from playground.engines.events import StepEvent
from playground.engines.protocol import Capabilities
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.vllm.client import Server, VLLMEngine
from playground.engines.vllm.launch import (EAGLE3_METHOD, NGRAM_METHOD, LaunchConfig, Launched, ServerSpec,
                                           env_server_args)
from playground.engines.vllm.urls import server_urls
from playground.errors import PlaygroundError
from playground.model.drafter import save_drafter
from playground.model.target import embedded_target_folder
from playground.model.variants import NONE, SHIPPED, bad_name, shipped_path

MAX_LAUNCH_K = 16
VLLM_MAX_CONTEXT = 8192  # the embedded target's own; long-context benchmark prompts reach about 4.1k tokens


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: the embedded target with the shipped drafters (the default), or any model
    with the servers given for it; a server without speculation too."""
    model: str | None = None                  # None: the embedded SmolLM2
    drafters: tuple[str, ...] = ()            # NAME=SOURCE[:k=N][:lookup=MIN-MAX], see parse_launch_entry
    k: int = 5                                # drafts per step where an entry does not say
    server_args: tuple[str, ...] = ()         # passed on to every `vllm serve`


LAUNCH_ENTRY = "NAME=SOURCE[:k=N][:lookup=MIN-MAX]"


def drafter_folder(engine: ReferenceEngine, name: str) -> tuple[Path, bool]:
    """A checkpoint folder vLLM can load: the shipped one, or the seeded random drafter saved once
    (in float32, so that it holds exactly the reference engine's random weights)."""
    path = shipped_path(name)
    if (path / "model.safetensors").exists():
        return path, True
    folder = embedded_target_folder().parent / "drafters" / f"{name}-random-float32"
    if not (folder / "model.safetensors").exists():
        save_drafter(random_drafter(engine.target, SHIPPED[name]), folder, torch.float32)
    return folder, False


def parse_name(spec: str, flag: str, value: str) -> tuple[str, str]:
    """`NAME=VALUE` as (name, value), e.g. eagle3.1=http://127.0.0.1:8101."""
    name, sep, given = spec.partition("=")
    if not sep or not name or not given:
        raise PlaygroundError(f"bad {flag} {spec!r}: use NAME={value}")
    if why := bad_name(name):
        raise PlaygroundError(f"bad {flag} {spec!r}: {why}")
    return name, given


def parse_urls(specs: list[str]) -> list[Server]:
    """The servers --vllm-url names: each under a name the page can show and a request can pick."""
    urls = server_urls(specs, "--vllm-url")
    for name, url in urls.items():
        if why := bad_name(name):
            raise PlaygroundError(f"bad --vllm-url {name}={url}: {why}")
    return [Server(name, url) for name, url in urls.items()]


def parse_launch_entry(entry: str, k: int) -> tuple[str, ServerSpec]:
    """One --vllm-drafter entry: SOURCE is `ngram` (prompt lookup), `none` (no speculation), a shipped
    drafter's name (eagle3, eagle3.1: the embedded target's) or an EAGLE-3 drafter's folder or hub id;
    `:k=N` sets its drafts per step, `:lookup=MIN-MAX` the n-gram sizes ngram matches."""
    flag = "--vllm-drafter"
    name, value = parse_name(entry, flag, LAUNCH_ENTRY.partition("=")[2])
    source, *options = value.split(":")
    settings = {}
    for option in options:
        key, sep, given = option.partition("=")
        if key not in ("k", "lookup") or not sep or key in settings:
            raise PlaygroundError(f"bad {flag} {entry!r}: after the source come :k=N and (ngram) :lookup=MIN-MAX")
        settings[key] = given
    if "k" in settings:
        if not settings["k"].isdigit() or not 1 <= int(settings["k"]) <= MAX_LAUNCH_K:
            raise PlaygroundError(f"bad {flag} {entry!r}: k is a whole number from 1 to {MAX_LAUNCH_K}")
        k = int(settings["k"])
    lookup = None
    if "lookup" in settings:
        low, _, high = settings["lookup"].partition("-")
        if source != NGRAM_METHOD or not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
            raise PlaygroundError(f"bad {flag} {entry!r}: lookup=MIN-MAX (1 <= MIN <= MAX) is for ngram")
        lookup = (int(low), int(high))
    if source == NGRAM_METHOD:
        return name, ServerSpec(NGRAM_METHOD, k=k, lookup=lookup)
    if source == NONE:
        if "k" in settings:
            raise PlaygroundError(f"bad {flag} {entry!r}: a server without speculation has no k")
        return name, ServerSpec(None)
    return name, ServerSpec(EAGLE3_METHOD, source, k)


def launch_entries(spec: LaunchSpec) -> dict[str, ServerSpec]:
    """The servers `spec` names: the embedded target's shipped drafters and none unless given otherwise,
    then the entries given; another model has only the entries given and a server without speculation."""
    given = {}
    for entry in spec.drafters:
        name, server = parse_launch_entry(entry, spec.k)
        if name in given:
            raise PlaygroundError(f"--vllm-drafter names {name} twice")
        given[name] = server
    shipped = {name: ServerSpec(EAGLE3_METHOD, name, spec.k) for name in SHIPPED} if spec.model is None else {}
    for name, server in given.items():
        if server.source in SHIPPED and spec.model is not None:
            raise PlaygroundError(f"--vllm-drafter {name}={server.source}: the shipped drafters are the embedded "
                                  "target's; another model needs its own drafter's folder or hub id")
    none = {} if any(s.method is None for s in given.values()) else {NONE: ServerSpec(None)}
    return {**{n: s for n, s in shipped.items() if n not in given}, **given, **none}


def planned_names(spec: LaunchSpec) -> tuple[str, ...]:
    """The names of the servers `spec` starts (they start in this order)."""
    return tuple(launch_entries(spec))


def launch_config(reference: ReferenceEngine, spec: LaunchSpec, names: tuple[str, ...] | None = None) -> LaunchConfig:
    """The servers of `spec` (all of them, or those in `names`), a shipped drafter's name resolved to its
    checkpoint (or the seeded random drafter standing in for it)."""
    entries = launch_entries(spec)
    if spec.model is not None and all(s.method is None for s in entries.values()) and set(names or ()) != {NONE}:
        raise PlaygroundError(f"--vllm-model needs a drafter to compare: --vllm-drafter {LAUNCH_ENTRY}")
    if names is not None:
        unknown = [n for n in names if n not in entries]
        if unknown:
            raise PlaygroundError(f"no server to start for {', '.join(unknown)}: --launch starts "
                                  f"{', '.join(entries)}; add one with --vllm-drafter {LAUNCH_ENTRY}")
        entries = {n: entries[n] for n in names}
    servers = {}
    for name, server in entries.items():
        if server.source in SHIPPED:
            folder, trained = drafter_folder(reference, server.source)
            server = replace(server, source=str(folder), trained=trained)
        servers[name] = server
    if spec.model is None:
        return LaunchConfig(target=str(embedded_target_folder()), servers=servers, max_model_len=VLLM_MAX_CONTEXT,
                            extra_args=env_server_args() + spec.server_args)
    return LaunchConfig(target=spec.model, served_name=Path(spec.model.rstrip("/")).name, servers=servers,
                        dtype=None, max_model_len=None, extra_args=env_server_args() + spec.server_args)

def vllm_backend(reference: ReferenceEngine, urls: list[str], launch: LaunchSpec | None,
                 names: tuple[str, ...] | None = None, status: Callable[[str], None] = print,
                 ports: dict[str, int] | None = None, api_key: str | None = None) -> tuple[VLLMEngine, Launched | None]:
    """The vLLM engine over the servers at `urls` (NAME=URL), or over servers it starts (those of
    `launch`, or only those in `names`) on free local ports, or on `ports[name]` as given. `api_key`
    is vLLM's --api-key: sent to every server, and given to the servers it starts."""
    launched = None
    if launch is not None:
        launched = Launched(replace(launch_config(reference, launch, names), api_key=api_key), status, ports)
        servers = launched.wait_healthy(status=status)
    else:
        servers = parse_urls(urls)
    if not servers:
        raise PlaygroundError("the vLLM backend needs --vllm-url NAME=URL (repeatable) or --launch")
    engine = VLLMEngine(servers, max_tokens_limit=reference.max_tokens_limit, api_key=api_key)
    return engine, launched


class StartingBackend:
    """The vLLM backend while its servers start: the page is up at once, and a run on this backend
    gets the start-up status as its message until every server is healthy (or the reason it failed)."""

    name = "vllm"

    def __init__(self, start: Callable[[Callable[[str], None]], VLLMEngine], drafter_names: tuple[str, ...]):
        self.drafter_names = drafter_names
        self.lines: list[str] = ["starting the vLLM servers"]
        self.engine: VLLMEngine | None = None
        self.error: str | None = None
        threading.Thread(target=self._start, args=(start,), daemon=True, name="vllm-start").start()

    def _start(self, start: Callable[[Callable[[str], None]], VLLMEngine]) -> None:
        try:
            self.engine = start(self._status)
            self.drafter_names = self.engine.drafter_names
        except Exception as e:   # shown to every later run on this backend
            self.error = str(e)

    def _status(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def ready(self) -> VLLMEngine:
        if self.engine is not None:
            return self.engine
        if self.error is not None:
            raise PlaygroundError(f"the vLLM backend failed to start: {self.error}")
        raise PlaygroundError(f"the vLLM backend is still starting (servers load in a few minutes); "
                              f"last status: {self.lines[-1]}")

    def check(self, request: GenerationRequest) -> None:
        self.ready().check(request)

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        return self.ready().generate(request)

    def drafter_info(self, name: str):
        return self.ready().drafter_info(name)

    def limitations(self, drafter: str) -> str:
        return self.ready().limitations(drafter)

    @property
    def capabilities(self) -> Capabilities:
        """The engine's once its servers are up; before, what every vLLM engine can do, without servers."""
        return self.engine.capabilities if self.engine is not None else Capabilities(concurrent=True, remote=True)

    def urls(self) -> dict[str, str]:
        """The servers' URLs once they are up (none before)."""
        return dict(self.capabilities.servers)

    def describe(self) -> list[tuple[str, str, str]]:
        if self.engine is not None:
            return self.engine.describe()
        return [(name, "", self.error or f"starting: {self.lines[-1]}") for name in self.drafter_names]
