"""Bootstrap confidence intervals of a mean, and of a paired or unpaired difference of means.

    >>> mean_ci([0.2, 0.4, 0.3])                       # (mean, lo, hi): percentile bootstrap, 95%
    >>> paired_diff_ci(start_rewards, end_rewards)     # end - start on the same episode seeds
    >>> diff_ci(first_steps_rewards, last_steps_rewards)   # different episodes: each side resampled alone
    >>> t_interval(gains_of_three_seeds)               # Student's t, seeds as the unit
    >>> ratio_ci([1, 0, 2], [2, 1, 2])                  # pooled 3/5, episodes (with their pairs) resampled
    >>> ci_text(0.1, 0.05, 0.2, signed=True)            # '+0.100 [+0.050, +0.200]', as the tables print it

Percentile bootstrap: resample the values (for a paired difference: the episode indices, so each
episode's start and end stay together) with replacement ``resamples`` times with a seeded numpy
RNG, take the mean of each resample, and report the 2.5% and 97.5% quantiles. Same inputs, same
interval. With few values the interval is too narrow (the bootstrap does not know the tails it
has not seen); with 2 values it is only the range of the means it can draw.
"""

from __future__ import annotations

import statistics
from typing import Sequence

RESAMPLES = 2000
LEVEL = 0.95


def _means(x, rng, resamples: int):
    """The means of ``resamples`` resamples of ``x`` (with replacement, each the size of ``x``)."""
    return x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)


def _bounds(samples, level: float) -> tuple[float, float]:
    import numpy as np

    lo, hi = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _interval(values, resamples: int, level: float, seed: int) -> tuple[float, float, float]:
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"need a non-empty list of numbers, got {len(x)} values")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    return (mean, *_bounds(_means(x, np.random.default_rng(seed), resamples), level))


def mean_ci(values: Sequence[float], resamples: int = RESAMPLES, level: float = LEVEL,
            seed: int = 0) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of ``values`` and its percentile-bootstrap ``level`` interval."""
    return _interval(values, resamples, level, seed)


def paired_diff_ci(before: Sequence[float], after: Sequence[float], resamples: int = RESAMPLES,
                   level: float = LEVEL, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of ``after[i] - before[i]``: the pairs are resampled together (same episode seeds)."""
    if len(before) != len(after):
        raise ValueError(f"a paired difference needs the same episodes before and after: {len(before)} values "
                         f"before, {len(after)} after")
    return _interval([a - b for a, b in zip(after, before)], resamples, level, seed)


def ratio_ci(numerators: Sequence[float], denominators: Sequence[float], resamples: int = RESAMPLES,
             level: float = LEVEL, seed: int = 0) -> tuple[float, float, float] | None:
    """``(sum(num) / sum(den), lo, hi)``: a pooled rate (e.g. switches per adjacent job pair) with its percentile
    bootstrap interval, resampling the units (episodes) so that each keeps its numerator and denominator together.
    Units with a zero denominator carry nothing and are dropped; None when none is left."""
    import numpy as np

    if len(numerators) != len(denominators):
        raise ValueError(f"need one denominator per numerator, got {len(numerators)} and {len(denominators)}")
    keep = [(float(n), float(d)) for n, d in zip(numerators, denominators) if d]
    if not keep:
        return None
    num, den = (np.asarray(x) for x in zip(*keep))
    rate = float(num.sum() / den.sum())
    if num.size == 1:
        return rate, rate, rate
    idx = np.random.default_rng(seed).integers(0, num.size, size=(resamples, num.size))
    return (rate, *_bounds(num[idx].sum(axis=1) / den[idx].sum(axis=1), level))


def ci_text(mean: float | None, lo: float | None, hi: float | None, signed: bool = False, digits: int = 3) -> str:
    """``0.123 [0.100, 0.150]`` for tables (``+`` signs with ``signed``): ``-`` without a mean, the mean alone
    without bounds."""
    if mean is None:
        return "-"
    f = "{:" + ("+" if signed else "") + f".{digits}f}}"
    return f.format(mean) + ("" if lo is None or hi is None else f" [{f.format(lo)}, {f.format(hi)}]")


def episodes_for(sd_diff: float, change: float, z: float = 1.96) -> int:
    """Episodes whose paired 95% interval half-width is ``change`` when the per-episode difference has ``sd_diff``."""
    import math

    return max(2, math.ceil((z * sd_diff / change) ** 2))


def diff_ci(before: Sequence[float], after: Sequence[float], resamples: int = RESAMPLES, level: float = LEVEL,
            seed: int = 0) -> tuple[float, float, float]:
    """``(mean(after) - mean(before), lo, hi)``: each side resampled on its own (different episodes, no pairs)."""
    import numpy as np

    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"need values on both sides, got {a.size} before and {b.size} after")
    rng = np.random.default_rng(seed)
    return (float(b.mean() - a.mean()), *_bounds(_means(b, rng, resamples) - _means(a, rng, resamples), level))


# Student's t, 97.5% quantile, by degrees of freedom 1-30 (seeds - 1); beyond, 1.96 + 2.5 / df is within 0.002.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean of ``values`` (each seed one observation; None under 2)."""
    if len(values) < 2:
        return None
    df = len(values) - 1
    t = T975[df - 1] if df <= len(T975) else 1.96 + 2.5 / df
    mean, half = statistics.fmean(values), t * statistics.stdev(values) / len(values) ** 0.5
    return mean - half, mean + half
