"""The `Sink` type every destination of the export pipeline implements, and `Stats`."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence

from otel_rl._internal import log
from otel_rl._internal.ledger import Ledger
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

    #: Shown with the sink's name in the exit line (an endpoint, a file).
    label: str = ""

    def abort(self) -> None:
        """Wake an `export` blocked past shutdown's deadline (close its connection); called
        from another thread, so it must not wait for a lock `export` holds."""
        return

    def limit(self, deadline: float) -> None:
        """From another thread: sends under way must end by `deadline` (shutdown began)."""
        return

    def unanswered(self) -> int:
        """From another thread: spans sent and awaiting the receiver's answer right now."""
        return 0

    def failing(self) -> tuple[str, str] | None:
        """The sink's current trouble as (ledger reason, one line), None if none is known:
        what shutdown could not send is lost for that reason ("unreachable" while the
        collector is down) rather than merely "timed out"."""
        return None


class Stats:
    """What happened to spans, by outcome: `exported` per sink, `dropped` per "sink: reason",
    and the `ledger` (per sink, by reason; see `otel_rl._internal.ledger`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exported: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.ledger = Ledger()
        self._warned: set[str] = set()

    def add_exported(self, sink: str, n: int) -> None:
        with self.lock:
            self.exported[sink] = self.exported.get(sink, 0) + n
        self.ledger.delivered(sink, n)

    def sending(self, sink: str, n: int, at: tuple[int, int] = (0, 0)) -> None:
        """`n` spans are being written to `sink` now (at bytes `at` of a file; see
        `Ledger.sending`)."""
        self.ledger.sending(sink, n, at)

    def add_dropped(self, reason: str, n: int, sink: str | None = None,
                    detail: str = "") -> None:
        """`n` spans did not reach `sink` (None: any sink) for `reason` (`ledger.REASONS`)."""
        if n <= 0:
            return
        with self.lock:
            key = reason if sink is None else f"{sink}: {reason}"
            self.dropped[key] = self.dropped.get(key, 0) + n
        self.ledger.lost(reason, n, sink, detail)

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
