"""The drafter's attention by depth: the query of each probed request's drafting row in the drafter's
(first) attention layer, whose backend `forward` is wrapped on the instance, measured over the probe's own
copy of the request's keys (attention.py) when the round's drafts are all made."""

from __future__ import annotations

import functools
import time

import torch

from eagle_probe.attention import SINK_TOKENS, KeyCopy, Unavailable
from eagle_probe.worker import BUDGET, WORKER, Capture, Query, guarded


def watch_attention(impl) -> None:
    """Wrap the drafter attention backend's `forward` on this instance: vLLM calls it from its
    attention op's Python body (never traced into a compiled graph), after the step's keys are written."""
    original = impl.forward

    @functools.wraps(original)
    def forward(layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
        result = original(layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        capture = WORKER.capture
        if capture is not None and attn_metadata is not None:
            start = time.perf_counter()
            guarded("attention", _measure_attention, capture, impl, query, key, value, attn_metadata, args, kwargs)
            capture.spent_s += time.perf_counter() - start
        return result
    impl.forward = forward


def _measure_attention(capture: Capture, impl, query, key, value, attn_metadata, args: tuple, kwargs: dict) -> None:
    """Add the probed rows' keys of this drafter call to their copies, and measure each one's query."""
    output = kwargs["output"] if "output" in kwargs else args[0]
    depth = capture.calls - 1   # the pre-hook has counted this call
    if key is None or capture.positions is None or (depth == 0 and capture.first_rows is None) \
            or not hasattr(attn_metadata, "query_start_loc"):
        for row in capture.rows:
            capture.attention.setdefault(row, []).append(
                "the drafter's attention backend does not hand the probe its keys, positions and query rows")
        return
    starts = attn_metadata.query_start_loc.tolist()
    positions = capture.positions
    keys, values = (t.reshape(t.shape[0], impl.num_kv_heads, -1) for t in (key, value))
    for row, req in capture.rows.items():
        start, end = starts[row], starts[row + 1]
        if end <= start:
            continue
        capture.attention.setdefault(row, []).append(
            _measure_row(capture, impl, req, row, depth, start, end, positions, query, keys, values, output))


def _measure_row(capture: Capture, impl, req: str, row: int, depth: int, start: int, end: int, positions,
                 query, keys, values, output) -> Query | str:
    """One request's query at this depth, kept to be measured when the round ends, or why it has none.
    The row measured must be the one whose output becomes the draft: at depth 0 the row vLLM samples
    from, at depth d >= 1 the request's only row, at the position d after the round's first (the
    sink/draft split depends on it)."""
    at = capture.first_rows[row] if depth == 0 else start
    position = int(positions[at])
    if depth == 0:
        if not start <= at < end:
            return "the row vLLM drafts from lies outside the request's query rows: the probe cannot place it"
        capture.round_start[row] = position + 1
    elif end - start != 1 or position != capture.round_start[row] + depth - 1:
        return (f"at draft depth {depth + 1} the drafter's query is not one row at the position after the last "
                "draft: the probe would measure another row than the draft's")
    if req in WORKER.no_copy:
        return WORKER.no_copy[req]
    try:
        copy = WORKER.copies.get(req)
        if copy is None:
            copy = WORKER.copies[req] = KeyCopy(keys, values.shape[-1], BUDGET)
        copy.write(positions[start:end], keys[start:end], values[start:end])
    except Unavailable as e:   # over a limit: no copy at all for this request from now on
        _measure_queries(capture, row, req)   # the depths before this one attended within the limits
        WORKER.no_copy[req] = str(e)
        WORKER.drop_copy(req)
        return str(e)
    capture.scale = impl.scale
    return Query(query[at].reshape(impl.num_heads, -1).clone(), output[at].reshape(impl.num_heads, -1).clone(),
                 position)


def measure_round(capture: Capture) -> None:
    """Every probed row's queries of this round, measured at once over the row's key copy."""
    start = time.perf_counter()
    for row, req in capture.rows.items():
        _measure_queries(capture, row, req)
    capture.spent_s += time.perf_counter() - start


def _measure_queries(capture: Capture, row: int, req: str) -> None:
    """The row's queries kept so far this round, measured together and put in their depths' places."""
    by_depth = capture.attention.get(row) or []
    queries = [(d, q) for d, q in enumerate(by_depth) if isinstance(q, Query)]
    if not queries:
        return
    copy = WORKER.copies.get(req)
    if copy is None:
        for d, _ in queries:
            by_depth[d] = WORKER.no_copy.get(req, "the probe's key copy of this request is gone")
        return
    measured = copy.masses_of_round(torch.stack([q.query for _, q in queries]), [q.position for _, q in queries],
                                    capture.round_start[row], min(SINK_TOKENS, capture.prompt_tokens[row]),
                                    capture.scale, torch.stack([q.output for _, q in queries]))
    for (d, _), masses in zip(queries, measured):
        by_depth[d] = masses
