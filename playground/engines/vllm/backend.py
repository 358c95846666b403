"""Building the vLLM backend next to the reference engine: given server URLs, or servers it starts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterator

from playground.engines.drafters import random_drafter
from playground.engines.events import StepEvent
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.vllm.client import Server, VLLMEngine
from playground.engines.vllm.launch import LaunchConfig, Launched
from playground.errors import PlaygroundError
from playground.model.drafter import save_drafter
from playground.model.target import embedded_target_folder
from playground.model.variants import NAMES, NONE, SHIPPED, shipped_path

VLLM_MAX_CONTEXT = 8192  # the target's own; long-context benchmark prompts reach about 4.1k tokens


def drafter_folder(engine: ReferenceEngine, name: str) -> tuple[Path, bool]:
    """A checkpoint folder vLLM can load: the shipped one, or the seeded random drafter saved once."""
    path = shipped_path(name)
    if (path / "model.safetensors").exists():
        return path, True
    folder = embedded_target_folder().parent / "drafters" / f"{name}-random"
    if not (folder / "model.safetensors").exists():
        save_drafter(random_drafter(engine.target, SHIPPED[name]), folder)
    return folder, False


def parse_urls(specs: list[str], k: int) -> list[Server]:
    """`NAME=URL` pairs, e.g. eagle3.1=http://127.0.0.1:8101."""
    servers = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or name not in NAMES or not url.startswith("http"):
            raise PlaygroundError(f"bad --vllm-url {spec!r}: use NAME=URL with NAME one of {', '.join(NAMES)}")
        servers.append(Server(name, url.rstrip("/"), k))
    return servers


def vllm_backend(reference: ReferenceEngine, urls: list[str], launch: bool, k: int = 5,
                 names: tuple[str, ...] = NAMES, status: Callable[[str], None] = print,
                 ports: dict[str, int] | None = None, **launch_options) -> tuple[VLLMEngine, Launched | None]:
    """The vLLM engine over given servers, or over servers it starts (one per name in `names`, on
    free local ports, or on `ports[name]` as given)."""
    launched = None
    if launch:
        drafters = {name: drafter_folder(reference, name) if name != NONE else (None, False) for name in names}
        config = LaunchConfig(target=embedded_target_folder(), drafters=drafters, k=k,
                              max_model_len=VLLM_MAX_CONTEXT, **launch_options)
        launched = Launched(config, status, ports)
        servers = launched.wait_healthy(status=status)
    else:
        servers = parse_urls(urls, k)
    if not servers:
        raise PlaygroundError("the vLLM backend needs --vllm-url NAME=URL (repeatable) or --launch")
    target = reference.target
    engine = VLLMEngine(servers, target.tokenizer, min(VLLM_MAX_CONTEXT, target.max_context), target.eos_ids,
                        max_tokens_limit=reference.max_tokens_limit)
    return engine, launched


class StartingBackend:
    """The vLLM backend while its servers start: the page is up at once, and a run on this backend
    gets the start-up status as its message until every server is healthy (or the reason it failed)."""

    name = "vllm"
    shows_drafter_internals = False

    def __init__(self, start: Callable[[Callable[[str], None]], VLLMEngine]):
        self.lines: list[str] = ["starting the vLLM servers"]
        self.engine: VLLMEngine | None = None
        self.error: str | None = None
        threading.Thread(target=self._start, args=(start,), daemon=True, name="vllm-start").start()

    def _start(self, start: Callable[[Callable[[str], None]], VLLMEngine]) -> None:
        try:
            self.engine = start(self._status)
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

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        return self.ready().generate(request)

    def drafter_info(self, name: str):
        return self.ready().drafter_info(name)

    def limitations(self, drafter: str) -> str:
        return self.ready().limitations(drafter)

