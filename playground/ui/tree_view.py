"""A verify step's draft tree as an SVG: nodes by depth from left to right, the accepted path green,
verified-and-rejected nodes red, nodes never reached grey, and the target's own token blue at the
end of the accepted path. Hovering a node shows its text, drafter probability and score."""

from __future__ import annotations

from html import escape

from playground.engines.events import StepEvent
from playground.ui.render import visible

COLUMN, ROW, BOX_W, BOX_H, LABEL_CHARS = 112, 30, 96, 22, 10
KIND = {"accepted": "acc", "rejected": "rej", "unreached": "unr"}


def tree_html(event: StepEvent | None) -> str:
    if event is None or not event.tree_ids:
        return ""   # a chain: nothing to draw
    order = _rows(event)
    node_rows = {-1: 0, **order}
    last = event.tree_path[-1] if event.tree_path else -1
    # the target's token follows the last accepted node: on its row, or below the tree where its
    # (rejected) children already sit; there is none when the sequence ended on that node
    has_target = len(event.token_ids) > len(event.tree_path)
    target_row = max(order.values()) + 1 if last in event.tree_parents else node_rows[last]
    target_depth = len(event.tree_path) + 1 if has_target else 0
    width = COLUMN * (max(max(event.tree_depths), target_depth) + 1) + 8
    height = ROW * (max(target_row if has_target else 0, *order.values()) + 1) + 8
    y = lambda row: 6 + row * ROW
    x = lambda depth: 4 + depth * COLUMN
    parts = []
    for i, parent in enumerate(event.tree_parents):   # edges first, under the boxes
        parts.append(_edge(x(event.tree_depths[i] - 1), y(node_rows[parent]), x(event.tree_depths[i]), y(order[i])))
    if has_target:
        parts.append(_edge(x(target_depth - 1), y(node_rows[last]), x(target_depth), y(target_row), "tgt"))
    parts.append(_box(x(0), y(0), "ctx", "context", "the committed text"))
    for i, verdict in enumerate(event.tree_verdicts):
        hover = (f"{event.tree_texts[i]!r}: drafter p {event.tree_probs[i]:.3f}, score (log p from the context) "
                 f"{event.tree_scores[i]:.2f}, depth {event.tree_depths[i]}, {verdict}")
        parts.append(_box(x(event.tree_depths[i]), y(order[i]), KIND[verdict], event.tree_texts[i], hover))
    if has_target:
        target_text = event.token_texts[-1]
        parts.append(_box(x(target_depth), y(target_row), "tgt", target_text, f"{target_text!r}: the target's token"))
    return (f'<div class="tree"><div class="tree-head">draft tree of step {event.step}: {len(event.tree_ids)} nodes, '
            f'{event.accepted} accepted</div><svg width="{width}" height="{height}" role="img" '
            f'aria-label="draft tree of step {event.step}">{"".join(parts)}</svg></div>')


def _rows(event: StepEvent) -> dict[int, int]:
    """Each node's row: children below their parent in score order, subtree after subtree."""
    rows, next_row = {}, [0]

    def place(parent: int) -> None:
        children = sorted((i for i, p in enumerate(event.tree_parents) if p == parent),
                          key=lambda i: -event.tree_scores[i])
        for n, child in enumerate(children):
            if n:
                next_row[0] += 1
            rows[child] = next_row[0]
            place(child)

    place(-1)
    return rows


def _edge(x0: float, y0: float, x1: float, y1: float, kind: str = "") -> str:
    return (f'<line class="edge {kind}" x1="{x0 + BOX_W}" y1="{y0 + BOX_H / 2}" x2="{x1}" '
            f'y2="{y1 + BOX_H / 2}"/>')


def _box(x: float, y: float, kind: str, text: str, hover: str) -> str:
    label = visible(text)
    label = label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"
    return (f'<g class="node {kind}"><title>{escape(hover)}</title><rect x="{x}" y="{y}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="4"/><text x="{x + 6}" y="{y + 15}">{escape(label)}</text></g>')


CSS = """
.tree { overflow-x: auto; }
.tree-head { font-size: 13px; margin: 4px 0; }
.tree svg text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; fill: currentColor; }
.tree .edge { stroke: #9ca3af; stroke-width: 1.2; } .tree .edge.tgt { stroke: #3b82f6; }
.tree .node rect { stroke-width: 1.2; }
.tree .node.acc rect { fill: rgba(34, 197, 94, 0.28); stroke: #15803d; }
.tree .node.rej rect { fill: rgba(239, 68, 68, 0.22); stroke: #b91c1c; }
.tree .node.unr rect { fill: rgba(156, 163, 175, 0.15); stroke: #9ca3af; }
.tree .node.tgt rect { fill: rgba(59, 130, 246, 0.22); stroke: #2563eb; }
.tree .node.ctx rect { fill: none; stroke: #9ca3af; stroke-dasharray: 3 2; }
"""
