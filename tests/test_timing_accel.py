"""The compiled Timing (`_timingacc.c`) against the pure-Python one in `otel_rl.timing`: the
same workloads give the same Timing, the same spans and the same timers.json, exactly.

Random programs of nested `timeit`/`add_time`/`time_avg` blocks (the same key at several
depths, re-entered context objects, blocks raising, `add_time` on a key first used by
`time_avg`, attribute reads of keys and methods, `gpu=`, a Timing subclass, a pickled and
restored Timing, threads, a forked worker) run once on each path under otel_rl with its
deterministic span clock and ids, and with ``time.time`` (which Timing measures with) swapped
for a clock that moves by seeded steps, zero among them (so `EPS` shows). Everything a caller
can see afterwards is compared whole.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import pickle
import random
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl.timing as ot
from otel_rl._internal import accel, recorder
from otel_rl.testing import capture_spans

pytestmark = pytest.mark.skipif(
    accel.compiled("_timingacc") is None and not os.environ.get("CI"),
    reason="the compiled Timing is not built here (python scripts/build_accel.py)")

KEYS = ("step", "forward", "env", "io", "update")


class WallClock:
    """Stands in for ``time.time``: each reading moves it by a seeded step (0 included)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += self._rng.choice((0.0, 0.0, 0.25, 0.5, 1.5, 1e-9, 3.0))
        return self.now


class Boom(Exception):
    pass


class SubTiming(ot.Timing):
    """A subclass: its calls go to the pure functions."""

    def add_time(self, key: str, gpu: bool | None = None) -> ot.TimingContext:
        return super().add_time(key, gpu)


def _value(value: Any) -> Any:
    if isinstance(value, ot.AvgTime):
        return ("AvgTime", value.values.maxlen, list(value.values), str(value))
    if isinstance(value, ot.TimingContext):
        return ("TimingContext", value._key, value._additive, value._average)
    if isinstance(value, list):
        return ("list", [_value(v) for v in value])
    return (type(value).__name__, value)


def _tree(node: Any) -> Any:
    return (_value(node.self_time), [(k, _tree(v)) for k, v in node.timing.items()])


