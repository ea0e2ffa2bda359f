"""Small statistics for benchmarks on a shared, noisy machine: medians with a bootstrap
confidence interval (percentile method, seeded: the same samples give the same interval)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

#: Bootstrap resamples per interval.
RESAMPLES = 4000


def median_ci(values: Sequence[float], level: float = 0.95,
              seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` and a `level` bootstrap interval of it."""
    if not values:
        return 0.0, 0.0, 0.0
    median = statistics.median(values)
    if len(values) < 3:
        return median, min(values), max(values)
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(RESAMPLES))
    tail = (1 - level) / 2
    return (median, medians[int(tail * (RESAMPLES - 1))],
            medians[int((1 - tail) * (RESAMPLES - 1))])


def fmt_ci(values: Sequence[float], digits: int = 3, unit: str = "") -> str:
    """``median [low-high]`` of `values` (95 % bootstrap interval of the median)."""
    median, low, high = median_ci(values)
    return f"{median:.{digits}f}{unit} [{low:.{digits}f}–{high:.{digits}f}]"
