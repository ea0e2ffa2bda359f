"""`otel_rl.timing` against the real Sample Factory 2.1.1 `Timing` as the oracle.

Sample Factory's timing module is imported as is; only the two modules it imports for a constant
and a logger (``sample_factory.algo.utils.misc`` pulls in torch, ``sample_factory.utils.utils``
colorlog and more) are replaced by tiny stand-ins while it is imported. The same workloads run
through both implementations under a controlled clock (both measure with ``time.time()``), and
everything observable is compared: the tree view, the flat view, the dict's keys, value types and
values, the nested tree nodes, exceptions, and the values ``with`` yields.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl.timing as ot
from otel_rl._internal import accel, recorder

pytest.importorskip("sample_factory")

REPO = Path(__file__).resolve().parents[1]

_STAND_INS = ("sample_factory.algo.utils.misc", "sample_factory.utils.utils")


def _load_real_sample_factory_timing() -> types.ModuleType:
    name = "sample_factory.utils.timing"
    module = sys.modules.get(name)
    if module is None:
        misc = types.ModuleType(_STAND_INS[0])
        misc.EPS = 1e-8  # type: ignore[attr-defined]
        utils = types.ModuleType(_STAND_INS[1])
        utils.log = logging.getLogger("rl")  # type: ignore[attr-defined]
        saved = {n: sys.modules.get(n) for n in _STAND_INS}
        sys.modules.update({misc.__name__: misc, utils.__name__: utils})
        try:
            module = importlib.import_module(name)
        finally:
            for n, previous in saved.items():
                if previous is None:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = previous
    # The oracle must be Sample Factory's own file, not an alias served by otel_rl.
    assert module.__file__ is not None
    assert module.__file__.endswith(os.path.join("sample_factory", "utils", "timing.py"))
    return module


SF = _load_real_sample_factory_timing()
IMPLEMENTATIONS = {"sample_factory": SF, "otel_rl": ot}


class Clock:
    """Stands in for ``time.time``: moves only when a workload says so, whoever reads it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time, "time", fake)
    return fake


