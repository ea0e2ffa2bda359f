"""The `Sink` type every destination of the export pipeline implements, and `Stats`."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence

from otel_rl._internal import log
from otel_rl._internal.otlp.records import Batch

__all__ = ["Sink", "Stats", "chunk_batches", "span_count"]


class Sink(ABC):
    """Where batches of span records go. `export` and `shutdown` never raise: a failure is
    logged once (`Stats.warn_once`) and the spans it cost are counted as dropped."""

    #: Names the sink in `Stats.exported`.
    name: str

    @abstractmethod
    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        """Deliver `batches`, giving up (and counting) at `deadline` (time.monotonic())."""

    @abstractmethod
    def shutdown(self, deadline: float) -> None:
        """Release what the sink holds; nothing is exported after this."""


class Stats:
    """What happened to spans, by outcome; `dropped` maps a reason to a count."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exported: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self._warned: set[str] = set()

    def add_exported(self, sink: str, n: int) -> None:
        with self.lock:
            self.exported[sink] = self.exported.get(sink, 0) + n

    def add_dropped(self, reason: str, n: int) -> None:
        if n <= 0:
            return
        with self.lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def warn_once(self, key: str, message: str) -> None:
        with self.lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("otel_rl: %s", message)


def span_count(batches: Sequence[Batch]) -> int:
    """How many span records `batches` hold."""
    return sum(len(b.records) for b in batches)


def chunk_batches(batches: Sequence[Batch], size: int) -> list[list[Batch]]:
    """Split batches into requests of at most `size` spans (gRPC's 4 MiB default limit)."""
    requests: list[list[Batch]] = []
    current: list[Batch] = []
    room = size
    for batch in batches:
        records = batch.records
        start = 0
        while start < len(records):
            take = records[start:start + room]
            current.append(Batch(batch.resource, batch.offset_ns, take, batch.thread_names))
            start += len(take)
            room -= len(take)
            if room == 0:
                requests.append(current)
                current, room = [], size
    if current:
        requests.append(current)
    return requests
