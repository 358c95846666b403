"""Building the vLLM backend next to the reference engine: given server URLs, or servers it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from playground.eagle.drafter import save_drafter
from playground.eagle.registry import SHIPPED, shipped_path
from playground.engines.reference import ReferenceEngine
from playground.engines.vllm_client import Server, VLLMEngine
from playground.engines.vllm_launch import Launched, LaunchConfig
from playground.errors import PlaygroundError
from playground.target import embedded_target_folder

VLLM_MAX_CONTEXT = 8192  # the target's own; long-context benchmark prompts reach about 4.1k tokens


def drafter_folder(engine: ReferenceEngine, name: str) -> tuple[Path, bool]:
    """A checkpoint folder vLLM can load: the shipped one, or the seeded random drafter saved once."""
    path = shipped_path(name)
    if (path / "model.safetensors").exists():
        return path, True
    folder = embedded_target_folder().parent / "drafters" / f"{name}-random"
    if not (folder / "model.safetensors").exists():
        save_drafter(engine.drafters.random(eagle31=SHIPPED[name]), folder)
    return folder, False


def parse_urls(specs: list[str], k: int) -> list[Server]:
    """`NAME=URL` pairs, e.g. eagle3.1=http://127.0.0.1:8101."""
    servers = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or name not in (*SHIPPED, "none") or not url.startswith("http"):
            raise PlaygroundError(f"bad --vllm-url {spec!r}: use NAME=URL with NAME one of eagle3, eagle3.1, none")
        servers.append(Server(name, url.rstrip("/"), k))
    return servers


def vllm_backend(reference: ReferenceEngine, urls: list[str], launch: bool, k: int = 5,
                 names: tuple[str, ...] = ("eagle3", "eagle3.1", "none"), status: Callable[[str], None] = print,
                 **launch_options) -> tuple[VLLMEngine, Launched | None]:
    """The vLLM engine over given servers, or over servers it starts (one per name in `names`)."""
    launched = None
    if launch:
        drafters = {name: drafter_folder(reference, name) if name != "none" else (None, False) for name in names}
        config = LaunchConfig(target=embedded_target_folder(), drafters=drafters, k=k,
                              max_model_len=VLLM_MAX_CONTEXT, **launch_options)
        launched = Launched(config, status)
        servers = launched.wait_healthy(status=status)
    else:
        servers = parse_urls(urls, k)
    if not servers:
        raise PlaygroundError("the vLLM backend needs --vllm-url NAME=URL (repeatable) or --launch")
    target = reference.target
    engine = VLLMEngine(servers, target.tokenizer, min(VLLM_MAX_CONTEXT, target.max_context), target.eos_ids,
                        max_tokens_limit=reference.max_tokens_limit)
    return engine, launched
