"""The compiled RLlib timer glue (`_hotpath.install_rllib`) against the pure one in
`otel_rl._internal.rllib`: the same workloads give the same spans, the same timers.json and
the same numbers on RLlib's side, exactly.

RLlib itself is not needed: a stand-in for its ``StatsBase`` (``__enter__`` keeps a start per
thread, ``__exit__`` pushes the time since, as RLlib 2.60's does, on a counting clock) is
patched as `rllib.PATCHES` patches RLlib's. Random programs of nested ``with stats:`` blocks,
stats objects entered and exited by hand with the outer one exited first (RLlib's connector
pipelines), unnamed stats objects, blocks raising, an RLlib ``__exit__`` raising, a thread
that exits a stats object it never timed, and several threads, run once on each path under
otel_rl's deterministic clock and ids; everything a caller can see afterwards is compared
whole. The real RLlib runs are in tests/frameworks/test_rllib.py (the compiled glue there).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import accel, recorder, rllib
from otel_rl.testing import capture_spans
from tests.test_timing_accel import in_turn, spans_of

pytestmark = pytest.mark.skipif(
    accel.compiled() is None and not os.environ.get("CI"),
    reason="the compiled hot path is not built here (python scripts/build_accel.py)")

NAMES = ("env_to_module_connector.connector_pipeline_timer",
         "env_to_module_connector.connectors.add_states", "rlmodule_inference_timer",
         "env_step_timer", "module_to_env_connector.connector_pipeline_timer")


class Boom(Exception):
    pass


class Clock:
    """RLlib's ``time.perf_counter`` in the stand-in: moves by one at every reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def stand_in() -> types.ModuleType:
    """A module shaped like ``ray.rllib.utils.metrics.stats.base``, with a fresh class."""
    clock = Clock()

    class StatsBase:
        def __init__(self) -> None:
            self._start_times: dict[int, float | None] = {}
            self.values: list[float] = []
            self.raise_on_push = False

        def push(self, value: float) -> None:
            self.values.append(value)
            if self.raise_on_push:
                raise Boom("push")

        def __enter__(self) -> StatsBase:
            self._start_times[threading.get_ident()] = clock()
            return self

        def __exit__(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
            thread_id = threading.get_ident()
            assert self._start_times[thread_id] is not None
            delta = clock() - self._start_times[thread_id]  # type: ignore[operator]
            self.push(delta)
            del self._start_times[thread_id]

    StatsBase.clock = clock  # type: ignore[attr-defined]
    module = types.ModuleType("ray.rllib.utils.metrics.stats.base")
    module.StatsBase = StatsBase  # type: ignore[attr-defined]
    return module


@pytest.fixture
def patched() -> Iterator[type]:
    module = stand_in()
    rllib.PATCHES["ray.rllib.utils.metrics.stats.base"](module)
    cls = module.StatsBase  # type: ignore[attr-defined]
    try:
        yield cls
    finally:
        rllib._stats_classes.pop(cls, None)


def program(cls: type, seed: int, events: list[Any]) -> Callable[[], list[Any]]:
    """A random workload over named and unnamed stats objects; returns them."""
    rng = random.Random(seed)
    stats = []
    for i in range(8):
        s = cls()
        if i < len(NAMES):
            s._otel_rl_block = NAMES[i]  # as `MetricsLogger._set_key` names it
        stats.append(s)

    opened: set[int] = set()  # RLlib times a stats object once at a time on a thread

    def block(depth: int) -> None:
        for _ in range(rng.randint(0, 3 if depth < 4 else 0)):
            free = [s for s in stats if id(s) not in opened]
            if len(free) < 2:
                return
            s = rng.choice(free)
            kind = rng.random()
            if kind < 0.1:  # raises inside; caught here
                try:
                    with s:
                        raise Boom("inside")
                except Boom as exc:
                    events.append(("caught", str(exc)))
            elif kind < 0.2:  # by hand, the outer one exited first (connector pipelines)
                outer, inner = rng.sample(free, 2)
                events.append(("yields", outer.__enter__() is outer))
                inner.__enter__()
                outer.__exit__(None, None, None)
                opened.add(id(inner))
                block(depth + 1)
                opened.discard(id(inner))
                inner.__exit__(None, None, None)
            elif kind < 0.25:  # RLlib's own __exit__ raises: the block still ends
                s.raise_on_push = True
                try:
                    with s:
                        opened.add(id(s))
                        block(depth + 1)
                        opened.discard(id(s))
                except Boom as exc:
                    events.append(("rllib raised", str(exc)))
                s.raise_on_push = False
            elif kind < 0.3:  # keyword arguments (the pure exit)
                s.__enter__()
                s.__exit__(exc_type=None, exc_value=None, tb=None)
            else:
                with s as entered:
                    events.append(("yields", entered is s))
                    opened.add(id(s))
                    block(depth + 1)
                    opened.discard(id(s))

    def untimed_then_block() -> None:
        unnamed = stats[-1]  # exits a stats object it never timed: nothing to end here
        unnamed.__enter__()
        unnamed.__exit__(None, None, None)
        block(0)

    def run() -> list[Any]:
        block(0)
        in_turn([untimed_then_block, lambda: block(0)])
        block(0)
        return stats

    return run


def run_on(cls: type, compiled: bool, workload: Callable[[list[Any]], Callable[[], list[Any]]],
           tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / ("compiled" if compiled else "pure")
    events: list[Any] = []
    recorder.reset_for_tests()
    cls.clock.now = 0.0  # type: ignore[attr-defined]
    rllib._failed.clear()  # each failure is reported once per process: once per run here
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("otel_rl").addHandler(handler)
    try:
        with capture_spans(output_dir=str(out)) as captured:
            assert rllib._use_accelerator_for(cls, compiled) is compiled
            assert rllib.accelerated() is compiled
            stats = workload(events)()
    finally:
        logging.getLogger("otel_rl").removeHandler(handler)
        rllib._use_accelerator_for(cls, recorder.accelerator_on())
    return {
        "events": events,
        "warned": [w for w in warned if "RLlib" in w],
        # (what RLlib pushed, the starts it kept: a push that raised leaves its start behind)
        "stats": [(s.values, sorted(s._start_times.values())) for s in stats],
        "spans": spans_of(captured),
        "timers.json": json.loads((out / "timers.json").read_text()),
    }


def compare(cls: type, workload: Callable[[list[Any]], Callable[[], list[Any]]],
            tmp_path: Path) -> dict[str, Any]:
    compiled = run_on(cls, True, workload, tmp_path)
    pure = run_on(cls, False, workload, tmp_path)
    assert compiled["events"] == pure["events"]
    assert compiled["warned"] == pure["warned"]
    assert compiled["stats"] == pure["stats"]
    assert compiled["spans"] == pure["spans"]
    assert compiled["timers.json"].get("children") == pure["timers.json"].get("children")
    return compiled


@pytest.mark.parametrize("seed", range(16))
def test_random_workloads_give_the_same_spans_timers_json_and_rllib_numbers(
        patched: type, seed: int, tmp_path: Path) -> None:
    result = compare(patched, lambda events: program(patched, seed, events), tmp_path)
    names = {s[0] for s in result["spans"]}
    assert names & set(NAMES), "the workload made RLlib blocks"
    assert result["warned"] == [], "nothing failed"
    assert any(values for values, _ in result["stats"]), "RLlib's own numbers were pushed"


def test_an_outer_stats_object_exited_first_still_nests(patched: type, tmp_path: Path) -> None:
    def workload(events: list[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            outer, inner, after = patched(), patched(), patched()
            outer._otel_rl_block, inner._otel_rl_block = "pipeline", "connector"
            after._otel_rl_block = "after"
            outer.__enter__()
            inner.__enter__()
            outer.__exit__(None, None, None)  # before the block opened inside it
            inner.__exit__(None, None, None)
            with after:
                pass
            return [outer, inner, after]
        return run

    result = compare(patched, workload, tmp_path)
    children = result["timers.json"]["children"]
    assert set(children) == {"pipeline", "after"}, "back at the root after the pair"
    assert set(children["pipeline"]["children"]) == {"connector"}
    assert [values for values, _ in result["stats"]] == [[2.0], [2.0], [1.0]]


def test_a_failing_block_leaves_rllib_alone_and_is_reported_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __init__(self, name: str) -> None:
            if name == "make":
                raise RuntimeError("cannot make")

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc: object) -> None:
            raise KeyError("cannot exit")

    def workload(events: list[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            made = [patched() for _ in range(3)]
            for s, name in zip(made, ("make", "exit", "make"), strict=True):
                s._otel_rl_block = name
                with s:
                    pass
            events.append(sorted(r.getMessage() for r in caplog.records
                                 if "RLlib timer" in r.getMessage()))
            caplog.clear()
            return made
        return run

    # The timer class the glue makes blocks with, broken on both paths (taken when patched).
    monkeypatch.setattr("otel_rl.timers.hierarchical_timer", Broken)
    module = stand_in()
    rllib.PATCHES["ray.rllib.utils.metrics.stats.base"](module)
    patched = module.StatsBase  # type: ignore[attr-defined]
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            result = compare(patched, workload, tmp_path)
    finally:
        rllib._stats_classes.pop(patched, None)
    assert result["events"][0] == [
        "otel_rl: RLlib timer end: KeyError('cannot exit'); RLlib runs on without it",
        "otel_rl: RLlib timer start: RuntimeError('cannot make'); RLlib runs on without it"]
    assert [values for values, _ in result["stats"]] == [[1.0], [1.0], [1.0]]


def test_the_accelerator_setting_switches_the_glue(patched: type) -> None:
    try:
        assert recorder.use_accelerator(False) is False
        assert not rllib.accelerated()
        assert patched.__enter__ is rllib._stats_classes[patched][2]
        recorder.use_accelerator(True)
        assert rllib.accelerated() is (accel.compiled() is not None)
    finally:
        recorder.use_accelerator(accel.wanted())


def test_rllibs_own_methods_stay_its_own_where_their_source_is_not_the_one_copied(
        patched: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled copy of RLlib's own ``__enter__``/``__exit__`` (`_hotpath.rllib_stats`)
    replaces RLlib's Python ones only for the sources it was written after (RLlib 2.60: the
    Ray venv's test runs it against them). The stand-in's methods read otherwise, so the glue
    keeps calling them; with the sources read as the copied ones, a TensorFlow module in the
    stats module keeps them too."""
    ema = types.ModuleType("ray.rllib.utils.metrics.stats.ema")

    class EmaStats(patched):  # type: ignore[valid-type, misc]
        def push(self, value: float) -> None:
            super().push(value)

    ema.StatsBase, ema.EmaStats, ema.tf = patched, EmaStats, None  # type: ignore[attr-defined]
    ema.safe_isnan = lambda value: value != value  # type: ignore[attr-defined]
    assert rllib.compiled_own(ema) is None
    rllib.PATCHES["ray.rllib.utils.metrics.stats.ema"](ema)
    assert patched not in rllib._compiled_own
    enter, exit_ = rllib.own_methods(patched)[:2]
    read_as = {enter: "StatsBase.__enter__", exit_: "StatsBase.__exit__",
               EmaStats.__dict__["push"]: "EmaStats.push", ema.safe_isnan: "safe_isnan"}
    monkeypatch.setattr(rllib, "_source_digest", lambda f: rllib.OWN_SOURCES[read_as[f]])
    copied = rllib.compiled_own(ema)
    assert (copied is not None) is (accel.compiled() is not None)
    ema.tf = types.ModuleType("tensorflow")  # type: ignore[attr-defined]
    assert rllib.compiled_own(ema) is None


def logger_stand_in(key_ins: list[Any]) -> types.ModuleType:
    """A module shaped like ``ray.rllib.utils.metrics.metrics_logger`` (its ``log_time`` path:
    the lock, `force_tuple`, `tree.flatten`, the three lookups); `key_ins` gets every key
    ``_key_in_stats`` is asked about."""
    module = types.ModuleType("ray.rllib.utils.metrics.metrics_logger")
    tree = types.ModuleType("tree")
    tree.flatten = lambda s: list(s) if isinstance(s, (tuple, list)) else [s]  # type: ignore[attr-defined]

    def force_list(elements: Any = None, to_tuple: bool = False) -> Any:
        return tuple(elements) if to_tuple else list(elements)

    class _DummyRLock:
        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

    class MetricsLogger:
        def __init__(self) -> None:
            self.stats: dict[str, Any] = {}
            self._threading_lock: Any = _DummyRLock()

        def log_time(self, key: Any, *, reduce: str = "ema") -> Any:
            self._maybe_create_stats_object(key, reduce=reduce)
            return self._get_key(key)

        def _maybe_create_stats_object(self, key: Any, *, reduce: str) -> None:
            with self._threading_lock:
                if not self._key_in_stats(key):
                    self._set_key(key, types.SimpleNamespace(reduce=reduce))

        def _key_in_stats(self, flat_key: Any) -> bool:
            key_ins.append(flat_key)
            node = self.stats
            for part in module.force_tuple(module.tree.flatten(flat_key)):
                if part not in node:
                    return False
                node = node[part]
            return True

        def _get_key(self, flat_key: Any) -> Any:
            node = self.stats
            for part in module.force_tuple(module.tree.flatten(flat_key)):
                node = node[part]
            return node

        def _set_key(self, flat_key: Any, stats: Any) -> None:
            parts = module.force_tuple(module.tree.flatten(flat_key))
            node = self.stats
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = stats

    module.MetricsLogger, module._DummyRLock, module.tree = MetricsLogger, _DummyRLock, tree  # type: ignore[attr-defined]
    module.force_tuple = functools.partial(force_list, to_tuple=True)  # type: ignore[attr-defined]
    return module


@pytest.mark.skipif(accel.compiled() is None, reason="the compiled hot path is not built here")
def test_rllibs_log_time_is_copied_only_where_it_reads_as_the_copied_one_and_hands_on_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled copy of RLlib's ``MetricsLogger.log_time`` (`_hotpath.rllib_log_time`)
    replaces RLlib's only for the sources it was written after (RLlib 2.60: the Ray venv's test
    runs it against them); where it is installed it answers a held key itself and hands every
    call it does not cover to RLlib's function, and it follows the accelerator setting."""
    key_ins: list[Any] = []
    module = logger_stand_in(key_ins)
    cls = module.MetricsLogger  # type: ignore[attr-defined]
    own = cls.log_time
    assert rllib.compiled_log_time(module, own) is None  # the stand-in reads otherwise
    lock = module._DummyRLock  # type: ignore[attr-defined]
    read_as = {own: "MetricsLogger.log_time",
               cls._maybe_create_stats_object: "MetricsLogger._maybe_create_stats_object",
               cls._key_in_stats: "MetricsLogger._key_in_stats",
               cls._get_key: "MetricsLogger._get_key", lock.__enter__: "_DummyRLock.__enter__",
               lock.__exit__: "_DummyRLock.__exit__",
               module.force_tuple.func: "force_list",  # type: ignore[attr-defined]
               module.tree.flatten: "tree.flatten"}  # type: ignore[attr-defined]
    monkeypatch.setattr(rllib, "_source_digest",
                        lambda f: rllib.LOG_TIME_SOURCES[read_as[f]])
    rllib.PATCHES["ray.rllib.utils.metrics.metrics_logger"](module)
    try:
        compiled = cls.__dict__["log_time"]
        assert compiled is not own and rllib._loggers[cls] == (own, compiled)
        logger = cls()
        made = logger.log_time(("timers", "a"))  # not held: RLlib's function creates it
        assert key_ins == [("timers", "a")] and made._otel_rl_block == "a"
        for key, held in ((("timers", "a"), made), ("timers", logger.stats["timers"])):
            del key_ins[:]  # held (a dict is a value too): answered without RLlib's lookup
            assert logger.log_time(key) is held and key_ins == []

        def handed_on(logger: Any, key: Any = ("timers", "a"), **kwargs: Any) -> bool:
            del key_ins[:]
            assert logger.log_time(key, **kwargs) is own(logger, key, **kwargs)
            return len(key_ins) == 2  # once by the call, once by `own` above

        assert handed_on(logger, reduce="ema")  # keyword arguments
        assert handed_on(logger, ["timers", "a"])  # a list: what `tree.flatten` makes of it
        assert handed_on(logger, ("timers", 1)) and handed_on(logger, ())
        for key, kwargs in ((("timers", "a", "b"), {}),  # under a stats object
                            (("timers", "a"), {"nope": 1})):  # an unknown keyword
            del key_ins[:]
            with pytest.raises(TypeError):  # RLlib's own error, from RLlib's function
                logger.log_time(key, **kwargs)
            assert key_ins == ([key] if not kwargs else [])
        other = cls()
        other._threading_lock = threading.RLock()
        other.log_time("x")
        assert handed_on(other, "x")
        shadowed = cls()
        shadowed.log_time("x")
        shadowed._get_key = functools.partial(cls._get_key, shadowed)
        assert handed_on(shadowed, "x")

        class Sub(cls):  # type: ignore[valid-type, misc]
            def _key_in_stats(self, flat_key: Any) -> bool:
                return bool(super()._key_in_stats(flat_key))

        sub = Sub()
        sub.log_time("x")
        assert handed_on(sub, "x")
        tree, flatten = module.tree, module.tree.flatten  # type: ignore[attr-defined]
        other_tree = types.ModuleType("tree")
        other_tree.flatten = flatten  # type: ignore[attr-defined]
        for target, name, same_but_another in (
                (module, "tree", other_tree), (tree, "flatten", lambda s: flatten(s)),
                (module, "force_tuple", functools.partial(module.force_tuple.func,  # type: ignore[attr-defined]
                                                          to_tuple=True))):
            with monkeypatch.context() as patch:  # another object there: RLlib's function
                patch.setattr(target, name, same_but_another)
                assert handed_on(logger)
        assert recorder.use_accelerator(False) is False
        assert cls.__dict__["log_time"] is own
        recorder.use_accelerator(True)
        assert cls.__dict__["log_time"] is compiled
    finally:
        recorder.use_accelerator(accel.wanted())
        rllib._loggers.pop(cls, None)
