"""The statistics the real-run benchmarks report (`benchmarks/_stats.py`): the ratio of medians
of paired rounds and its bootstrap interval. The item-4 targets of issue 19 are read off these
numbers, so what they mean is pinned here."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _stats() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otel_rl_benchmarks_stats",
                                                  BENCHMARKS / "_stats.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stats = _stats()


def _rows(values: list[float]) -> list[dict[str, object]]:
    return [{"cpu_s": v, "fps": 1000.0 / v, "checks": []} for v in values]


def test_rounds_are_resampled_in_pairs() -> None:
    # Each round's otel_rl run took exactly 5 % more than its plain pair, while the rounds
    # themselves moved by ±30 %: resampling rounds whole keeps the 5 %; resampling the two
    # variants apart would not.
    rng = random.Random(1)
    plain = [rng.uniform(30.0, 50.0) for _ in range(11)]
    ratio, low, high = stats.ratio_of_medians_ci([1.05 * p for p in plain], plain)
    assert ratio == pytest.approx(1.05)
    assert low == pytest.approx(1.05) and high == pytest.approx(1.05)


def test_the_interval_holds_the_ratio_and_widens_with_the_noise() -> None:
    rng = random.Random(2)
    plain = [rng.uniform(36.0, 40.0) for _ in range(11)]
    quiet = [p * rng.uniform(0.99, 1.03) for p in plain]
    noisy = [p * rng.uniform(0.90, 1.14) for p in plain]
    for variant in (quiet, noisy):
        ratio, low, high = stats.ratio_of_medians_ci(variant, plain)
        assert low <= ratio <= high
    _, quiet_low, quiet_high = stats.ratio_of_medians_ci(quiet, plain)
    _, noisy_low, noisy_high = stats.ratio_of_medians_ci(noisy, plain)
    assert noisy_high - noisy_low > 2 * (quiet_high - quiet_low)
    # Seeded: the same rounds give the same interval.
    assert stats.ratio_of_medians_ci(noisy, plain) == stats.ratio_of_medians_ci(noisy, plain)


def test_few_rounds_and_a_zero_plain_median() -> None:
    assert stats.ratio_of_medians_ci([2.0, 4.0], [1.0, 2.0]) == (2.0, 2.0, 2.0)
    # Two rounds (a --quick run) are too few to resample: the per-round ratios' range.
    assert stats.ratio_of_medians_ci([1.0, 3.0], [1.0, 2.0]) == (2.0 / 1.5, 1.0, 1.5)
    assert stats.ratio_of_medians_ci([], []) == (0.0, 0.0, 0.0)
    assert stats.ratio_of_medians_ci([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError):  # unpaired rounds are a caller's mistake, not a ratio
        stats.ratio_of_medians_ci([1.0, 2.0, 3.0], [1.0, 2.0])


def test_a_benchmarks_summary_and_its_rows() -> None:
    runs = {"plain": _rows([40.0, 36.0, 38.0]), "otel_rl": _rows([38.0, 39.6, 38.0]),
            "disabled": _rows([40.0, 36.0, 38.0])}
    results = stats.summarize_rounds(runs, ("fps", "cpu_s"))
    cpu = results["ratios"]["cpu_s"]
    assert cpu["of_medians"] == pytest.approx(38.0 / 38.0)
    assert cpu["per_round_min"] == pytest.approx(0.95)
    assert cpu["per_round_max"] == pytest.approx(1.1)
    assert cpu["of_medians_ci"][0] <= 1.0 <= cpu["of_medians_ci"][1]
    assert results["summary"]["plain"]["cpu_s"] == {"median": 38.0, "min": 36.0, "max": 40.0}
    assert results["variant_ratios"]["disabled"]["cpu_s"]["of_medians_ci"] == [1.0, 1.0]
    rows = stats.ratio_rows({"otel_rl": results["ratios"],
                             **results["variant_ratios"]}, ("fps", "cpu_s"))
    assert [row.split(" | ")[0] for row in rows] == [
        "| otel_rl / plain (per-round spread)",
        "| otel_rl / plain, 95 % interval of that ratio (rounds resampled)",
        "| otel_rl / plain, per-round median [95 % CI]",
        "| disabled / plain (per-round spread)",
        "| disabled / plain, 95 % interval of that ratio (rounds resampled)",
        "| disabled / plain, per-round median [95 % CI]"]
    assert rows[0].endswith("| **1.000×** (0.950–1.100) |")


def test_the_checkout_over_an_earlier_revision_in_the_same_rounds() -> None:
    runs = {"plain": _rows([40.0, 36.0, 38.0]), "otel_rl": _rows([38.0, 39.6, 38.0]),
            "otel_rl@abc123": _rows([40.0, 36.0, 41.8])}
    results = stats.summarize_rounds(runs, ("fps", "cpu_s"))
    cpu = results["against"]["otel_rl@abc123"]["cpu_s"]
    assert cpu["of_medians"] == pytest.approx(38.0 / 40.0)
    assert cpu["per_round_min"] == pytest.approx(38.0 / 41.8)
    assert cpu["per_round_max"] == pytest.approx(1.1)
    # Over plain too, as any other variant.
    assert results["variant_ratios"]["otel_rl@abc123"]["cpu_s"]["of_medians"] == \
        pytest.approx(40.0 / 38.0)
    rows = stats.against_rows(results, ("fps", "cpu_s"))
    assert [row.split(" | ")[0] for row in rows] == [
        "| otel_rl / otel_rl@abc123 (per-round spread)",
        "| otel_rl / otel_rl@abc123, 95 % interval of that ratio (rounds resampled)",
        "| otel_rl / otel_rl@abc123, per-round median [95 % CI]"]
    assert stats.against_rows(stats.summarize_rounds(
        {"plain": runs["plain"], "otel_rl": runs["otel_rl"]}, ("cpu_s",)), ("cpu_s",)) == []
