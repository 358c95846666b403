"""Draft trees (EAGLE-2's dynamic trees, which EAGLE-3's published speedups use).

The drafter expands the best `top_k` nodes of each depth by their `top_k` children, ranked by
cumulative draft log-probability; a global rerank keeps the best `nodes`. The target verifies
the whole tree in one forward: each node sees the committed context, its ancestors and itself
(`attention`), at the position its depth gives. Greedy acceptance takes the longest path whose
every token is the target's own argmax; sampling tries siblings in turn (`sample_path`). With
`top_k = 1` the tree is the chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from playground.errors import PlaygroundError

ROOT = -1          # the parent of depth-1 nodes: the last committed token
LIMITS = {"top_k": (1, 10), "depth": (1, 10), "nodes": (1, 64)}


@dataclass(frozen=True)
class TreeShape:
    """The defaults are the fastest shape `bench trees` measured on a 2-core CPU (docs/performance.md):
    beyond about 8 drafts a verify forward there costs more than the extra accepted tokens bring."""
    top_k: int = 2     # children per expanded node, and nodes expanded per depth
    depth: int = 4     # levels of drafts
    nodes: int = 8     # drafts kept after the global rerank (the target verifies nodes + 1 tokens)

    def __str__(self) -> str:
        return f"tree {self.top_k}/{self.depth}/{self.nodes}"

    def validate(self) -> "TreeShape":
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise PlaygroundError(f"tree {name.replace('_', '-')} must be between {low} and {high}, got {value}",
                                      f"tree_{name}")
        return self


@dataclass
class DraftTree:
    """Nodes in creation order: every parent comes before its children."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)     # index of the parent node, ROOT for depth 1
    depths: list[int] = field(default_factory=list)      # 1 for the root's children
    probs: list[float] = field(default_factory=list)     # the drafter's probability of the node given its parent
    scores: list[float] = field(default_factory=list)    # cumulative log-probability from the root

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, prob: float, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        self.probs.append(prob)
        self.scores.append(score)
        return len(self.tokens) - 1

    def children(self, parent: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == parent]

    def best(self, nodes: int) -> "DraftTree":
        """The `nodes` highest-scoring nodes, renumbered, parents before children. A child never
        scores above its parent, and ties keep creation order, so the kept set holds every ancestor
        of every kept node."""
        ranked = sorted(range(len(self)), key=lambda i: (-self.scores[i], i))[:nodes]
        kept, renumber = DraftTree(), {ROOT: ROOT}
        for i in sorted(ranked):
            if self.parents[i] in renumber:
                renumber[i] = kept.add(self.tokens[i], renumber[self.parents[i]], self.probs[i], self.scores[i])
        return kept

    def attention(self) -> torch.Tensor:
        """[1 + N, 1 + N] bool: row 0 (the last committed token) and each node see the root, their
        ancestors and themselves."""
        n = len(self) + 1
        mask = torch.eye(n, dtype=torch.bool)
        mask[:, 0] = True
        for i, parent in enumerate(self.parents):
            if parent != ROOT:
                mask[i + 1] |= mask[parent + 1]
        return mask

    def longest_match(self, predicted: list[int]) -> list[int]:
        """The accepted path (node indices from depth 1) under greedy verification: `predicted[0]`
        is the target's token after the root, `predicted[1 + i]` after node i."""
        path, current = [], ROOT
        while True:
            want = predicted[current + 1]
            match = next((i for i in self.children(current) if self.tokens[i] == want), None)
            if match is None:
                return path
            path.append(match)
            current = match

    def sample_path(self, target_p: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
        """Sampling acceptance: (the accepted path, the token the target adds after it).

        `target_p[0]` is the target's distribution after the root, `target_p[1 + i]` after node i.
        At each accepted node its children are tried in turn, likeliest first: child x is accepted
        with probability p(x) / (mass left); if not, x's mass is removed and the next child is
        tried; if none is accepted, the token comes from what is left of p. This is exact because
        the drafts were chosen without the target's randomness: the chance that x comes out is the
        chance that every earlier child was refused, prod(1 - p(c_j) / left_j) = left_i, times
        p(x) / left_i, that is p(x); and a token that is no child comes out with
        left_final * p(y) / left_final = p(y). Then the same holds one depth down."""
        path, current = [], ROOT
        while True:
            p = target_p[current + 1].clone()
            accepted = None
            for child in sorted(self.children(current), key=lambda i: -self.scores[i]):
                left = float(p.sum())
                if left > 0 and float(torch.rand((), generator=generator)) * left < float(p[self.tokens[child]]):
                    accepted = child
                    break
                p[self.tokens[child]] = 0.0
            if accepted is None:
                return path, int(torch.multinomial(p / p.sum(), 1, generator=generator))
            path.append(accepted)
            current = accepted

    def main_line(self, path: list[int]) -> list[int]:
        """The accepted path, then its best-scoring descendants one by one: the drafts a chain view
        shows for this step (the first len(path) accepted, the next one rejected)."""
        line = list(path)
        current = path[-1] if path else ROOT
        while children := self.children(current):
            current = max(children, key=lambda i: self.scores[i])
            line.append(current)
        return line
