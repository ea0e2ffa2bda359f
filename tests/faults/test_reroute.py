"""A relaying worker whose parent died swaps its relay's queue for queues of its own while its
flusher keeps handing off (`Pipeline.reroute`, issue 16): every record flushed goes to the
old queue or to the new ones, never to neither (it was lost uncounted) and never to both."""

from __future__ import annotations

import threading
import time

from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.pipeline import Pipeline
from otel_rl._internal.record import SPAN_ID
from otel_rl._internal.sinks.base import Sink, Stats
from otel_rl._internal.sinks.queue import SinkQueue


class Keep(Sink):
    """Keeps the span ids it was given."""

    def __init__(self, name: str, stats: Stats) -> None:
        self.name = self.label = name
        self.stats = stats
        self.ids: list[int] = []

    def export(self, batches: list[Batch], deadline: float) -> None:  # type: ignore[override]
        for b in batches:
            self.ids.extend(int(r[SPAN_ID]) for r in b.records)
        self.stats.add_exported(self.name, sum(len(b.records) for b in batches))

    def shutdown(self, deadline: float) -> None:
        pass


def _flush_until(pipeline: Pipeline, stop: threading.Event, made: list[int]) -> None:
    """The worker's flusher: records made (7 per flush), handed off as fast as it can."""
    while not stop.is_set():
        for _ in range(7):
            made[0] += 1
            pipeline.buffer.append((made[0], 0, "b", 1, 2, 1, 7, None))  # type: ignore[arg-type]
        pipeline.flush(time.monotonic() + 10, wait=False)


def test_a_flush_under_way_goes_to_the_old_queue_or_the_new_ones() -> None:
    for round_ in range(25):
        stats = Stats()
        relay = Keep("relay", stats)
        pipeline = Pipeline(resource={"service.name": "w"}, offset_ns=0, thread_names={},
                            sinks=[relay], stats=stats, flush_interval=3600, max_relayed=1 << 20)
        pipeline.start()
        made = [0]
        stop = threading.Event()
        thread = threading.Thread(target=_flush_until, args=(pipeline, stop, made))
        thread.start()
        time.sleep(0.001 * (round_ % 7))
        own = [Keep("file", stats), Keep("otlp", stats)]
        queues = [SinkQueue(sink, stats, 1 << 30, 10) for sink in own]
        for queue in queues:
            queue.start()
        pipeline.reroute(pipeline.queues[:1], queues)
        time.sleep(0.002)
        stop.set()
        thread.join()
        pipeline.shutdown(time.monotonic() + 10, 10)
        everything = set(range(1, made[0] + 1))
        old = set(relay.ids)
        assert len(old) == len(relay.ids)
        for sink in own:
            assert len(set(sink.ids)) == len(sink.ids)
            assert old.isdisjoint(sink.ids), "a flush went to both"
            assert old | set(sink.ids) == everything, "a flush went to neither"
        totals = stats.ledger.totals()
        assert totals["relay"]["delivered"] == len(old)
        assert totals["file"]["delivered"] == totals["otlp"]["delivered"] == made[0] - len(old)
