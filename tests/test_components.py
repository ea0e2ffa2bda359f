"""Sample Factory components in-process: a named `Timing` used in a worker thread becomes a
block named like it, its role and index go on the span and into `workers`, and the tree rebuilt
from spans agrees with timers.json. The real-framework version is tests/frameworks/."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import semconv
from otel_rl._internal.components import role_of
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl._internal.treebuild import build_tree
from otel_rl.timers import hierarchical_timer
from otel_rl.timing import Timing


@pytest.mark.parametrize(("name", "expected"), [
    ("RolloutWorker_w1 profile", ("RolloutWorker", 1)),
    ("InferenceWorker_p0-w2 profile", ("InferenceWorker", 2)),
    ("Learner 0 profile", ("Learner", 0)),
    ("Runner profile", ("Runner", 0)),
    ("trainer", ("trainer", 0)),
])
def test_role_and_index_come_from_the_timing_name(name: str, expected: tuple[str, int]) -> None:
    assert role_of(name) == expected


def rollout(index: int, steps: int) -> None:
    timing = Timing(f"RolloutWorker_w{index} profile")
    for _ in range(steps):
        with timing.add_time("env_step"), timing.timeit("policy"):
            pass


def run(tmp_path: Path) -> tuple[dict[str, Any], Any]:
    otel_rl.configure(output_dir=str(tmp_path), spans="all")
    runner = Timing("Runner profile")
    with runner.timeit("main_loop"):
        threads = [threading.Thread(target=rollout, args=(i, 3 + i)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    return tree, read_otlp_json_file(tmp_path / "spans.otlp.jsonl")


def test_named_timing_in_a_worker_thread_is_a_component(tmp_path: Path) -> None:
    tree, spans = run(tmp_path)
    main_loop = tree["children"]["main_loop"]
    assert set(main_loop["children"]) == {"RolloutWorker_w0 profile", "RolloutWorker_w1 profile"}
    for i in range(2):
        component = main_loop["children"][f"RolloutWorker_w{i} profile"]
        assert component["count"] == 1 and component["is_parallel"]
        assert component["children"]["env_step"]["count"] == 3 + i
        assert component["children"]["env_step"]["children"]["policy"]["count"] == 3 + i
    workers = {(w["role"], w["index"], tuple(w["path"])) for w in tree["workers"]}
    assert workers == {("RolloutWorker", 0, ("main_loop", "RolloutWorker_w0 profile")),
                       ("RolloutWorker", 1, ("main_loop", "RolloutWorker_w1 profile")),
                       ("Runner", 0, ())}
    marked = {(s.name, s.attributes[semconv.COMPONENT_ROLE], s.attributes[semconv.COMPONENT_INDEX])
              for s in spans if semconv.COMPONENT in s.attributes}
    assert marked == {("RolloutWorker_w0 profile", "RolloutWorker", 0),
                      ("RolloutWorker_w1 profile", "RolloutWorker", 1), ("run", "Runner", 0)}


def test_tree_from_spans_has_the_same_components(tmp_path: Path) -> None:
    tree, spans = run(tmp_path)
    rebuilt = build_tree(spans).to_dict()
    assert _counts(rebuilt) == _counts(tree)
    assert sorted((w["role"], w["index"], w["path"]) for w in rebuilt["workers"]) == \
        sorted((w["role"], w["index"], w["path"]) for w in tree["workers"])


def _counts(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    result = {}
    for name, child in (tree.get("children") or {}).items():
        result[(*path, name)] = child["count"]
        result.update(_counts(child, (*path, name)))
    return result


def test_an_unnamed_timing_or_the_runs_own_thread_gets_no_component_block(
    tmp_path: Path,
) -> None:
    otel_rl.configure(output_dir=str(tmp_path), spans="all")
    with Timing("learner").add_time("train"):
        pass
    def unnamed() -> None:
        with Timing().timeit("step"):
            pass

    with hierarchical_timer("outer"):
        thread = threading.Thread(target=unnamed)
        thread.start()
        thread.join()
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert set(tree["children"]) == {"train", "outer"}
    assert set(tree["children"]["outer"]["children"]) == {"step"}


def test_the_runs_role_does_not_outlive_its_configure(tmp_path: Path) -> None:
    run(tmp_path / "first")
    otel_rl.configure(output_dir=str(tmp_path / "second"), spans="all")
    with hierarchical_timer("plain"):
        pass
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "second" / "timers.json").read_text())
    # Timers are the process's (what the first run recorded stays, as with ML-Agents), but the
    # run's own role came from the first run's Timing: it is not this run's.
    assert "Runner" not in {w["role"] for w in tree.get("workers", [])}
    assert "plain" in tree["children"]


def test_a_known_component_is_found_again_only_in_its_own_run(tmp_path: Path) -> None:
    """The switch's shortcut (a component made already) holds for its own run only: the same
    thread and Timing name in a second `configure()` get a component of the second run, and
    the thread's own stack is active again after every top-level block."""
    from otel_rl._internal import recorder

    def worker(steps: int, seen: list[bool]) -> None:
        timing = Timing("Learner 0 profile")
        own = recorder.thread_stack()
        for _ in range(steps):
            with timing.add_time("train"):
                seen.append(recorder.thread_stack() is not own)
            seen.append(recorder.thread_stack() is own)

    for run_index, steps in enumerate((4, 6)):
        out = tmp_path / str(run_index)
        otel_rl.configure(output_dir=str(out), spans="all")
        seen: list[bool] = []
        runner = Timing("Runner profile")
        with runner.timeit("main_loop"):
            thread = threading.Thread(target=worker, args=(steps, seen))
            thread.start()
            thread.join()
        otel_rl.shutdown()
        assert seen == [True] * (2 * steps)
        # This run's own component span, made in this run, holds this run's blocks.
        spans = read_otlp_json_file(out / "spans.otlp.jsonl")
        components = [s for s in spans if s.name == "Learner 0 profile"]
        assert len(components) == 1
        assert components[0].attributes[semconv.COMPONENT_ROLE] == "Learner"
        trains = [s for s in spans if s.name == "train"]
        assert len(trains) == steps
        assert {s.parent_span_id for s in trains} == {components[0].span_id}
        assert {s.trace_id for s in trains} == {components[0].trace_id}


