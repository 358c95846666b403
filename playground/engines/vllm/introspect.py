"""What a vLLM server says about itself: the model it serves, whether and how it speculates.

Every server tells its served name, the model it loaded and its context (`/v1/models`), and
whether it speculates and with how many draft positions (the spec-decode counters of
`/metrics`). Which drafter it runs, and whether it reports per-step counts, a server publishes
where it runs the probe (its `/status`, behind the API key) or was started with
VLLM_SERVER_DEV_MODE=1 (`/server_info`, open to anyone). An EAGLE-3 drafter is EAGLE 3 or EAGLE
3.1 by the switches of its config.json, read where this machine can read it (its folder, or the
Hugging Face cache). What a server does not publish stays None, and the page says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import httpx

from playground.engines.vllm.api import call, call_json
from playground.engines.vllm.probe import probe_status
from playground.errors import PlaygroundError
from playground.model.drafter import variant_of
from playground.model.variants import NONE

EAGLE_METHODS = ("eagle3",)   # vLLM's method for EAGLE-3 drafters, whichever format their checkpoint has
DRAFT_POSITION = re.compile(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{.*position="(\d+)"')


@dataclass(frozen=True)
class ServerInfo:
    url: str
    model: str               # the served name, sent with every request
    root: str                # what it loaded: a folder on its machine or a hub id
    max_model_len: int
    speculative: bool
    k: int | None            # draft positions, when it speculates
    config: dict | None      # /server_info's vllm_config, when published
    probe: str | None = None  # the eagle_probe plugin's version, when the server runs it and it records drafts
    probe_off: str = ""       # why a server that runs the probe records no drafts (another model runner, ...)
    switches: tuple[bool, bool] | None = None   # the EAGLE-3 drafter's (fc_norm, norm_output), when readable
    sampling_fault: str = ""  # why it samples speculative requests wrongly, where its probe found it does
    sampling_unchecked: str = ""  # why its probe could not check that, where it could not

    @property
    def target(self) -> str:
        """The model's name without its folder or hub organisation: what two servers of one
        target share even when they loaded it from different places."""
        return PurePosixPath(self.root.rstrip("/")).name or self.root

    @property
    def speculative_config(self) -> dict:
        return (self.config or {}).get("speculative_config") or {}

    @property
    def drafter_source(self) -> str | None:
        """The drafter's folder or hub id (None for methods without a model, which vLLM names by the method)."""
        model = self.speculative_config.get("model")
        return model if model != self.method else None

    @property
    def method(self) -> str | None:
        return self.speculative_config.get("method")

    @property
    def variant(self) -> str | None:
        """none, eagle3 or eagle3.1 (by the drafter's switches), or vLLM's method (ngram, ...); None for
        a drafter the server does not describe."""
        if not self.speculative:
            return NONE
        if self.method in EAGLE_METHODS:
            return variant_of(*self.switches) if self.switches else None
        return self.method

    @property
    def prefill_chunk(self) -> int | None:
        """The most prompt tokens one engine step prefills, where published: a longer prompt is prefilled
        in chunks of it (the scheduler's budget, `max_num_scheduled_tokens`, which vLLM sets from
        `--max-num-batched-tokens`: vllm/config/vllm.py, _set_max_num_scheduled_tokens)."""
        scheduler = (self.config or {}).get("scheduler_config") or {}
        chunk = scheduler.get("max_num_scheduled_tokens") or scheduler.get("max_num_batched_tokens")
        return chunk if isinstance(chunk, int) else None

    @property
    def chunked_prefill_fault(self) -> str:
        """What vLLM's padded drafter batch does to an EAGLE drafter on prompts longer than one prefill
        chunk ("" where it cannot happen or is not known to): docs/findings/chunked-prefill.md."""
        chunk = self.prefill_chunk
        if self.method not in EAGLE_METHODS or chunk is None or chunk >= self.max_model_len \
                or self.speculative_config.get("disable_padded_drafter_batch"):
            return ""
        return (f"It prefills prompts longer than {chunk:,} tokens in chunks, and vLLM's padded drafter batch then "
                "gives the drafter the prompt's last token at each chunk boundary where the next one belongs: on "
                "such prompts its drafts depart slightly from a one-chunk prefill (docs/findings/chunked-prefill.md).")

    @property
    def reports_steps(self) -> bool | None:
        """Whether its streams end with every verify step's counts (None: not published)."""
        if self.config is None:
            return None
        return (self.config.get("observability_config") or {}).get("per_request_spec_decode_metrics") == "detailed"

    def describe(self) -> str:
        """One line for people: the model, and what is known of the drafter."""
        if not self.speculative:
            drafting = "no speculation"
        else:
            lookup = [self.speculative_config.get(f"prompt_lookup_{end}") for end in ("min", "max")]
            drafter = (f"{self.variant or self.method} drafter {self.drafter_source}" if self.drafter_source
                       else f"n-gram prompt lookup ({lookup[0]}-{lookup[1]} tokens)" if self.method == "ngram"
                       else f"{self.method} drafting" if self.method
                       else "a drafter it does not name (start it with VLLM_SERVER_DEV_MODE=1 to publish it)")
            drafting = f"{drafter}, k = {self.k}"
        probe = f"; eagle_probe {self.probe}" if self.probe else "; eagle_probe off" if self.probe_off else ""
        return f"{self.model} ({self.root}, context {self.max_model_len:,}) with {drafting}{probe}"


def inspect_server(url: str, client: httpx.Client) -> ServerInfo:
    """Ask the server at `url`; a server that cannot be reached or is not vLLM is a PlaygroundError."""
    models = call_json(client, "GET", url, "/v1/models").get("data") or []
    if not models:
        raise PlaygroundError(f"the server at {url} serves no model")
    card = models[0]
    if not isinstance(card, dict) or not card.get("id"):
        raise PlaygroundError(f"the server at {url} does not name its model in /v1/models")
    metrics = call(client, "GET", url, "/metrics").text
    positions = {int(m.group(1)) for line in metrics.splitlines() if (m := DRAFT_POSITION.match(line))}
    speculative = "vllm:spec_decode_num_drafts_total" in metrics
    try:   # development mode only
        config = call_json(client, "GET", url, "/server_info", params={"config_format": "json"}).get("vllm_config")
    except PlaygroundError:
        config = None
    probe = probe_status(client, url)
    config = config or probe.config   # a server's probe publishes what development mode would
    k = ((config or {}).get("speculative_config") or {}).get("num_speculative_tokens") or (
        max(positions) + 1 if positions else None)
    info = ServerInfo(url=url, model=card["id"], root=str(card.get("root") or card["id"]),
                      max_model_len=int(card.get("max_model_len") or 0), speculative=speculative,
                      k=k if speculative else None, config=config if isinstance(config, dict) else None,
                      probe=probe.version if not probe.off else None, probe_off=probe.off,
                      sampling_fault=probe.sampling_fault, sampling_unchecked=probe.sampling_unchecked)
    if info.speculative and info.method in EAGLE_METHODS and isinstance(info.drafter_source, str):
        return replace(info, switches=drafter_switches(info.drafter_source))
    return info


def drafter_switches(source: str) -> tuple[bool, bool] | None:
    """(fc_norm, norm_output) from the config.json of the drafter `source` (a folder, or a hub id in the
    Hugging Face cache), in the plain or the speculators format; None where it cannot be read here."""
    path = Path(source) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source, "config.json")
        except Exception:   # not a hub id
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return (bool(data.get("fc_norm")), bool(data.get("norm_output"))) if isinstance(data, dict) else None
