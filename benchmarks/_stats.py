"""Small statistics for benchmarks on a shared, noisy machine: medians with a bootstrap
confidence interval (percentile method, seeded: the same samples give the same interval), and
the ratios of the real-run benchmarks (a variant's rounds against plain's, round by round)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

#: Bootstrap resamples per interval.
RESAMPLES = 4000


def _interval(items: Sequence[Any], statistic: Callable[[Sequence[Any]], float], level: float,
              seed: int) -> tuple[float, float]:
    """The `level` percentile-bootstrap interval of `statistic` over `items` resampled with
    replacement (seeded: the same items give the same interval)."""
    rng = random.Random(seed)
    n = len(items)
    samples = sorted(statistic(rng.choices(items, k=n)) for _ in range(RESAMPLES))
    tail = (1 - level) / 2
    return samples[int(tail * (RESAMPLES - 1))], samples[int((1 - tail) * (RESAMPLES - 1))]


def median_ci(values: Sequence[float], level: float = 0.95,
              seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` and a `level` bootstrap interval of it."""
    if not values:
        return 0.0, 0.0, 0.0
    median = statistics.median(values)
    if len(values) < 3:
        return median, min(values), max(values)
    return (median, *_interval(values, statistics.median, level, seed))


def fmt_ci(values: Sequence[float], digits: int = 3, unit: str = "") -> str:
    """``median [low-high]`` of `values` (95 % bootstrap interval of the median)."""
    median, low, high = median_ci(values)
    return f"{median:.{digits}f}{unit} [{low:.{digits}f}–{high:.{digits}f}]"


def ratio_of_medians_ci(variant: Sequence[float], plain: Sequence[float], level: float = 0.95,
                        seed: int = 0) -> tuple[float, float, float]:
    """(ratio, low, high): median(variant) / median(plain) of paired rounds, and a `level`
    bootstrap interval of it. The rounds are resampled whole (both runs of round i together:
    they shared the machine's state), so the interval says how far another set of rounds of
    the same code could put the ratio. Under 3 rounds: the range of the per-round ratios."""
    pairs = list(zip(variant, plain, strict=True))
    if not pairs or not statistics.median(plain):
        return 0.0, 0.0, 0.0
    ratio = statistics.median(variant) / statistics.median(plain)
    if len(pairs) < 3:  # too few to resample: the per-round ratios' range, as `median_ci` does
        per_round = [v / p for v, p in pairs if p]
        return ratio, min(per_round, default=ratio), max(per_round, default=ratio)
    return (ratio, *_interval(pairs, _ratio_of_medians, level, seed))


def _ratio_of_medians(pairs: Sequence[tuple[float, float]]) -> float:
    below = statistics.median(p for _, p in pairs)
    return statistics.median(v for v, _ in pairs) / below if below else 0.0


def round_ratios(runs: dict[str, list[dict[str, Any]]], variant: str,
                 keys: Sequence[str], base: str = "plain") -> dict[str, Any]:
    """`variant` / `base` for each of `keys` of a real-run benchmark's rows (one per round,
    the same rounds for every variant): the ratio of medians with its 95 % interval
    (`ratio_of_medians_ci`), the spread of the per-round ratios, and their median with its
    95 % interval."""
    ratios: dict[str, Any] = {}
    for key in keys:
        mine = [row[key] for row in runs[variant]]
        plain = [row[key] for row in runs[base]]
        per_round = [m / p for m, p in zip(mine, plain, strict=True) if p]
        of_medians, low, high = ratio_of_medians_ci(mine, plain)
        ratios[key] = {"of_medians": of_medians, "of_medians_ci": [low, high],
                       "per_round_min": min(per_round, default=0.0),
                       "per_round_max": max(per_round, default=0.0),
                       "per_round_median_ci": list(median_ci(per_round))}
    return ratios


def summarize_rounds(runs: dict[str, list[dict[str, Any]]],
                     keys: Sequence[str]) -> dict[str, Any]:
    """A real-run benchmark's results: medians (min-max) of `keys` per variant, its failed
    checks, and ``ratios``: otel_rl / plain (``variant_ratios``: the other variants', if any
    ran; ``against``: otel_rl / each ``otel_rl@REV`` variant), as `round_ratios` gives them."""
    summary: dict[str, Any] = {}
    for variant, rows in runs.items():
        summary[variant] = {"checks": sorted({c for r in rows for c in r["checks"]})}
        for key in keys:
            values = [r[key] for r in rows]
            summary[variant][key] = {"median": statistics.median(values), "min": min(values),
                                     "max": max(values)}
    others = {v: round_ratios(runs, v, keys) for v in runs if v not in ("plain", "otel_rl")}
    earlier = {v: round_ratios(runs, "otel_rl", keys, base=v)
               for v in runs if v.startswith("otel_rl@")}
    return {"summary": summary, "ratios": round_ratios(runs, "otel_rl", keys),
            **({"variant_ratios": others} if others else {}),
            **({"against": earlier} if earlier else {})}


def ratio_rows(ratios: dict[str, dict[str, Any]], keys: Sequence[str],
               over: str = "plain") -> list[str]:
    """The markdown rows of `round_ratios`'s results, three per variant (each over `over`)."""
    lines = []
    for variant, r in ratios.items():
        cells = [f"**{r[k]['of_medians']:.3f}×** ({r[k]['per_round_min']:.3f}–"
                 f"{r[k]['per_round_max']:.3f})" for k in keys]
        lines.append(f"| {variant} / {over} (per-round spread) | " + " | ".join(cells) + " |")
        cells = ["[{:.3f}–{:.3f}]".format(*r[k]["of_medians_ci"]) for k in keys]
        lines.append(f"| {variant} / {over}, 95 % interval of that ratio (rounds resampled) | "
                     + " | ".join(cells) + " |")
        cells = ["{:.3f} [{:.3f}–{:.3f}]".format(*r[k]["per_round_median_ci"]) for k in keys]
        lines.append(f"| {variant} / {over}, per-round median [95 % CI] | "
                     + " | ".join(cells) + " |")
    return lines


def against_rows(results: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """`ratio_rows` of otel_rl over each ``otel_rl@REV`` variant (none if none ran)."""
    return [row for base, r in results.get("against", {}).items()
            for row in ratio_rows({"otel_rl": r}, keys, over=base)]
