"""The same workloads through the real `mlagents_envs.timers` and `otel_rl.timers` give the
same trees: names, nesting, counts, is_parallel, gauges, metadata keys. Each runs twice for
otel_rl: unconfigured, and configured with every span exported (the legacy tree must not change).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import otel_rl
from otel_rl import timers as ours


def shape(tree: dict[str, Any]) -> dict[str, Any]:
    """Everything but the measured times."""
    out: dict[str, Any] = {"count": tree["count"], "is_parallel": tree.get("is_parallel", False)}
    if "name" in tree:
        out["name"] = tree["name"]
        out["gauges"] = tree.get("gauges")
        out["metadata_keys"] = sorted(tree.get("metadata", {}))
    assert tree["self"] >= 0
    out["children"] = {name: shape(child) for name, child in tree.get("children", {}).items()}
    out["child_order"] = list(tree.get("children", {}))
    return out


def w_nested(t: ModuleType) -> Any:
    for _ in range(3):
        with t.hierarchical_timer("advance"):
            with t.hierarchical_timer("env_step"):
                pass
            for _ in range(2):
                with t.hierarchical_timer("update") as node:
                    assert node.count >= 0
    return t.get_timer_tree()


def w_exceptions(t: ModuleType) -> Any:
    for i in range(4):
        try:
            with t.hierarchical_timer("outer"):
                with t.hierarchical_timer("inner"):
                    if i % 2:
                        raise RuntimeError("boom")
        except RuntimeError:
            pass
    with t.hierarchical_timer("after"):
        pass
    return t.get_timer_tree()


def w_recursion(t: ModuleType) -> Any:
    @t.timed
    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(6) == 8
    return t.get_timer_tree()


def w_methods_and_nested_functions(t: ModuleType) -> Any:
    class Trainer:
        @t.timed
        def advance(self) -> int:
            @t.timed
            def helper() -> int:
                return 1

            return helper() + self.update()

        @t.timed
        def update(self) -> int:
            return 2

        @staticmethod
        @t.timed
        def save_model() -> None:
            pass

    trainer = Trainer()
    for _ in range(3):
        assert trainer.advance() == 3
    Trainer.save_model()
    return t.get_timer_tree()


def w_gauges_and_metadata(t: ModuleType) -> Any:
    for v in (1.0, float("nan"), -2.5, 7.0, math.nan):
        t.set_gauge("reward", v)
    t.set_gauge("only_nan", float("nan"))
    t.set_gauge("entropy", 0.5)
    t.add_metadata("seed", "42")
    with t.hierarchical_timer("x"):
        pass
    tree = t.get_timer_tree()
    tree["gauges"] = {k: dict(v) for k, v in tree.get("gauges", {}).items()}
    return tree


def w_explicit_stack(t: ModuleType) -> Any:
    stack = t.TimerStack()
    with t.hierarchical_timer("a", stack):
        with t.hierarchical_timer("b", stack):
            pass
    t.set_gauge("g", 2.0, stack)
    t.add_metadata("k", "v", stack)
    with t.hierarchical_timer("default_stack_block"):
        pass
    return {"explicit": t.get_timer_tree(stack), "default": t.get_timer_tree()}


def w_thread_merged_the_mlagents_way(t: ModuleType) -> Any:
    def trainer_thread() -> None:
        for _ in range(5):
            with t.hierarchical_timer("trainer_advance"):
                with t.hierarchical_timer("_update_policy"):
                    pass
        t.set_gauge("thread_gauge", 3.0)

    worker = threading.Thread(target=trainer_thread)
    with t.hierarchical_timer("start_learning"):
        worker.start()
        worker.join()
    timer_stack = t.get_timer_stack_for_thread(worker)
    assert timer_stack is not None
    with t.hierarchical_timer("trainer_threads") as main_timer_node:
        main_timer_node.merge(timer_stack.root, is_parallel=True)
        t.merge_gauges(timer_stack.gauges)
    return t.get_timer_tree()


def w_worker_roots_merged(t: ModuleType) -> Any:
    # ML-Agents' env workers send get_timer_root() and reset; the parent merges them.
    worker_stack = t.TimerStack()
    roots = []
    for _ in range(3):
        with t.hierarchical_timer("worker_step", worker_stack):
            with t.hierarchical_timer("env.step", worker_stack):
                pass
        roots.append(t.get_timer_root(worker_stack))
        t.reset_timers(worker_stack)
    with t.hierarchical_timer("workers") as node:
        for root in roots:
            node.merge(root, root_name="worker_root", is_parallel=True)
    return t.get_timer_tree()


def w_reset(t: ModuleType) -> Any:
    with t.hierarchical_timer("before_reset"):
        pass
    t.set_gauge("g", 1.0)
    t.reset_timers()
    with t.hierarchical_timer("after_reset"):
        pass
    return t.get_timer_tree()


def w_unstarted_thread(t: ModuleType) -> Any:
    return t.get_timer_stack_for_thread(threading.Thread(target=lambda: None))


def w_stacked_timed(t: ModuleType) -> Any:
    @t.timed
    @t.timed
    def step() -> None:
        pass

    step()
    step()
    return t.get_timer_tree()


WORKLOADS: list[Callable[[ModuleType], Any]] = [
    w_nested, w_exceptions, w_recursion, w_methods_and_nested_functions,
    w_gauges_and_metadata, w_explicit_stack, w_thread_merged_the_mlagents_way,
    w_worker_roots_merged, w_reset, w_stacked_timed,
]


def _normalise(result: Any) -> Any:
    if isinstance(result, dict) and "explicit" in result:
        return {k: shape(v) for k, v in result.items()}
    return shape(result)


@pytest.mark.parametrize("configured", [False, True], ids=["plain", "configured"])
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__[2:])
def test_tree_matches_mlagents(workload: Callable[[ModuleType], Any], configured: bool,
                               mlagents_timers: ModuleType, tmp_path: Any) -> None:
    expected = _normalise(workload(mlagents_timers))
    if configured:
        otel_rl.configure(spans="all", output_dir=str(tmp_path), propagate=False)
    actual = _normalise(workload(ours))
    assert actual == expected


def test_unstarted_thread_has_no_stack(mlagents_timers: ModuleType) -> None:
    assert w_unstarted_thread(mlagents_timers) is None
    assert w_unstarted_thread(ours) is None


def test_timer_format_version_and_metadata_values(mlagents_timers: ModuleType) -> None:
    assert ours.TIMER_FORMAT_VERSION == mlagents_timers.TIMER_FORMAT_VERSION == "0.1.0"
    with ours.hierarchical_timer("x"):
        pass
    meta = ours.get_timer_tree()["metadata"]
    assert meta["timer_format_version"] == "0.1.0"
    assert int(meta["end_time_seconds"]) >= int(meta["start_time_seconds"])


def test_totals_are_consistent_with_children(mlagents_timers: ModuleType) -> None:
    tree = w_nested(ours)
    advance = tree["children"]["advance"]
    children_total = sum(c["total"] for c in advance["children"].values())
    assert advance["total"] >= children_total
    assert advance["self"] == pytest.approx(advance["total"] - children_total)


def test_timed_names_by_qualname(mlagents_timers: ModuleType) -> None:
    class Policy:
        @ours.timed
        def evaluate(self) -> None:
            pass

    Policy().evaluate()
    assert "test_timed_names_by_qualname.<locals>.Policy.evaluate" in ours.get_timer_tree()["children"]


def test_public_names_match_mlagents(mlagents_timers: ModuleType) -> None:
    wanted = {"hierarchical_timer", "timed", "set_gauge", "merge_gauges", "add_metadata",
              "get_timer_tree", "get_timer_root", "reset_timers", "get_timer_stack_for_thread",
              "TimerStack", "TimerNode", "GaugeNode", "TIMER_FORMAT_VERSION"}
    assert wanted <= set(dir(mlagents_timers))
    assert wanted <= set(ours.__all__)
