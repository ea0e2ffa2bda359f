"""One rule folds gauges together: workers into the run, trees into trees (issue 10)."""

from __future__ import annotations

from typing import Any

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


def test_a_reset_keeps_when_each_gauge_was_set_not_when_it_was_retired() -> None:
    # reset_timers() retires the stack's gauges into the whole run; a worker's value set
    # after the program's own (but before the reset) is the later one and wins.
    from otel_rl._internal import contribute
    from otel_rl.timers import _get_thread_timer, reset_timers, set_gauge

    set_gauge("loss", 1.0)
    stack = _get_thread_timer()
    stack.gauges["loss"]._timestamp = 100.0  # ML-Agents' GaugeNode keeps time.time() here
    reset_timers()
    gauges = contribute.stack_gauges([stack])
    assert gauges["loss"] == {"value": 1.0, "min": 1.0, "max": 1.0, "count": 1, "ts": 100.0}
    wholerun.merge_gauge(gauges, "loss", {"value": 2.0, "min": 2.0, "max": 2.0, "count": 1,
                                          "ts": 150.0})
    assert gauges["loss"]["value"] == 2.0


def test_retiring_twice_folds_by_the_one_rule_even_on_a_tie() -> None:
    from otel_rl._internal import contribute
    from otel_rl.timers import _get_thread_timer, reset_timers, set_gauge

    stack = _get_thread_timer()
    for value in (1.0, 3.0, 2.0):  # set at the same instant (a coarse clock): the later wins
        set_gauge("loss", value)
        stack.gauges["loss"]._timestamp = 100.0
        reset_timers()
    assert contribute.stack_gauges([stack])["loss"] == {
        "value": 2.0, "min": 1.0, "max": 3.0, "count": 3, "ts": 100.0}


def test_mlagents_merge_gauges_keeps_mlagents_rule(mlagents_timers: Any) -> None:
    # GaugeNode.merge is ML-Agents' face: on a tie the gauge merged into keeps its value,
    # as in the real package (otel_rl's own merges take the one merged in).
    from otel_rl import timers

    results = []
    for module in (timers, mlagents_timers):
        into, other = module.TimerStack(), module.TimerStack()
        module.set_gauge("g", 1.0, into)
        module.set_gauge("g", 2.0, other)
        into.gauges["g"]._timestamp = other.gauges["g"]._timestamp = 100.0
        module.merge_gauges(other.gauges, into)
        results.append(into.gauges["g"].as_dict())
    assert results[0] == results[1] == {"value": 1.0, "min": 1.0, "max": 2.0, "count": 2}
