"""Spans -> tree, rule by rule (docs/internals.md, "Tree from spans")."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

from otel_rl._internal import semconv
from otel_rl._internal.readers import SpanList
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Gauge
from otel_rl._internal.treebuild import build_tree

TRACE = "0af7651916cd43dd8448eb211c80319c"
MS = 1_000_000
MAIN_PID = 100
_ids = itertools.count(1)


def span(
    name: str,
    start_ms: float,
    end_ms: float,
    parent: SpanData | None = None,
    *,
    pid: int | None = MAIN_PID,
    thread: int | None = 1,
    trace: str = TRACE,
    attributes: dict[str, Any] | None = None,
    resource: dict[str, Any] | None = None,
    **kwargs: Any,
) -> SpanData:
    attrs = {} if thread is None else {semconv.THREAD_ID: thread}
    attrs.update(attributes or {})
    res = {} if pid is None else {semconv.PROCESS_PID: pid}
    res.update(resource or {})
    return SpanData(
        trace_id=trace,
        span_id=f"{next(_ids):016x}",
        parent_span_id=parent.span_id if parent is not None else "",
        name=name,
        start_ns=int(start_ms * MS),
        end_ns=int(end_ms * MS),
        attributes=attrs,
        resource=res,
        **kwargs,
    )


def run_span(start_ms: float, end_ms: float, **attributes: Any) -> SpanData:
    return span("run", start_ms, end_ms, attributes={semconv.KIND: semconv.KIND_RUN, **attributes})


def node_summary(data: dict[str, Any]) -> dict[str, Any]:
    """name -> (count, is_parallel, children) from a to_dict() node, for compact asserts."""
    return {
        name: (
            child["count"],
            child.get("is_parallel", False),
            node_summary(child) if "children" in child else {},
        )
        for name, child in data.get("children", {}).items()
    }


def test_run_span_is_the_root_with_its_gauges_and_metadata() -> None:
    run = run_span(
        0,
        1000,
        **{
            "otel_rl.gauge.reward.mean.value": 2.0,
            "otel_rl.gauge.reward.mean.min": -1.0,
            "otel_rl.gauge.reward.mean.max": 3.0,
            "otel_rl.gauge.reward.mean.count": 5,
            "otel_rl.metadata.timer_format_version": "0.1.0",
        },
    )
    step = span("step", 10, 110, run)
    tree = build_tree([step, run])
    assert tree.root.total == 1.0 and tree.root.count == 1
    assert tree.gauges == {"reward.mean": Gauge(2.0, -1.0, 3.0, 5)}
    assert tree.metadata == {"timer_format_version": "0.1.0"}
    assert tree.complete and tree.notes == []
    assert tree.to_dict()["children"] == {"step": {"total": 0.1, "count": 1, "self": 0.1}}


def test_several_run_spans_merge_into_one_root() -> None:
    first, second = run_span(0, 1000), run_span(2000, 2500)
    tree = build_tree([first, second, span("a", 1, 2, first), span("a", 2001, 2003, second)])
    assert tree.root.count == 2 and tree.root.total == 1.5
    assert tree.root.children["a"].count == 2
    assert tree.complete


def test_without_run_span_root_spans_all_spans() -> None:
    a = span("a", 100, 300)
    b = span("b", 250, 900)
    tree = build_tree([a, b])
    assert tree.root.count == 1
    assert tree.root.total == 0.8
    assert list(tree.root.children) == ["a", "b"]
    assert tree.complete


def test_repeated_blocks_merge_by_name_and_sum_durations() -> None:
    run = run_span(0, 100)
    spans = [run]
    for i in range(4):
        step = span("step", 10 * i, 10 * i + 5, run)
        spans += [step, span("act", 10 * i + 1, 10 * i + 3, step)]
    tree = build_tree(spans)
    step_node = tree.root.children["step"]
    assert (step_node.count, step_node.total) == (4, 0.02)
    assert step_node.children["act"].count == 4
    assert step_node.self_time == 0.02 - step_node.children["act"].total


def test_children_keep_first_run_order_whatever_the_arrival_order() -> None:
    run = run_span(0, 100)
    spans = [run, span("z", 1, 2, run), span("a", 3, 4, run), span("m", 5, 6, run)]
    spans += [span("z", 7, 9, run), span("a", 10, 13.3, run)]
    expected = build_tree(spans).to_dict()
    assert list(expected["children"]) == ["z", "a", "m"]
    shuffled = spans[:]
    for seed in range(5):
        random.Random(seed).shuffle(shuffled)
        # Equal floats too: sums are taken in start order, not arrival order.
        assert json.dumps(build_tree(shuffled).to_dict()) == json.dumps(expected)


def test_span_in_other_thread_is_parallel_and_so_are_its_descendants() -> None:
    run = run_span(0, 100)
    advance = span("advance", 1, 90, run, thread=1)
    trainer = span("trainer", 2, 80, advance, thread=2)
    update = span("update", 3, 50, trainer, thread=2)
    same_thread = span("log", 60, 61, advance, thread=1)
    tree = build_tree([run, advance, trainer, update, same_thread])
    assert node_summary(tree.to_dict()) == {
        "advance": (
            1,
            False,
            {"trainer": (1, True, {"update": (1, True, {})}), "log": (1, False, {})},
        )
    }


def test_span_in_other_process_is_parallel_even_with_equal_thread_id() -> None:
    run = run_span(0, 100)
    step = span("step", 1, 90, run)
    remote = span("env.step", 2, 80, step, pid=200, thread=1)
    deeper = span("physics", 3, 10, remote, pid=200, thread=1)
    tree = build_tree([run, step, remote, deeper])
    env = tree.find(["step", "env.step"])
    physics = tree.find(["step", "env.step", "physics"])
    assert env is not None and env.is_parallel
    assert physics is not None and physics.is_parallel


def test_missing_pid_or_thread_is_no_evidence_of_parallelism() -> None:
    run = run_span(0, 100)
    step = span("step", 1, 90, run, thread=None)
    inner = span("inner", 2, 80, step, pid=None, thread=7)
    innermost = span("innermost", 3, 5, inner, pid=None, thread=7)
    tree = build_tree([run, step, inner, innermost])
    assert not any(node.is_parallel for _, node in tree.root.walk())


def test_parallel_once_means_parallel_node_even_if_other_spans_are_not() -> None:
    run = run_span(0, 100)
    step = span("step", 1, 90, run)
    inline = span("collect", 2, 3, step, thread=1)
    threaded = span("collect", 4, 6, step, thread=9)
    tree = build_tree([run, step, inline, threaded])
    node = tree.find(["step", "collect"])
    assert node is not None and node.is_parallel and node.count == 2


def test_missing_parent_hangs_under_root_and_marks_tree_incomplete() -> None:
    run = run_span(0, 100)
    orphan = span("orphan", 5, 6, run)
    orphan.parent_span_id = "00000000deadbeef"
    child = span("child", 5.1, 5.2, orphan)
    tree = build_tree([run, orphan, child])
    assert node_summary(tree.to_dict()) == {"orphan": (1, False, {"child": (1, False, {})})}
    assert not tree.complete
    assert (
        len(tree.notes) == 1 and "1 span(s) whose parent span is not in the data" in tree.notes[0]
    )
    assert "'orphan'" in tree.notes[0]


def test_process_marker_is_transparent_and_merges_gauges_and_metadata() -> None:
    run = run_span(0, 1000, **{"otel_rl.gauge.loss.value": 1.0, "otel_rl.metadata.host": "a"})
    start = span("start_workers", 10, 900, run)
    worker_res = {semconv.WORKER_ROLE: "env", semconv.WORKER_INDEX: 0}
    marker = span(
        "env-worker",
        20,
        800,
        start,
        pid=300,
        resource=worker_res,
        attributes={
            semconv.KIND: semconv.KIND_PROCESS,
            "otel_rl.gauge.loss.value": 0.5,
            "otel_rl.gauge.loss.min": 0.25,
            "otel_rl.gauge.loss.count": 3,
            "otel_rl.metadata.host": "b",
            "otel_rl.metadata.worker_only": "yes",
        },
    )
    reset = span("reset", 30, 40, marker, pid=300, resource=worker_res)
    tree = build_tree([run, start, marker, reset])
    assert node_summary(tree.to_dict()) == {"start_workers": (1, False, {"reset": (1, True, {})})}
    # ML-Agents' gauge merge: the later value (the run span ends last), the whole range.
    assert tree.gauges["loss"] == Gauge(1.0, 0.25, 1.0, 4)
    assert tree.metadata == {"host": "a", "worker_only": "yes"}
    assert tree.complete


def test_workers_are_gathered_per_role_index_pid_at_their_start_path() -> None:
    run = run_span(0, 1000)
    start = span("start_workers", 10, 900, run)
    spans = [run, start]
    for index, pid in ((0, 301), (1, 302)):
        res = {semconv.WORKER_ROLE: "env", semconv.WORKER_INDEX: index}
        for i in range(index + 1):
            step = span("env.step", 20 + i * 10, 25 + i * 10, start, pid=pid, resource=res)
            spans.append(step)
            spans.append(span("physics", 21 + i * 10, 22 + i * 10, step, pid=pid, resource=res))
            spans.append(
                span("render", 22 + i * 10, 23 + i * 10, step, pid=pid, thread=5, resource=res)
            )
    tree = build_tree(spans)
    assert [(w.role, w.index, w.pid, w.path) for w in tree.workers] == [
        ("env", 0, 301, ["start_workers"]),
        ("env", 1, 302, ["start_workers"]),
    ]
    second = tree.workers[1].node
    assert second.total == 0.0
    assert node_summary({"children": second.to_dict()["children"]}) == {
        "env.step": (2, False, {"physics": (2, False, {}), "render": (2, True, {})})
    }
    # In the whole-run tree the worker blocks are all parallel to the starting block.
    merged = tree.find(["start_workers", "env.step"])
    assert merged is not None and merged.is_parallel and merged.count == 3


def test_sampled_iteration_hangs_under_linked_span_and_marks_incomplete() -> None:
    run = run_span(0, 1000)
    train = span("train", 1, 999, run)
    it1 = span("iteration", 2, 10, train)
    other_trace = "ffffffffffffffffffffffffffffffff"
    it2 = span(
        "iteration",
        500,
        520,
        trace=other_trace,
        attributes={semconv.SAMPLED: "outlier"},
        links=[(TRACE, train.span_id)],
    )
    act = span("act", 501, 505, it2, trace=other_trace)
    tree = build_tree([run, train, it1, it2, act])
    assert node_summary(tree.to_dict()) == {
        "train": (1, False, {"iteration": (2, False, {"act": (1, False, {})})})
    }
    assert not tree.complete
    assert any("1 iteration(s) were sampled (1 by outlier)" in note for note in tree.notes)


def test_sampled_iteration_without_its_run_trace_is_noted() -> None:
    it = span(
        "iteration",
        5,
        10,
        attributes={semconv.SAMPLED: "schedule"},
        links=[(TRACE, "00000000000000aa")],
    )
    tree = build_tree([it])
    assert list(tree.root.children) == ["iteration"]
    assert not tree.complete and len(tree.notes) == 2


def test_synthetic_spans_carry_their_count() -> None:
    run = run_span(0, 1000, **{semconv.SYNTHETIC: True})
    imported = span(
        "advance", 0, 750, run, attributes={semconv.SYNTHETIC: True, semconv.COUNT: 120}
    )
    tree = build_tree([run, imported])
    assert (tree.root.children["advance"].count, tree.root.children["advance"].total) == (120, 0.75)


def test_error_spans_count_as_usual() -> None:
    run = run_span(0, 100)
    ok = span("step", 1, 2, run)
    failed = span("step", 3, 5, run, is_error=True)
    tree = build_tree([run, ok, failed])
    assert tree.root.children["step"].count == 2
    assert tree.complete


def test_duplicate_spans_count_once() -> None:
    run = run_span(0, 100)
    step = span("step", 1, 2, run)
    tree = build_tree([run, step, step, SpanData(**{f: getattr(step, f) for f in step.__slots__})])
    assert tree.root.children["step"].count == 1


def test_parent_cycle_in_corrupt_data_terminates_and_is_noted() -> None:
    a = span("a", 1, 5)
    b = span("b", 2, 3, a)
    a.parent_span_id = b.span_id
    tree = build_tree([a, b])
    assert sum(node.count for _, node in tree.root.walk()) == 2
    assert not tree.complete


def test_reader_notes_make_the_tree_incomplete() -> None:
    run = run_span(0, 100)
    spans = SpanList([run, span("a", 1, 2, run)], notes=["Tempo returned only part of the trace"])
    tree = build_tree(spans)
    assert not tree.complete and tree.notes == ["Tempo returned only part of the trace"]


def test_no_spans_is_an_incomplete_empty_tree() -> None:
    tree = build_tree([])
    assert not tree.complete and tree.root.children == {}
