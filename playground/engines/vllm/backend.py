"""Building the vLLM backend next to the reference engine: given server URLs, or servers it starts."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from playground.engines.drafters import random_drafter
from playground.engines.events import StepEvent
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.vllm.client import Server, VLLMEngine
from playground.engines.vllm.launch import LaunchConfig, Launched, env_server_args
from playground.errors import PlaygroundError
from playground.model.drafter import save_drafter
from playground.model.target import embedded_target_folder
from playground.model.variants import NAMES, NONE, SHIPPED, shipped_path

VLLM_MAX_CONTEXT = 8192  # the embedded target's own; long-context benchmark prompts reach about 4.1k tokens


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: the embedded target with the shipped drafters (the default), or any model
    with the drafters given for it (a folder or hub id each); a server without speculation too."""
    model: str | None = None                  # None: the embedded SmolLM2
    drafters: tuple[str, ...] = ()            # NAME=FOLDER_OR_HUB_ID
    k: int = 5
    server_args: tuple[str, ...] = ()         # passed on to every `vllm serve`


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


def parse_pairs(specs: list[str] | tuple[str, ...], flag: str, names: tuple[str, ...], value: str) -> dict[str, str]:
    """`NAME=VALUE` pairs, e.g. eagle3.1=http://127.0.0.1:8101."""
    pairs = {}
    for spec in specs:
        name, sep, given = spec.partition("=")
        if not sep or name not in names or not given:
            raise PlaygroundError(f"bad {flag} {spec!r}: use NAME={value} with NAME one of {', '.join(names)}")
        if name in pairs:
            raise PlaygroundError(f"{flag} names {name} twice")
        pairs[name] = given
    return pairs


def parse_urls(specs: list[str]) -> list[Server]:
    urls = parse_pairs(specs, "--vllm-url", NAMES, "URL")
    for name, url in urls.items():
        if not url.startswith(("http://", "https://")):
            raise PlaygroundError(f"bad --vllm-url {name}={url}: the URL starts with http:// or https://")
    return [Server(name, url.rstrip("/")) for name, url in urls.items()]


def launch_config(reference: ReferenceEngine, spec: LaunchSpec, names: tuple[str, ...]) -> LaunchConfig:
    """One server per drafter in `names` (a given checkpoint, else the shipped one for the embedded
    target; another model has only the drafters given), and one without speculation when `names` has none."""
    given = parse_pairs(spec.drafters, "--vllm-drafter", tuple(SHIPPED), "FOLDER_OR_HUB_ID")
    baseline = {NONE: (None, False)} if NONE in names else {}
    if spec.model is None:
        drafters = {}
        for name in names:
            if name in given:
                drafters[name] = (given[name], True)
            elif name != NONE:
                folder, trained = drafter_folder(reference, name)
                drafters[name] = (str(folder), trained)
        return LaunchConfig(target=str(embedded_target_folder()), k=spec.k, max_model_len=VLLM_MAX_CONTEXT,
                            drafters={**drafters, **baseline},
                            extra_args=env_server_args() + spec.server_args)
    drafters = {name: (source, True) for name, source in given.items() if name in names}
    if not drafters and set(names) != {NONE}:
        raise PlaygroundError(f"--vllm-model needs a drafter for {' or '.join(n for n in names if n != NONE)}: "
                              "--vllm-drafter NAME=FOLDER_OR_HUB_ID")
    return LaunchConfig(target=spec.model, served_name=Path(spec.model.rstrip("/")).name, k=spec.k,
                        drafters={**drafters, **baseline}, dtype=None, max_model_len=None,
                        extra_args=env_server_args() + spec.server_args)

def vllm_backend(reference: ReferenceEngine, urls: list[str], launch: LaunchSpec | None,
                 names: tuple[str, ...] = NAMES, status: Callable[[str], None] = print,
                 ports: dict[str, int] | None = None) -> tuple[VLLMEngine, Launched | None]:
    """The vLLM engine over the servers at `urls` (NAME=URL), or over servers it starts (the embedded
    target: one per name in `names`; another model: one per drafter given and one without speculation)
    on free local ports, or on `ports[name]` as given."""
    launched = None
    if launch is not None:
        launched = Launched(launch_config(reference, launch, names), status, ports)
        servers = launched.wait_healthy(status=status)
    else:
        servers = parse_urls(urls)
    if not servers:
        raise PlaygroundError("the vLLM backend needs --vllm-url NAME=URL (repeatable) or --launch")
    engine = VLLMEngine(servers, max_tokens_limit=reference.max_tokens_limit)
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

    def urls(self) -> dict[str, str]:
        """The servers' URLs once they are up (none before)."""
        return self.engine.urls() if self.engine is not None else {}

    def describe(self) -> list[tuple[str, str, str]]:
        if self.engine is not None:
            return self.engine.describe()
        return [(name, "", self.error or f"starting: {self.lines[-1]}") for name in self.drafter_names]
