"""One rule folds gauges together: workers into the run, trees into trees (issue 10)."""

from __future__ import annotations

from otel_rl._internal import wholerun
from otel_rl._internal.node import Gauge
from otel_rl._internal.shapes import GaugeDict
from otel_rl._internal.tree import Tree


def test_the_later_value_wins_whatever_the_merge_order() -> None:
    early, late = Gauge(1.0, 0.0, 1.0, 2, ts=10.0), Gauge(5.0, 5.0, 7.0, 3, ts=20.0)
    for first, second in ((early, late), (late, early)):
        merged = first.copy()
        merged.merge(second)
        assert merged == Gauge(5.0, 0.0, 7.0, 5) and merged.ts == 20.0


def test_without_timestamps_the_gauge_merged_in_later_wins() -> None:
    # Trees read from files carry no timestamps: what is merged in is taken as the later one.
    left = Tree(gauges={"g": Gauge(1.0, 0.5, 2.0, 3)})
    left.merge(Tree(gauges={"g": Gauge(5.0, 5.0, 5.0, 1)}))
    assert left.gauges["g"] == Gauge(5.0, 0.5, 5.0, 4)


def test_workers_gauges_fold_into_the_run_by_the_same_rule() -> None:
    into: dict[str, GaugeDict] = {"loss": {"value": 0.5, "min": 0.5, "max": 0.9, "count": 4,
                                           "ts": 30.0}}
    wholerun.merge_gauge(into, "loss", {"value": 0.7, "min": 0.1, "max": 0.7, "count": 2,
                                        "ts": 25.0})  # an older value from a worker
    assert into["loss"] == {"value": 0.5, "min": 0.1, "max": 0.9, "count": 6, "ts": 30.0}
    wholerun.merge_gauge(into, "loss", {"value": 0.2, "min": 0.2, "max": 0.2, "count": 1,
                                        "ts": 31.0})
    assert into["loss"]["value"] == 0.2 and into["loss"]["count"] == 7
