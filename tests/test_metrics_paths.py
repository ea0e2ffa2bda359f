"""Block paths of the metrics (issue 18): each drained record's path in its thread's tree,
found from parent ids off the hot path, capped; and per-path counters from the aggregate trees
under ``spans=off``."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from otel_rl._internal import metrics as m
from otel_rl._internal import metrics_paths, wholerun
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.record import OpenSpan
from otel_rl._internal.recorder import TimerNode
from otel_rl._internal.sinks.base import Stats

MAIN_PID, WORKER_PID, TID = 100, 200, 7
WORKER = {"process.pid": WORKER_PID, "otel_rl.worker.role": "rollout",
          "otel_rl.worker.index": 0}


def _metrics(open_blocks: list[Any] | None = None, roots: set[int] | None = None,
             trees: Any = None) -> m.Metrics:
    return m.Metrics(resource={"otel_rl.run.id": "r"}, start_ns=1, stats=Stats(),
                     gauges=dict, scalars=list, open_blocks=lambda: [OpenSpan(*b) for b in open_blocks or []],
                     roots=lambda: roots or set(), trees=trees)


def _rec(sid: int, psid: int, name: str, seconds: float = 0.001, tid: int = TID,
         extra: Any = None) -> Any:
    return (sid, psid, name, 0, int(seconds * 1e9), tid, 5, extra)


def _main(*records: Any) -> Batch:
    return Batch({"process.pid": MAIN_PID}, 0, list(records))


def _points(metrics: m.Metrics, name: str = "otel_rl.block.duration") -> dict[Any, Any]:
    request = ExportMetricsServiceRequest.FromString(metrics.encode(10**18))
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        if metric.name == name:
            data = metric.histogram if metric.HasField("histogram") else metric.sum
            return {tuple(sorted((kv.key, kv.value.string_value or kv.value.int_value)
                                 for kv in p.attributes)): p for p in data.data_points}
    return {}


def _counts(metrics: m.Metrics) -> dict[tuple[str, str, str], int]:
    """(path, block, role) -> runs in the duration histogram."""
    return {(dict(k)["path"], dict(k)["block"], dict(k)["role"]): p.count
            for k, p in _points(metrics).items()}


def test_a_child_drained_before_its_parent_gets_the_parents_path() -> None:
    metrics = _metrics()
    # End order: the children's records come before their parent's.
    metrics.observe([_main(_rec(3, 2, "env_step"), _rec(2, 1, "rollout"), _rec(4, 1, "update"),
                           _rec(5, 4, "env_step"), _rec(1, 0, "main_loop"))], exemplars=True)
    assert _counts(metrics) == {
        ("main_loop", "main_loop", "main"): 1, ("main_loop/rollout", "rollout", "main"): 1,
        ("main_loop/rollout/env_step", "env_step", "main"): 1,
        ("main_loop/update", "update", "main"): 1,
        ("main_loop/update/env_step", "env_step", "main"): 1}


def test_a_block_under_still_open_blocks_gets_its_path_from_them() -> None:
    opened = [(MAIN_PID, 11, 10, "epoch", 0, TID), (MAIN_PID, 10, 0, "main_loop", 0, TID)]
    metrics = _metrics(opened)
    metrics.observe([_main(_rec(20, 11, "update"), _rec(21, 11, "update"))], exemplars=True)
    assert _counts(metrics) == {("main_loop/epoch/update", "update", "main"): 2}


def test_a_parent_in_another_thread_or_process_starts_a_new_path() -> None:
    # A thread task under a block open in the main thread; a worker's block under the block
    # that started its process (a root: the span its top-level blocks hang under).
    opened = [(MAIN_PID, 10, 0, "launch", 0, TID)]
    metrics = _metrics(opened, roots={10})
    metrics.observe([_main(_rec(30, 10, "task", tid=TID + 1)),
                     Batch(WORKER, 0, [_rec(40, 10, "rollout", tid=TID)])], exemplars=True)
    assert _counts(metrics) == {("task", "task", "main"): 1,
                                ("rollout", "rollout", "rollout"): 1}


def test_a_record_waits_for_a_parent_it_cannot_place_yet() -> None:
    metrics = _metrics()
    # A worker's block whose parent opened after the worker's last snapshot: not counted yet.
    metrics.observe([Batch(WORKER, 0, [_rec(2, 1, "inner")])], exemplars=True)
    assert _counts(metrics) == {}
    # The parent's record arrives with the next flush: both counted, the child under it.
    metrics.observe([Batch(WORKER, 0, [_rec(1, 0, "outer")])], exemplars=True)
    assert _counts(metrics) == {("outer", "outer", "rollout"): 1,
                                ("outer/inner", "inner", "rollout"): 1}
    assert metrics.resolver.unplaced == 0


def test_a_parent_that_never_shows_makes_the_record_top_level_after_a_few_flushes() -> None:
    metrics = _metrics()
    metrics.observe([_main(_rec(2, 99, "lost"), _rec(3, 2, "below"))], exemplars=True)
    for _ in range(metrics_paths.ROUNDS - 1):
        metrics.observe([], exemplars=True)
        assert _counts(metrics) == {}
    metrics.observe([], exemplars=True)
    assert _counts(metrics) == {("lost", "lost", "main"): 1, ("lost/below", "below", "main"): 1}
    assert metrics.resolver.unplaced == 1
    # At the final flush nothing waits.
    metrics.observe([_main(_rec(5, 98, "late"))], exemplars=True, final=True)
    assert _counts(metrics)[("late", "late", "main")] == 1


def test_paths_past_the_cap_are_counted_under_other_and_said_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(metrics_paths, "MAX_PATHS", 3)
    metrics = _metrics()
    for flush in range(2):
        metrics.observe([_main(*[_rec(100 * flush + i + 1, 0, f"b{i}") for i in range(5)])],
                        exemplars=True)
    counts = _counts(metrics)
    assert counts == {("b0", "b0", "main"): 2, ("b1", "b1", "main"): 2, ("b2", "b2", "main"): 2,
                      ("_other", "_other", "main"): 4}
    said = [r.getMessage() for r in caplog.records if "distinct block paths" in r.getMessage()]
    assert len(said) == 1 and "path='_other'" in said[0]


def test_exemplars_of_exported_spans_go_to_the_series_of_their_path() -> None:
    metrics = _metrics()
    metrics.observe([_main(_rec(2, 1, "update", 0.2), _rec(4, 3, "update", 0.1),
                           _rec(1, 0, "train"), _rec(3, 0, "evaluate"))], exemplars=False)
    # A kept window's records: re-mapped ids, the window span as the top-level blocks' parent.
    window = {"attrs": {"otel_rl.kind": "window"}}
    metrics.exported([_main(_rec(0x902, 0x901, "update", 0.2), _rec(0x904, 0x903, "update", 0.1),
                            _rec(0x901, 0x900, "train"), _rec(0x903, 0x900, "evaluate"),
                            _rec(0x900, 0, "window 3", extra=window))])
    points = {dict(k)["path"]: p for k, p in _points(metrics).items()}
    assert [int.from_bytes(e.span_id, "big") for e in points["train/update"].exemplars] == [0x902]
    assert [int.from_bytes(e.span_id, "big") for e in points["evaluate/update"].exemplars] == \
        [0x904]
    # Re-mapped ids use all 64 bits.
    big = 2**64 - 100
    metrics.exported([_main(_rec(big + 2, big + 1, "update", 0.3), _rec(big + 1, big, "train"),
                            _rec(big, 0, "window 4", extra=window))])
    points = {dict(k)["path"]: p for k, p in _points(metrics).items()}
    assert [int.from_bytes(e.span_id, "big") for e in points["train/update"].exemplars] == \
        [big + 2]


def test_spans_off_counts_runs_and_seconds_per_path_from_the_trees() -> None:
    root = TimerNode("root")
    loop = root.get_child("main_loop")
    loop.add_time(3.0)
    update = loop.get_child("update")
    for _ in range(4):
        update.add_time(0.5)
    # A relaying worker's tree as its snapshot arrives: read from the wire into a node.
    worker_tree = wholerun.received({"contributions": [{"tree": {
        "total": 0.0, "count": 1, "children": {"rollout": {"total": 1.5, "count": 6}}}}]}
    )["contributions"][0]["tree"]
    metrics = _metrics(trees=lambda: [("main", 0, root), ("rollout", 2, worker_tree)])
    runs = {(dict(k)["path"], dict(k)["role"], dict(k)["worker"]): p.as_int
            for k, p in _points(metrics, "otel_rl.block.runs").items()}
    assert runs == {("main_loop", "main", 0): 1, ("main_loop/update", "main", 0): 4,
                    ("rollout", "rollout", 2): 6}
    seconds = {dict(k)["path"]: p.as_double
               for k, p in _points(metrics, "otel_rl.block.seconds").items()}
    assert seconds == {"main_loop": 3.0, "main_loop/update": 2.0, "rollout": 1.5}
    assert _points(metrics) == {}  # no duration histogram: no record holds a run's duration


def _tree(*paths: str) -> TimerNode:
    root = TimerNode("root")
    for path in paths:
        node = root
        for name in path.split("/"):
            node = node.get_child(name)
    return root


def test_this_processes_names_with_one_path_in_its_trees_take_it_without_parent_lookups() -> None:
    import os

    here = {"process.pid": os.getpid()}
    trees = [_tree("main_loop/update/forward", "main_loop/evaluate/forward", "init")]
    metrics = m.Metrics(resource={}, start_ns=1, stats=Stats(), gauges=dict, scalars=list,
                        local=lambda: trees)
    # "update" has one path in the trees: its parent (open, unknown here) is not looked up.
    metrics.observe([Batch(here, 0, [_rec(1, 77, "update"), _rec(2, 78, "init")])],
                    exemplars=True)
    assert _counts(metrics) == {("main_loop/update", "update", "main"): 1,
                                ("init", "init", "main"): 1}
    # "forward" has two: each run is placed by its parent.
    metrics.observe([Batch(here, 0, [_rec(3, 4, "forward"), _rec(4, 8, "update"),
                                     _rec(5, 7, "forward"), _rec(7, 8, "evaluate"),
                                     _rec(6, 8, "update"), _rec(8, 0, "main_loop")])],
                    exemplars=True)
    counts = _counts(metrics)
    assert counts[("main_loop/update/forward", "forward", "main")] == 1
    assert counts[("main_loop/evaluate/forward", "forward", "main")] == 1
    assert counts[("main_loop/update", "update", "main")] == 3
    # Another process's batch is never placed by this process's trees.
    metrics.observe([Batch(WORKER, 0, [_rec(9, 0, "update")])], exemplars=True)
    assert _counts(metrics)[("update", "update", "rollout")] == 1



def test_a_few_names_at_several_paths_are_placed_by_parent_among_names_placed_by_name() -> None:
    """Only the records whose name has several paths are placed by parent ids; their
    parents may be records placed by name, other such records, a block still open, or a
    block of another thread (then they are top-level)."""
    import os

    pid = os.getpid()
    here = {"process.pid": pid}
    trees = [_tree("main_loop/update/forward", "main_loop/evaluate/forward",
                   "main_loop/evaluate/forward/forward", "forward", "init")]
    opened = [(pid, 50, 8, "evaluate", 0, TID), (pid, 8, 0, "main_loop", 0, TID)]
    metrics = m.Metrics(resource={}, start_ns=1, stats=Stats(), gauges=dict, scalars=list,
                        local=lambda: trees,
                        open_blocks=lambda: [OpenSpan(*b) for b in opened])
    records = [_rec(100 + i, 0, "init") for i in range(20)]
    records += [
        _rec(3, 4, "forward"), _rec(4, 8, "update"),  # parent placed by name
        _rec(5, 50, "forward"),  # parent open: main_loop/evaluate
        _rec(7, 6, "forward"), _rec(6, 50, "forward"),  # parent of the same kind, then open
        _rec(9, 4, "forward", tid=TID + 1)]  # parent in another thread: top-level
    metrics.observe([Batch(here, 0, records, {TID: "MainThread", TID + 1: "t"})],
                    exemplars=True)
    assert _counts(metrics) == {
        ("init", "init", "main"): 20, ("main_loop/update", "update", "main"): 1,
        ("main_loop/update/forward", "forward", "main"): 1,
        ("main_loop/evaluate/forward", "forward", "main"): 2,
        ("main_loop/evaluate/forward/forward", "forward", "main"): 1,
        ("forward", "forward", "main"): 1}
    assert metrics.resolver.unplaced == 0

# --- a real run: paths of blocks drained while their parents are still open ----------------------

def _counts_in(request: Any) -> dict[str, int]:
    """{path: runs} of the duration histogram in an export request."""
    (duration,) = [mt for rm in request.resource_metrics for sm in rm.scope_metrics
                   for mt in sm.metrics if mt.name == "otel_rl.block.duration"]
    counts = {}
    for point in duration.histogram.data_points:
        labels = {kv.key: kv.value.string_value for kv in point.attributes}
        assert labels["path"].split("/")[-1] == labels["block"]
        counts[labels["path"]] = point.count
    return counts


def test_a_run_labels_each_block_with_its_path_in_its_thread(
        otlp_receiver: Any, otlp_metrics_receiver: Any, tmp_path: Any) -> None:
    import threading
    import time

    import otel_rl
    from otel_rl._internal import runtime
    from otel_rl.timers import hierarchical_timer

    def task() -> None:
        with hierarchical_timer("task"):
            with hierarchical_timer("step"):
                time.sleep(0.001)

    try:
        otel_rl.configure(endpoint=otlp_receiver.http_endpoint,
                          metrics_endpoint=otlp_metrics_receiver.grpc_endpoint,
                          metrics_protocol="grpc", spans="all", propagate=False,
                          flush_interval=0.02, metrics_interval=0.05, output_dir=str(tmp_path))
        with hierarchical_timer("outer"):
            for _ in range(3):
                with hierarchical_timer("inner"):
                    # "step" sits at three paths: each run is placed by its parent, which
                    # is still open when the flush thread counts it.
                    with hierarchical_timer("step"):
                        time.sleep(0.03)
                    time.sleep(0.03)
                with hierarchical_timer("step"):
                    time.sleep(0.001)
            thread = threading.Thread(target=task)  # started inside "outer"
            thread.start()
            thread.join()
            # "outer" stays open for many flushes more than a record waits for its parent:
            # its children are placed under it from the open blocks, not left waiting.
            give_up = time.monotonic() + 60
            while (len(otlp_metrics_receiver.requests) < 2 * metrics_paths.ROUNDS
                   and time.monotonic() < give_up):
                time.sleep(0.05)
            before_end = _counts_in(otlp_metrics_receiver.requests[-1])
        otel_rl.shutdown(10.0)
        # While "outer" was open, its "step" runs were counted under it already.
        assert before_end["outer/step"] == 3 and "outer" not in before_end
        counts = _counts_in(otlp_metrics_receiver.requests[-1])  # the final export: the totals
        assert counts == {"outer": 1, "outer/inner": 3, "outer/inner/step": 3, "outer/step": 3,
                          "task": 1, "task/step": 1}
    finally:
        runtime.reset_for_tests()


def test_a_relayed_batch_counts_from_its_columns_exactly_as_from_its_records() -> None:
    """A worker's batch arrives over the relay as typed columns; the metrics read those
    columns (no step per record) and must come to the very same points as from the records:
    paths across nesting and threads, blocks with attributes, non-block spans left out, a
    record waiting for its parent."""
    from otel_rl._internal import relay

    records = [
        _rec(3, 2, "env_step", 0.0004), _rec(2, 1, "rollout", 0.003),
        _rec(6, 1, "env_step", 0.02, tid=TID + 1),  # another thread: a top-level block
        _rec(4, 1, "update", 0.2, extra={"attrs": {"lr": 0.1}}),
        _rec(7, 1, "update", 0.1, extra={"attrs": {"otel_rl.continuation": True}}),
        _rec(8, 0, "run", 1.0, extra={"attrs": {"otel_rl.kind": "run"}}),
        _rec(9, 50, "late", 0.001),  # its parent (50) comes in the next batch
        _rec(1, 0, "main_loop", 0.5)]
    later = [_rec(50, 0, "outer", 0.002)]

    def points(relayed: bool) -> dict[Any, Any]:
        metrics = _metrics()
        for batch in (records, later):
            made = Batch(WORKER, 0, list(batch), {TID: "MainThread", TID + 1: "t"})
            if relayed:
                made = relay.decode_columns(relay.encode_columns(made)[relay.FRAME_HEADER.size:])
                assert made.columns is not None
            metrics.observe([made], exemplars=True)
        return {k: (list(p.bucket_counts), p.sum, [(e.as_double, e.span_id) for e in p.exemplars])
                for k, p in _points(metrics).items()}

    direct, relayed = points(False), points(True)
    assert relayed == direct
    assert {dict(k)["path"]: sum(v[0]) for k, v in direct.items()} == {
        "main_loop": 1, "main_loop/rollout": 1, "main_loop/rollout/env_step": 1,
        "env_step": 1, "main_loop/update": 1, "outer": 1, "outer/late": 1}
