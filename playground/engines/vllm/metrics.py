"""A vLLM server's Prometheus `/metrics`, read as the counters of its speculative decoding.

vLLM counts, over all the traffic a server has served since it started: verify steps with drafts
(`vllm:spec_decode_num_drafts_total`), draft tokens, accepted draft tokens, accepted tokens by
draft position, and generated tokens; two gauges say how many requests run and wait. Every
counter is summed over its label sets (one per engine of a data-parallel server). The page is read
by prometheus_client's parser (the Prometheus project's own, which vLLM exports its metrics with).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from playground.engines.vllm.api import call
from playground.errors import PlaygroundError

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
READ = {*COUNTERS.values(), PER_POSITION, *GAUGES.values()}
# prometheus_client's, for the API server's process; absent where vLLM runs several API server
# processes (their metrics are then gathered from files and carry no start time)
STARTED = "process_start_time_seconds"


class MetricsError(PlaygroundError):
    """The server answered /metrics with something that is not vLLM's metrics."""


@dataclass(frozen=True)
class SpecCounters:
    """One reading of a server's counters. `drafts` is None on a server without speculation."""
    drafts: float | None
    draft_tokens: float
    accepted: float
    accepted_per_position: tuple[float, ...]   # by draft position, 0 first
    generation_tokens: float
    running: float
    waiting: float
    started: float | None = None   # when the server's process started (seconds since the epoch)

    @property
    def speculative(self) -> bool:
        return self.drafts is not None

    def went_back_from(self, earlier: SpecCounters) -> bool:
        """Whether the server restarted since `earlier`: it started at another time, with other
        speculative settings, or a counter is lower."""
        if self.started is not None and earlier.started is not None and self.started != earlier.started:
            return True
        if self.speculative != earlier.speculative or len(self.accepted_per_position) != len(
                earlier.accepted_per_position):
            return True   # started again with other speculative settings
        pairs = [(self.generation_tokens, earlier.generation_tokens), (self.draft_tokens, earlier.draft_tokens),
                 (self.accepted, earlier.accepted), (self.drafts or 0.0, earlier.drafts or 0.0)]
        pairs += [(self.position(d), earlier.position(d)) for d in range(len(earlier.accepted_per_position))]
        return any(now < before for now, before in pairs)

    def position(self, depth: int) -> float:
        return self.accepted_per_position[depth] if depth < len(self.accepted_per_position) else 0.0


def parse_metrics(text: str) -> SpecCounters:
    """The counters in a Prometheus text page; a page that is not Prometheus text, or not vLLM's, is a
    one-line MetricsError."""
    try:
        samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError as e:
        raise MetricsError(f"/metrics does not parse as Prometheus text ({' '.join(str(e).split())[:120]})") from None
    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    started = None
    for sample in samples:
        if sample.name == STARTED:
            started = sample.value
        if sample.name not in READ:
            continue
        if math.isnan(sample.value):
            raise MetricsError(f"/metrics: {sample.name} is not a number")
        if sample.name == PER_POSITION:
            position = sample.labels.get("position", "")
            if not position.isdigit():
                raise MetricsError(f"/metrics: {PER_POSITION} without a position")
            per_position[int(position)] = per_position.get(int(position), 0.0) + sample.value
        else:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if COUNTERS["generation_tokens"] not in totals:
        raise MetricsError("/metrics has no vllm:generation_tokens_total: not a vLLM server's metrics")
    positions = tuple(per_position.get(d, 0.0) for d in range(max(per_position) + 1)) if per_position else ()
    return SpecCounters(drafts=totals.get(COUNTERS["drafts"]),
                        draft_tokens=totals.get(COUNTERS["draft_tokens"], 0.0),
                        accepted=totals.get(COUNTERS["accepted"], 0.0), accepted_per_position=positions,
                        generation_tokens=totals[COUNTERS["generation_tokens"]],
                        running=totals.get(GAUGES["running"], 0.0), waiting=totals.get(GAUGES["waiting"], 0.0),
                        started=started)


def read_counters(client: httpx.Client, url: str) -> SpecCounters:
    """The counters of the server at `url` now: a PlaygroundError when it does not answer, a
    MetricsError when its answer is not vLLM's metrics."""
    text = call(client, "GET", url, "/metrics").text
    try:
        return parse_metrics(text)
    except MetricsError as e:
        raise MetricsError(f"{url}{e}") from None

