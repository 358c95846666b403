"""Intervals over prompts: percentile bootstrap intervals and paired ratios of figures pooled over
prompts (the prompt, or a cluster of prompts, is the unit resampled)."""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

Statistic = Callable[[np.ndarray], np.ndarray]   # index rows (..., units) -> one value per row


def bootstrap_interval(statistic: Statistic, units: int, level: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of a statistic over `units` independent units (prompts), resampled
    with replacement; `statistic` gets every resample at once, as rows of unit indices, and returns a
    value per row. Seeded, so a table reprints the same interval."""
    values = np.asarray(statistic(_resamples(units, resamples, seed)), dtype=float)
    values = np.sort(values[~np.isnan(values)])   # NaN: a resample without any unit that has a value
    tail, n = (1 - level) / 2, len(values)
    return float(values[int(tail * n)]), float(values[min(n - 1, int((1 - tail) * n))])


@lru_cache(maxsize=4)
def _resamples(units: int, resamples: int, seed: int) -> np.ndarray:
    """The resamples' unit indices [resamples, units], drawn once per size: a report's intervals over the
    same prompts share them (drawn with `random`, whose stream earlier tables were printed with)."""
    rng = random.Random(seed)
    return np.array([[rng.randrange(units) for _ in range(units)] for _ in range(resamples)], dtype=np.int32)


def value_of(statistic: Statistic, units: int) -> float:
    """The statistic over all the units, once."""
    return float(statistic(np.arange(units)))


def paired_ratio(numerator: Statistic, denominator: Statistic, units: int) -> tuple[float, tuple[float, float]]:
    """numerator / denominator over all `units` (prompts), with a 95% paired bootstrap interval: a
    resample draws the same prompts for both, so that what the prompts share cancels out."""
    ratio = lambda idx: numerator(idx) / denominator(idx)
    return value_of(ratio, units), bootstrap_interval(ratio, units)


def tau_of(counts: Sequence[tuple[int, int]]) -> Statistic:
    """The pooled tau of the prompts at the given indices of `counts` (accepted drafts, drafting steps)."""
    accepted, steps = (np.array([c[i] for c in counts], dtype=np.int64).reshape(-1) for i in (0, 1))
    return lambda idx: 1.0 + accepted[idx].sum(-1) / np.maximum(steps[idx].sum(-1), 1)


def rate_of(tokens: Sequence[float], seconds: Sequence[float]) -> Statistic:
    """Tokens per second pooled over the prompts at the given indices."""
    tokens, seconds = np.asarray(tokens, dtype=float), np.asarray(seconds, dtype=float)
    return lambda idx: tokens[idx].sum(-1) / np.maximum(seconds[idx].sum(-1), 1e-9)