def _attempt(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


def observe(timing: Any) -> dict[str, Any]:
    return {
        "type": type(timing).__name__,
        "tree_str": _attempt(timing.tree_str),
        "flat_str": _attempt(timing.flat_str),
        "items": [(k, _value(v)) for k, v in dict.items(timing)],
        "tree": _tree(dict.__getitem__(timing, "_root_context").timing_tree_node),
    }


def in_turn(works: list[Callable[[], object]]) -> None:
    """Run each of `works` on a thread of its own, one after another (the clocks stay
    deterministic), each thread alive until all are done (a thread id is not reused)."""
    release = threading.Event()
    threads = []
    for work in works:
        done = threading.Event()

        def run(work: Callable[[], object] = work, done: threading.Event = done) -> None:
            try:
                work()
            finally:
                done.set()
                release.wait(60)

        threads.append(threading.Thread(target=run))
        threads[-1].start()
        done.wait()
    release.set()
    for t in threads:
        t.join()


def program(seed: int, events: list[Any]) -> Callable[[], list[Any]]:
    """A random workload over several Timings; returns the Timings it made."""
    rng = random.Random(seed)

    def block(timing: Any, depth: int) -> None:
        for _ in range(rng.randint(0, 3 if depth < 4 else 0)):
            make = rng.choice(("timeit", "add_time", "time_avg"))
            name = rng.choice(KEYS)
            key = f"{make}.{name}"  # one kind per key, except where a test mixes them
            kind = rng.random()
            if kind < 0.08:  # raises inside; caught here
                try:
                    with getattr(timing, make)(key):
                        raise Boom(key)
                except Boom as exc:
                    events.append(("caught", str(exc)))
            elif kind < 0.14:  # a context object entered twice, once inside itself
                ctx = timing.add_time(f"add_time.{name}")
                with ctx:
                    with ctx:
                        block(timing, depth + 1)
                with ctx:
                    pass
            elif kind < 0.18:  # gpu= and keyword arguments (the pure path)
                with timing.add_time(f"add_time.{name}", gpu=False):
                    pass
                with timing.timeit(f"timeit.{name}", False):  # positional: the compiled path
                    pass
                with timing.time_avg(f"time_avg.{name}", average=3):
                    pass
            elif kind < 0.22:  # add_time on an average key raises TypeError on exit
                try:
                    with timing.time_avg("avg_" + name, 2):
                        pass
                    with timing.add_time("avg_" + name):
                        pass
                except TypeError as exc:
                    events.append(("type error", str(exc)))
            elif kind < 0.26:  # attribute reads: keys shadow, methods, missing names
                events.append(("attr", _attempt(lambda k=key: _value(getattr(timing, k)))))
                events.append(("attr", _attempt(lambda: timing.nope)))
                events.append(("attr", _attempt(lambda: timing._name)))
            elif kind < 0.3:
                with timing.time_avg(f"time_avg.{name}", rng.choice((1, 2, 10))):
                    block(timing, depth + 1)
            else:
                with getattr(timing, make)(key) as entered:
                    events.append(("yields", entered))
                    block(timing, depth + 1)

    def run() -> list[Any]:
        timings: list[Any] = []
        main = ot.Timing("Runner profile")
        timings.append(main)
        with main.timeit("main_loop"):
            workers = [ot.Timing(f"RolloutWorker_w{i} profile") for i in range(2)]
            timings.extend(workers)
            in_turn([lambda worker=worker: block(worker, 0) for worker in workers])
            block(main, 1)
        sub = SubTiming("Learner profile")
        timings.append(sub)
        block(sub, 0)
        odd = ot.Timing(7)  # a name that is not a str: the component is named "7"
        timings.append(odd)
        block(odd, 0)
        # A pickled Timing, restored and used on.
        restored = pickle.loads(pickle.dumps(main))
        timings.append(restored)
        block(restored, 0)
        # A key that shadows a method: the attribute read gives the value.
        with main.add_time("flat_str"):
            pass
        events.append(("shadowed", _value(main.flat_str)))
        return timings

    return run


#: Span attributes that differ from run to run whatever the path (ids, wall-clock seconds).
_VARYING = ("thread", "run_id", "run.id", "aggregate.data", "time_seconds")


def spans_of(captured: Any) -> list[Any]:
    return [(s.name, s.span_id, s.parent_span_id, s.start_ns, s.end_ns, s.is_error,
             sorted((k, v) for k, v in s.attributes.items()
                    if not any(w in k for w in _VARYING)))
            for s in captured.spans]


def run_on(compiled: bool, workload: Callable[[list[Any]], Callable[[], list[Any]]],
           seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the workload with Timing on one path, otel_rl configured deterministically."""
    out = tmp_path / ("compiled" if compiled else "pure")
    events: list[Any] = []
    recorder.reset_for_tests()  # every run makes its thread stacks (and reads clocks) anew
    # Only Timing's clock: otel_rl's own threads read ``time.time`` whenever they run.
    monkeypatch.setattr(ot, "time", types.SimpleNamespace(time=WallClock(seed)))
    try:
        with capture_spans(output_dir=str(out)) as captured:
            # Timing's path only: the hot path under it stays the same in both runs.
            assert ot._use_accelerator(compiled) is compiled
            timings = workload(events)()
    finally:
        monkeypatch.undo()
        ot._use_accelerator(recorder.accelerator_on())
    return {
        "timings": [observe(t) for t in timings],
        "events": events,
        "spans": spans_of(captured),
        "timers.json": json.loads((out / "timers.json").read_text()),
    }


def _strip_times(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_times(v) for k, v in node.items()
                if k not in ("total", "min", "max", "start_time", "end_time")}
    return node


def compare(workload: Callable[[list[Any]], Callable[[], list[Any]]], seed: int,
            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    compiled = run_on(True, workload, seed, tmp_path, monkeypatch)
    pure = run_on(False, workload, seed, tmp_path, monkeypatch)
    assert compiled["timings"] == pure["timings"]
    assert compiled["events"] == pure["events"]
    assert compiled["spans"] == pure["spans"]
    assert compiled["timers.json"].get("children") == pure["timers.json"].get("children")
    return compiled


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_give_the_same_timing_spans_and_timers_json(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = compare(lambda events: program(seed, events), seed, tmp_path, monkeypatch)
    assert result["spans"], "the workload made spans"
    assert any(e[0] == "yields" for e in result["events"])


def test_zero_time_blocks_record_eps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def workload(events: list[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            monkeypatch.setattr(ot.time, "time", lambda: 5.0)  # no time passes
            t = ot.Timing("eps")
            with t.add_time("a"):
                with t.timeit("b"):
                    pass
            with t.add_time("a"):
                pass
            with t.time_avg("c"):
                pass
            return [t]
        return run

    result = compare(workload, 0, tmp_path, monkeypatch)
    items = dict(result["timings"][0]["items"])
    assert items["a"] == ("float", 2 * ot.EPS)
    assert items["b"] == ("float", ot.EPS)
    assert items["c"][2] == [ot.EPS]


def test_a_failing_mirror_block_leaves_timing_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def __init__(self, key: str, gpu: bool | None = None) -> None:
            if key == "make":
                raise RuntimeError("cannot make")

        def __enter__(self) -> None:
            if rng_enter[0]:
                raise ValueError("cannot enter")

        def __exit__(self, *exc: object) -> None:
            raise KeyError("cannot exit")

    rng_enter = [False]

    def workload(events: list[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            monkeypatch.setattr(ot, "_block_factory", Broken)
            monkeypatch.setattr(ot, "_bridge_failed", False)
            t = ot.Timing("broken")
            for key in ("make", "exit", "make"):
                with t.add_time(key):
                    with t.timeit("inner"):
                        pass
            rng_enter[0] = True
            with t.add_time("enter"):
                pass
            rng_enter[0] = False
            events.append(sorted(r.getMessage() for r in caplog.records
                                 if "mirroring" in r.getMessage()))
            caplog.clear()
            return [t]
        return run

    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        result = compare(workload, 1, tmp_path, monkeypatch)
    assert len(result["events"][0]) == 1, "reported once"
    assert "RuntimeError: cannot make" in result["events"][0][0]
    items = dict(result["timings"][0]["items"])
    assert set(items) >= {"make", "exit", "inner", "enter"}


def test_no_mirror_gives_the_same_timing(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def workload(events: list[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            monkeypatch.setattr(ot, "_block_factory", None)
            return program(3, events)()
        return run

    result = compare(workload, 3, tmp_path, monkeypatch)
    assert {s[0] for s in result["spans"]} == {"run", "otel_rl aggregate"}, "no block spans"


def _forked(conn: Any, compiled: bool) -> None:
    ot._use_accelerator(compiled)
    events: list[Any] = []
    timings = program(5, events)()
    conn.send(([observe(t) for t in timings], events, ot.accelerated() is compiled))
    conn.close()


def test_a_forked_worker_runs_the_same_on_both_paths(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def workload(events: list[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            t = ot.Timing("Runner profile")
            with t.add_time("spawn"):
                ctx = mp.get_context("fork")
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_forked, args=(child, ot.accelerated()))
                p.start()
                events.append(parent.recv())
                p.join(60)
                events.append(p.exitcode)
            return [t]
        return run

    result = compare(workload, 5, tmp_path, monkeypatch)
    assert result["events"][1] == 0
    child_timings, _, child_on_its_path = result["events"][0]
    assert len(child_timings) == 6
    assert child_on_its_path


@pytest.fixture
def both_paths() -> Iterator[None]:
    yield
    ot._use_accelerator(recorder.accelerator_on())


def test_the_accelerator_setting_switches_timing(both_paths: None) -> None:
    ot._use_accelerator(True)
    assert ot.accelerated()
    assert type(ot.Timing.__dict__["add_time"]).__name__ == "method_descriptor"
    recorder.use_accelerator(False)
    try:
        assert not ot.accelerated()
        assert ot.Timing.__dict__["add_time"] is ot._PURE[2][2]
        assert ot.AttrDict.__dict__["__getattribute__"] is ot._PURE[0][2]
    finally:
        recorder.use_accelerator(accel.wanted())
    assert ot.accelerated() is accel.wanted()


def test_switching_paths_while_blocks_are_open(both_paths: None) -> None:
    t = ot.Timing("switch")
    ot._use_accelerator(True)
    outer = t.add_time("outer")
    outer.__enter__()
    ot._use_accelerator(False)
    with t.add_time("inner"):
        ot._use_accelerator(True)
    outer.__exit__(None, None, None)
    assert dict.__getitem__(t, "_open_contexts_stack") == [dict.__getitem__(t, "_root_context")]
    assert t.tree_str().splitlines()[1:] == [f"outer: {t['outer']:.4f}",
                                             f"  inner: {t['inner']:.4f}"]


def test_the_real_clock_gives_times_within_time_time_readings(both_paths: None) -> None:
    """The compiled path reads ``time.time`` natively while it is the real one."""
    assert ot.time.time is time.time
    for compiled in (True, False):
        assert ot._use_accelerator(compiled) is compiled
        t = ot.Timing("real")
        before = time.time()
        with t.add_time("outer"):
            for _ in range(50):
                with t.timeit("inner"):
                    sum(range(100))
            with t.time_avg("avg", 3):
                pass
        after = time.time()
        assert ot.EPS <= t["inner"] <= t["outer"] <= after - before
        assert ot.EPS <= t["avg"].values[0] <= after - before
        assert t.tree_str().splitlines()[1:] == [f"outer: {t['outer']:.4f}",
                                                 f"  inner: {t['inner']:.4f}, avg: {t['avg']}"]


def test_a_compiled_timing_that_does_not_install_leaves_timing_pure(
        both_paths: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    class Misfit:
        @staticmethod
        def install(*args: object) -> dict[object, object]:
            raise TypeError("TimingContext._key is not a writable slot")

    monkeypatch.setattr(accel, "compiled", lambda name="_hotpath": Misfit)
    monkeypatch.setattr(ot, "_warned", [])
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        assert ot._use_accelerator(True) is False
        assert ot._use_accelerator(True) is False  # (each `configure` asks again)
    assert not ot.accelerated()
    assert "the compiled Timing does not load (TypeError: TimingContext._key" in caplog.text
    assert caplog.text.count("does not load") == 1  # said once per process
    t = ot.Timing("pure")
    with t.add_time("a"):
        pass
    assert t["a"] >= ot.EPS
