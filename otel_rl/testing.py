"""Helpers for testing code that uses otel_rl: capture spans in memory, with deterministic
span/trace ids and a clock that ticks a fixed step per reading.

>>> from otel_rl.testing import capture_spans
>>> from otel_rl.timers import hierarchical_timer
>>> with capture_spans() as captured:
...     with hierarchical_timer("update"):
...         pass
>>> [s.name for s in captured.spans]
['update', 'run', 'otel_rl aggregate']
>>> captured.spans[0].end_ns - captured.spans[0].start_ns
1000

The same is available as the pytest fixture ``otel_rl_capture`` (registered as a pytest
plugin when otel_rl is installed). This module imports without pytest; the fixture is defined
only when pytest is importable.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import otel_rl
from otel_rl._internal import recorder, runtime
from otel_rl._internal.sdk_exporter import TimerTreeExporter
from otel_rl._internal.shapes import TimersDict
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree

__all__ = ["EPOCH_NS", "Captured", "DeterministicClock", "capture_spans"]

#: Where the deterministic clock starts, as Unix epoch nanoseconds (2023-11-14T22:13:20Z).
EPOCH_NS = 1_700_000_000_000_000_000


class DeterministicClock:
    """A stand-in for `time.perf_counter_ns` that advances `step_ns` on every reading."""

    def __init__(self, step_ns: int = 1000) -> None:
        self.step_ns = step_ns
        self._now = 0

    def __call__(self) -> int:
        self._now += self.step_ns
        return self._now


class Captured:
    """What a `capture_spans` block recorded; filled in when the block exits."""

    def __init__(self, exporter: TimerTreeExporter) -> None:
        self._exporter = exporter
        self.spans: list[SpanData] = []

    def _finish(self) -> None:
        self.spans = sorted(self._exporter.spans(), key=lambda s: (s.end_ns, s.span_id))

    def tree(self) -> Tree:
        """The ML-Agents tree rebuilt from the captured spans."""
        return self._exporter.tree()

    def timer_tree(self) -> TimersDict:
        """`tree()` as a timers.json dict."""
        return self._exporter.timer_tree()

    def names(self) -> list[str]:
        return [s.name for s in self.spans]


@contextmanager
def capture_spans(*, deterministic: bool = True, step_ns: int = 1000,
                  **settings: Any) -> Iterator[Captured]:
    """Configure otel_rl to record every block into memory for the ``with`` body.

    With `deterministic`, span ids count up from 1, trace ids likewise, and every clock
    reading advances `step_ns` from `EPOCH_NS`. Extra `settings` go to `otel_rl.configure`
    (``spans`` defaults to ``"all"``; no files are written unless ``output_dir`` is given).
    """
    exporter = TimerTreeExporter()
    previous = None
    if deterministic:
        trace_ids = itertools.count(1)
        previous = recorder.swap_clock_and_ids(DeterministicClock(step_ns), itertools.count(1),
                                               lambda: next(trace_ids))
    settings.setdefault("spans", "all")
    settings.setdefault("propagate", False)
    settings["exporters"] = [*settings.get("exporters", ()), exporter]
    captured = Captured(exporter)
    try:
        otel_rl.configure(**settings)
        if deterministic:
            rt = runtime.active()
            assert rt is not None
            rt.set_epoch_offset(EPOCH_NS)
        yield captured
    finally:
        runtime.shutdown()
        if previous is not None:
            recorder.swap_clock_and_ids(*previous)
        captured._finish()


try:
    import pytest
except ImportError:  # pragma: no cover - exercised by a test in a pytest-less interpreter
    pass
else:
    __all__ += ["otel_rl_capture"]

    @pytest.fixture
    def otel_rl_capture() -> Iterator[Captured]:
        """Every block in the test, captured in memory with deterministic ids and times."""
        with capture_spans() as captured:
            yield captured
