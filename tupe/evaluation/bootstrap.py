"""Percentile bootstrap over blocks, shared by every statistic of one evaluation so that differences are paired
(used by `tupe evaluate` and by the demo's paired comparison)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_STREAM = 103  # second seed word of the bootstrap's random stream
CI_LEVEL = 0.95


def bootstrap_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, BOOTSTRAP_STREAM])


@dataclass
class Ratio:
    """sum(num[b]) / sum(den[b]) over blocks b: a mean per token, resampled by block."""

    num: np.ndarray
    den: np.ndarray


def _statistic(terms: Sequence[tuple[float, Ratio]], idx: np.ndarray | None) -> np.ndarray | float:
    total: np.ndarray | float = 0.0
    for weight, r in terms:
        if idx is None:
            total = total + weight * r.num.sum() / max(r.den.sum(), 1e-300)
        else:
            total = total + weight * r.num[idx].sum(axis=-1) / np.maximum(r.den[idx].sum(axis=-1), 1e-300)
    return total


def bootstrap(
    statistics: dict[str, Sequence[tuple[float, Ratio]]],
    n_blocks: int,
    n_resamples: int,
    seed: int,
    level: float = CI_LEVEL,
) -> dict[str, dict[str, float | None]]:
    """Percentile bootstrap over blocks, shared by all statistics (so paired differences are paired).

    Each statistic is a weighted sum of ratios (weight +1 for a loss, +1/-1 for a difference). Resample r
    draws `n_blocks` block indices with replacement; all resamples are the rows of
    `bootstrap_rng(seed).integers(0, n_blocks, size=(n_resamples, n_blocks))` (drawn in chunks, same
    numbers), and the interval is `np.quantile(values, [(1 - level) / 2, (1 + level) / 2])`.
    """
    out: dict[str, dict[str, float | None]] = {
        name: {"value": float(_statistic(terms, None)), "low": None, "high": None}
        for name, terms in statistics.items()
    }
    if n_resamples <= 0 or n_blocks == 0:
        return out
    rng = bootstrap_rng(seed)
    values = {name: np.empty(n_resamples) for name in statistics}
    chunk = max(1, min(n_resamples, 4_000_000 // max(n_blocks, 1)))
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        idx = rng.integers(0, n_blocks, size=(size, n_blocks))
        for name, terms in statistics.items():
            values[name][start : start + size] = _statistic(terms, idx)
    q = [(1 - level) / 2, (1 + level) / 2]
    for name in statistics:
        low, high = np.quantile(values[name], q)
        out[name]["low"], out[name]["high"] = float(low), float(high)
    return out


def compared(d: dict) -> str:
    """How a paired difference (candidate - reference, with its interval) reads in a sentence: "lower (better)
    than", "higher (worse) than", or "not distinguishable from" where the interval holds 0."""
    if d["high"] < 0:
        return "lower (better) than"
    if d["low"] > 0:
        return "higher (worse) than"
    return "not distinguishable from"