@pytest.fixture(autouse=True, params=["compiled", "pure"])
def timing_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every comparison runs with otel_rl's compiled Timing (`_timingacc.c`) and pure, on each
    hot path (`tests/fixtures/hot_path.py`, set up first: its switch moves Timing's too)."""
    request.getfixturevalue("hot_path")
    compiled = request.param == "compiled"
    if compiled and accel.compiled("_timingacc") is None and not os.environ.get("CI"):
        pytest.skip("the compiled Timing is not built here (python scripts/build_accel.py)")
    assert ot._use_accelerator(compiled) is compiled
    yield str(request.param)
    ot._use_accelerator(recorder.accelerator_on())


@pytest.fixture(params=["bridge_on", "bridge_off"])
def bridge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run otel_rl's Timing with and without its mirror blocks in otel_rl.timers."""
    if request.param == "bridge_off":
        monkeypatch.setattr(ot, "_block_factory", None)
    else:
        assert ot._block_factory is not None, "otel_rl.timers should be importable"
    return str(request.param)


# Observing a Timing --------------------------------------------------------------------------


def _attempt(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


def _value(value: Any) -> Any:
    """A value of the dict or a tree node, comparable across the two modules."""
    if type(value).__name__ == "AvgTime":
        return ("AvgTime", value.values.maxlen, list(value.values), str(value))
    if type(value).__name__ == "TimingContext":
        return ("TimingContext", value._key)
    if isinstance(value, list):
        return ("list", [_value(v) for v in value])
    return (type(value).__name__, value)


def _tree(node: Any) -> Any:
    return (_value(node.self_time), [(k, _tree(v)) for k, v in node.timing.items()])


def observe(timing: Any) -> dict[str, Any]:
    """Everything a caller can see of a Timing (read through dict methods where a key could
    shadow an attribute)."""
    return {
        "str": _attempt(lambda: str(timing)),
        "tree_str": _attempt(timing.tree_str),
        "flat_str": _attempt(timing.flat_str),
        "items": [(k, _value(v)) for k, v in dict.items(timing)],
        "tree": _tree(dict.__getitem__(timing, "_root_context").timing_tree_node),
    }


def numbers_blanked(text: str) -> str:
    return re.sub(r"\d+\.\d+", "#", text)


# Workloads: the same code runs against either module ----------------------------------------


def nested_modes(mod: Any, clock: Clock, n: int = 25) -> tuple[Any, list[Any]]:
    t = mod.Timing("learner")
    for i in range(n):
        with t.add_time("total"):
            with t.timeit("collect"):
                clock.advance(0.001 * (i % 7 + 1))
            with t.add_time("train"):
                with t.time_avg("forward", average=4):
                    clock.advance(0.002 * (i % 3))
                with t.add_time("step"):  # the same key at two depths
                    clock.advance(0.0005)
            with t.add_time("step"):
                clock.advance(0.00025)
            with t.time_avg("update"):
                clock.advance(0.003 * (i % 5))
        with t.timeit("idle"):  # zero duration: the EPS floor
            pass
    return t, []


def exceptions(mod: Any, clock: Clock) -> tuple[Any, list[Any]]:
    t = mod.Timing()
    events: list[Any] = []
    for i in range(6):
        try:
            with t.add_time("outer"):
                clock.advance(0.01)
                with t.timeit("inner") as value:
                    events.append(value)
                    clock.advance(0.002 * i)
                    if i % 2:
                        raise ValueError(i)
                with t.time_avg("after", 3):
                    clock.advance(0.001)
        except ValueError as exc:
            events.append(("ValueError", exc.args))
    with t.add_time("after_errors"):
        clock.advance(0.5)
    return t, events


def mixed_modes(mod: Any, clock: Clock) -> tuple[Any, list[Any]]:
    """One key timed in different modes, including the combinations that make Sample Factory
    raise while recording (which leaves its stack of open blocks one too deep)."""
    t = mod.Timing()
    events: list[Any] = []

    def block(make: Callable[[], Any], seconds: float) -> None:
        try:
            with make():
                clock.advance(seconds)
        except (TypeError, AttributeError) as exc:
            events.append((type(exc).__name__, str(exc)))

    block(lambda: t.timeit("k"), 0.1)
    block(lambda: t.add_time("k"), 0.2)
    block(lambda: t.time_avg("a", 2), 0.3)
    block(lambda: t.timeit("a"), 0.4)
    block(lambda: t.add_time("a"), 0.5)
    block(lambda: t.time_avg("b", 2), 0.6)
    block(lambda: t.add_time("b"), 0.7)  # AvgTime += float: TypeError
    block(lambda: t.timeit("next"), 0.8)
    block(lambda: t.time_avg("k", 3), 0.9)  # float has no .values: AttributeError
    block(lambda: t.add_time("last"), 1.0)
    events.append(len(dict.__getitem__(t, "_open_contexts_stack")))
    return t, events


def context_reuse(mod: Any, clock: Clock) -> tuple[Any, list[Any]]:
    """A context's tree position is fixed when it is made; contexts may be re-entered."""
    t = mod.Timing()
    early = t.timeit("early")
    with t.add_time("outer"):
        with early:
            clock.advance(0.01)
        with early:
            with t.add_time("inside_early"):
                clock.advance(0.001)
    recursive = t.add_time("rec")

    def recurse(depth: int) -> None:
        with recursive:
            clock.advance(0.001 * (depth + 1))
            if depth:
                recurse(depth - 1)

    recurse(3)
    return t, []


def access(mod: Any, clock: Clock) -> tuple[Any, list[Any]]:
    t = mod.Timing("named", {"preset": 1.5}, extra=2)
    t.custom = 3.0
    with t.timeit("x"):
        clock.advance(0.5)
    events = [
        t.x,
        t["x"],
        t.custom,
        t.preset,
        t.extra,
        t._name,
        "custom" in t,
        len(t),
        t.get("x"),
        hasattr(t, "missing"),
        sorted(vars(t)),
    ]
    t["items"] = 7  # a key shadows the method on attribute reads, even inside flat_str
    events.append(t.items)
    return t, events


WORKLOADS = [nested_modes, exceptions, mixed_modes, context_reuse, access]


def run_both(workload: Callable[..., tuple[Any, list[Any]]], clock: Clock) -> list[Any]:
    results = []
    for mod in IMPLEMENTATIONS.values():
        clock.now = 1000.0
        timing, events = workload(mod, clock)
        results.append((observe(timing), [_value(e) for e in events]))
    return results


# Differential tests --------------------------------------------------------------------------


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__)
def test_workload_gives_identical_results(
    workload: Callable[..., tuple[Any, list[Any]]], clock: Clock, bridge: str
) -> None:
    sample_factory, otel_rl = run_both(workload, clock)
    assert otel_rl == sample_factory


def test_tree_str_has_sample_factory_layout(clock: Clock) -> None:
    # Pins the shape the differential tests compare, so a change to both would still show.
    timing, _ = nested_modes(ot, clock, n=3)
    assert numbers_blanked(timing.tree_str()).splitlines() == [
        "learner tree view:",
        "idle: #",
        "total: #",
        "  collect: #, step: #, update: #",
        "  train: #",
        "    forward: #, step: #",
    ]
    assert numbers_blanked(timing.flat_str()) == (
        "_name: learner, total: #, collect: #, train: #, forward: #, step: #, update: #, idle: #"
    )


def test_additive_overwrite_and_average_values(clock: Clock) -> None:
    t = ot.Timing()
    for seconds in (1.0, 2.0, 3.0):
        with t.add_time("sum"):
            clock.advance(seconds)
        with t.timeit("last"):
            clock.advance(seconds)
    for seconds in range(1, 16):
        with t.time_avg("avg"):  # default window: the last 10
            clock.advance(float(seconds))
    with t.timeit("empty"):
        pass
    assert t.sum == 6.0
    assert t.last == 3.0
    assert list(t.avg.values) == [float(s) for s in range(6, 16)]
    assert str(t.avg) == "10.5000"
    assert t.empty == 1e-8


@pytest.mark.parametrize("window", [1, 3, 10, None, 0])
def test_avg_time_window_matches(window: int | None) -> None:
    shown = []
    for mod in IMPLEMENTATIONS.values():
        avg = mod.AvgTime(window)
        states = [str(avg)]
        for value in (0.5, 1.25, 2.0, 3.5, 0.125, 7.0):
            avg.values.append(value)
            states.append((list(avg.values), str(avg)))
        shown.append(states)
    assert shown[0] == shown[1]


def test_many_iterations_keep_the_same_structure() -> None:
    trees = []
    for mod in IMPLEMENTATIONS.values():
        t = mod.Timing("long")
        for i in range(3000):
            with t.add_time("iteration"):
                with t.timeit("env"):
                    pass
                if i % 3 == 0:
                    with t.time_avg("policy", 5):
                        with t.add_time("env"):
                            pass
        trees.append((numbers_blanked(t.tree_str()), numbers_blanked(t.flat_str())))
        assert t.iteration > 0
    assert trees[0] == trees[1]


def test_threads_with_their_own_timing_match() -> None:
    results: dict[tuple[str, int], tuple[str, str]] = {}

    def worker(label: str, mod: Any, index: int) -> None:
        t = mod.Timing(f"worker{index}")
        for i in range(200):
            with t.add_time("rollout"):
                with t.timeit(f"env{index}"):
                    time.sleep(0)
                if i % (index + 2) == 0:
                    with t.time_avg("inference"):
                        pass
        results[label, index] = (numbers_blanked(t.tree_str()), numbers_blanked(t.flat_str()))

    threads = [
        threading.Thread(target=worker, args=(label, mod, index))
        for index in range(4)
        for label, mod in IMPLEMENTATIONS.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index in range(4):
        assert results["otel_rl", index] == results["sample_factory", index]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickled_timing_round_trips_like_sample_factory(
    protocol: int, clock: Clock, bridge: str
) -> None:
    seen = []
    for mod in IMPLEMENTATIONS.values():
        clock.now = 1000.0
        timing, _ = nested_modes(mod, clock, n=5)
        with timing.add_time("open_while_pickled"):
            clock.advance(0.5)
            data = pickle.dumps(timing, protocol)
        copy = pickle.loads(data)
        # The copy still has the block open: a new block nests under it.
        with copy.add_time("after_copy"):
            clock.advance(1.0)
        seen.append(observe(copy))
    assert seen[0] == seen[1]


def test_init_global_profiler_sets_timing_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rl")
    for mod in IMPLEMENTATIONS.values():
        t = mod.Timing()
        mod.init_global_profiler(t)
        assert mod.TIMING is t
    messages = [r.getMessage() for r in caplog.records if r.name == "rl"]
    prefix = f"Setting global profiler in process psutil.Process(pid={os.getpid()}"
    assert len(messages) == 2
    assert all(m.startswith(prefix) for m in messages)


def test_import_loads_neither_torch_nor_psutil() -> None:
    code = (
        "import sys, otel_rl.timing\n"
        "print(sorted(m for m in ('torch', 'psutil', 'sample_factory') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# The mirror blocks in otel_rl.timers -----------------------------------------------------------


def _timer_tree_shape(node: dict[str, Any]) -> Any:
    return {k: (v["count"], _timer_tree_shape(v)) for k, v in node.get("children", {}).items()}


def _timing_shape(node: Any, counts: dict[str, int]) -> Any:
    return {k: (counts[k], _timing_shape(v, counts)) for k, v in node.timing.items()}


def _in_thread(fn: Callable[[], Any]) -> Any:
    # Away from the main thread, whose timer stack other tests use.
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join()
    return box[0]


@pytest.mark.parametrize("timers_module", ["otel_rl.timers", "mlagents_envs.timers"])
def test_blocks_mirror_into_timers_tree_with_same_nesting(
    timers_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    timers = pytest.importorskip(timers_module)
    monkeypatch.setattr(ot, "_block_factory", timers.hierarchical_timer)

    def work() -> tuple[Any, dict[str, Any]]:
        timers.reset_timers()
        t = ot.Timing()
        for i in range(10):
            with t.add_time("total"):
                with t.timeit("collect"):
                    pass
                with t.add_time("train"):
                    for _ in range(3):
                        with t.time_avg("forward"):
                            pass
                    try:
                        with t.timeit("backward"):
                            if i == 4:
                                raise ValueError("in a block")
                    except ValueError:
                        pass
        return t, timers.get_timer_tree()

    t, tree = _in_thread(work)
    counts = {"total": 10, "collect": 10, "train": 10, "forward": 30, "backward": 10}
    expected = _timing_shape(t._root_context.timing_tree_node, counts)
    assert _timer_tree_shape(tree) == expected


def test_mirror_stack_stays_balanced_when_recording_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timers = pytest.importorskip("mlagents_envs.timers")
    monkeypatch.setattr(ot, "_block_factory", timers.hierarchical_timer)

    def work() -> tuple[Any, dict[str, Any]]:
        timers.reset_timers()
        t = ot.Timing()
        with t.time_avg("b"):
            pass
        with pytest.raises(TypeError):
            with t.add_time("b"):
                pass
        with t.timeit("next"):
            pass
        return t, timers.get_timer_tree()

    t, tree = _in_thread(work)
    # Timing's own stack is stuck one deep, as in Sample Factory, so "next" nests under "b";
    # the mirror blocks follow the code, so there "next" is at the top.
    assert numbers_blanked(t.tree_str()).splitlines()[1:] == ["b: #", "  next: #"]
    assert set(tree["children"]) == {"b", "next"}
    assert tree["children"]["b"]["count"] == 2


class _BrokenBlocks:
    """A mirror-block factory failing at one stage: making the block, entering or leaving it."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def __call__(self, key: str) -> _BrokenBlocks:
        if self.stage == "make":
            raise RuntimeError("cannot make")
        return self

    def __enter__(self) -> None:
        if self.stage == "enter":
            raise RuntimeError("cannot enter")

    def __exit__(self, *exc_info: Any) -> None:
        if self.stage == "exit":
            raise RuntimeError("cannot exit")


@pytest.mark.parametrize("stage", ["make", "enter", "exit"])
def test_failing_mirror_blocks_leave_timing_results_unchanged(
    stage: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ot, "_block_factory", _BrokenBlocks(stage))
    monkeypatch.setattr(ot, "_bridge_failed", False)
    for workload in WORKLOADS:
        sample_factory, otel_rl = run_both(workload, clock)
        assert otel_rl == sample_factory
    warnings = [r for r in caplog.records if r.name == "otel_rl" and "Timing" in r.getMessage()]
    assert len(warnings) == 1


# Spans (needs otel_rl.configure and the spans file sink) --------------------------------------

_SPANS_SCRIPT = textwrap.dedent(
    """
    import sys
    import otel_rl
    from otel_rl.timing import Timing

    otel_rl.configure(output_dir=sys.argv[1], spans="all", service_name="sf-test")
    t = Timing()
    for i in range(3):
        with t.add_time("sf_total"):
            with t.timeit("sf_collect"):
                pass
            with t.add_time("sf_train"):
                with t.time_avg("sf_forward"):
                    pass
    otel_rl.shutdown()
    """
)


def _read_spans(folder: Path) -> list[dict[str, Any]]:
    spans = []
    for path in folder.rglob("spans*.otlp.jsonl"):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            for resource_spans in json.loads(line).get("resourceSpans", []):
                for scope_spans in resource_spans.get("scopeSpans", []):
                    spans.extend(scope_spans.get("spans", []))
    return spans


def test_sample_factory_blocks_become_nested_spans(tmp_path: Path) -> None:
    import otel_rl

    if not hasattr(otel_rl, "configure"):
        pytest.skip("otel_rl.configure has not landed yet")
    script = tmp_path / "sf_spans.py"
    script.write_text(_SPANS_SCRIPT)
    out = tmp_path / "out"
    subprocess.run(
        [sys.executable, str(script), str(out)],
        cwd=REPO,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    spans = _read_spans(out)
    if not spans:
        pytest.skip("no spans.otlp.jsonl written (the file sink has not landed yet)")
    by_id = {s["spanId"]: s for s in spans}
    parents = {
        (s["name"], by_id[s["parentSpanId"]]["name"] if s.get("parentSpanId") in by_id else None)
        for s in spans
        if s["name"].startswith("sf_")
    }
    # The top block's parent is the run's root span, if any: not a Sample Factory block.
    top = {(name, parent) for name, parent in parents if name == "sf_total"}
    assert len(top) == 1 and not str(top.pop()[1]).startswith("sf_")
    assert {p for p in parents if p[0] != "sf_total"} == {
        ("sf_collect", "sf_total"),
        ("sf_train", "sf_total"),
        ("sf_forward", "sf_train"),
    }
    names = [s["name"] for s in spans]
    assert names.count("sf_forward") == 3