def test_a_thread_living_across_two_runs_gets_a_component_of_each(tmp_path: Path) -> None:
    """A thread that outlives a `shutdown()` and times blocks again in the next run: its
    component of the first run is not reused (its spans would point into the first run)."""
    go = [threading.Event(), threading.Event()]
    done = [threading.Event(), threading.Event()]

    def worker() -> None:
        timing = Timing("Learner 0 profile")
        for run_index in range(2):
            go[run_index].wait(10)
            for _ in range(3 + run_index):
                with timing.add_time("train"):
                    pass
            done[run_index].set()

    thread: threading.Thread | None = None
    for run_index in range(2):
        out = tmp_path / str(run_index)
        otel_rl.configure(output_dir=str(out), spans="all")
        runner = Timing("Runner profile")
        with runner.timeit("main_loop"):
            if thread is None:
                thread = threading.Thread(target=worker)
                thread.start()
            go[run_index].set()
            assert done[run_index].wait(10)
        otel_rl.shutdown()
        spans = read_otlp_json_file(out / "spans.otlp.jsonl")
        ids = {s.span_id for s in spans}
        trains = [s for s in spans if s.name == "train"]
        assert len(trains) == 3 + run_index
        parents = {s.parent_span_id for s in trains}
        assert parents <= ids, "a block hangs under a span of another run"
        assert {s.name for s in spans if s.span_id in parents} == {"Learner 0 profile"}
    assert thread is not None
    thread.join(10)


def test_component_spans_follow_the_test_clock() -> None:
    # capture_spans swaps the recorder's clock for a deterministic one; the component block
    # (opened by the Timing, closed at shutdown) reads the same clock as every other block.
    from otel_rl.testing import EPOCH_NS, capture_spans

    with capture_spans(step_ns=1000) as captured:
        runner = Timing("Runner profile")
        with runner.timeit("main_loop"):
            worker = threading.Thread(target=rollout, args=(0, 3))
            worker.start()
            worker.join()
    spans = {s.name: s for s in captured.spans}
    component = spans["RolloutWorker_w0 profile"]
    assert component.attributes[semconv.COMPONENT_ROLE] == "RolloutWorker"
    readings = 1000 * 1000  # far more clock readings than this test makes
    for span in captured.spans:
        assert EPOCH_NS <= span.start_ns <= span.end_ns <= EPOCH_NS + readings, span.name
        assert (span.start_ns - EPOCH_NS) % 1000 == 0 and (span.end_ns - EPOCH_NS) % 1000 == 0
    steps = [s for s in captured.spans if s.name == "env_step"]
    assert len(steps) == 3 and all(s.parent_span_id == component.span_id for s in steps)
    assert component.start_ns < min(s.start_ns for s in steps)
    assert component.end_ns > max(s.end_ns for s in steps)


def test_a_forked_child_never_switches_to_its_parents_components(tmp_path: Path) -> None:
    """The switch's shortcut makes no pid check (it relies on the fork hooks: the child's
    runtime is not its parent's, and its components are reset): a child forked from a thread
    that has a component must time its blocks on its own stack, never on the parent's
    component stack (nothing in the child drains it)."""
    import os

    from otel_rl._internal import recorder

    otel_rl.configure(output_dir=str(tmp_path), spans="all", propagate=False)
    result: list[bytes] = []

    def worker() -> None:
        timing = Timing("Learner 0 profile")
        with timing.add_time("train"):
            pass  # the component exists now, and the shortcut would find it
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report whether its block ran on the parent's component
            try:
                own = recorder.thread_stack()
                with timing.add_time("train"):
                    switched = recorder.active_stack() is not own
                os.write(write, b"switched" if switched else b"own")
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        result.append(os.read(read, 100))
        os.close(read)

    runner = Timing("Runner profile")
    try:
        with runner.timeit("main_loop"):
            thread = threading.Thread(target=worker)
            thread.start()
            thread.join()
    finally:
        otel_rl.shutdown()
    assert result == [b"own"]
