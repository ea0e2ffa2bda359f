"""A sink's own queue and thread: stops when asked, restarts with what it holds, and its
ledger adds up (the thread contract of common.md; issue 16)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from otel_rl._internal.ledger import Ledger
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.sinks.base import Sink, Stats
from otel_rl._internal.sinks.file import FileSink
from otel_rl._internal.sinks.queue import SinkQueue
from tests.faults.helpers import file_spans


def batch(n: int) -> list[Batch]:
    records = [(i + 1, 0, "b", 1_000 + i, 2_000 + i, 1, 7, None) for i in range(n)]
    return [Batch({"service.name": "q"}, 0, records, {1: "main"})]  # type: ignore[arg-type]


class Gate(Sink):
    """A sink that waits on an event before each export (a collector that stalls)."""

    name = "gate"

    def __init__(self, stats: Stats) -> None:
        self.open = threading.Event()
        self.stats = stats

    def export(self, batches: list[Batch], deadline: float) -> None:  # type: ignore[override]
        self.open.wait(max(0.0, deadline - time.monotonic()))
        if self.open.is_set():
            self.stats.add_exported(self.name, sum(len(b.records) for b in batches))

    def shutdown(self, deadline: float) -> None:
        pass


def test_stop_now_keeps_the_queue_and_start_resumes(tmp_path: Path) -> None:
    stats = Stats()
    sink = FileSink(str(tmp_path / "s.jsonl"), stats)
    queue = SinkQueue(sink, stats, max_spans=10_000, export_timeout=10)
    queue.stop(time.monotonic())  # stopped before it ever ran (as before a fork)
    queue.start()
    queue.stop(time.monotonic())
    queue._thread.join(5)  # type: ignore[union-attr]
    assert not queue._thread.is_alive()  # type: ignore[union-attr]
    queue.put(batch(5))  # queued while stopped: kept
    queue.start()
    assert queue.idle(time.monotonic() + 10)
    queue.stop(time.monotonic() + 5)
    queue.close(time.monotonic() + 5, 5)
    assert len(file_spans(tmp_path / "s.jsonl")) == 5
    totals = stats.ledger.totals()["file"]
    assert totals["delivered"] == totals["recorded"] == 5 and totals["lost"] == {}


def test_stuck_sink_is_settled_at_the_deadline_and_a_late_answer_does_not_count() -> None:
    stats = Stats()
    gate = Gate(stats)
    queue = SinkQueue(gate, stats, max_spans=100, export_timeout=60)
    queue.start()
    queue.put(batch(30))
    queue.put(batch(30))
    queue.put(batch(50))  # over the bound of 100 spans: buffer full, for this sink only
    queue.stop(time.monotonic())
    queue.close(time.monotonic() + 0.2, 0.2)
    gate.open.set()  # the stuck export now "succeeds": too late to count
    time.sleep(0.2)
    totals = stats.ledger.totals()["gate"]
    assert totals["recorded"] == 110
    assert totals["delivered"] == 0
    assert totals["lost"] == {"buffer full": 50, "timed out": 60}


def test_ledger_line_names_each_sink() -> None:
    ledger = Ledger()
    ledger.add_sink("otlp", "http://c:4318")
    ledger.add_sink("file", "/x/spans.otlp.jsonl")
    for name in ("otlp", "file"):
        ledger.offered(name, 10)
    ledger.delivered("file", 10)
    ledger.lost("unreachable", 10, "otlp", "refused")
    ledger.lost("buffer full", 3)  # before the sinks: lost for both
    line = ledger.line()
    assert line == ("13 span(s) were not exported: otlp http://c:4318: 13 of 13 lost "
                    "(buffer full 3, unreachable 10); file /x/spans.otlp.jsonl: 3 of 13 lost "
                    "(buffer full 3) [refused]")
