"""`SinkQueue`: one sink's own bounded queue, thread and deadlines.

The pipeline's flusher hands every drained flush to each sink's queue and returns at once, so
the spans file never waits behind a slow or dead collector. Each queue is bounded by spans:
what does not fit is lost for that sink only ("buffer full", in the ledger). Shutdown gives
every queue the same deadline; what a queue still holds then (or a send still in flight) is
lost as "timed out", the blocked send is woken (`Sink.abort`), and the sink's account is
closed so a late answer cannot count twice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.sinks.base import Sink, Stats, span_count
from otel_rl._internal.threads import Daemon, start_daemon, stopping

__all__ = ["SinkQueue"]


class SinkQueue:
    """Feeds one `Sink` from a thread of its own; `put` never blocks."""

    def __init__(self, sink: Sink, stats: Stats, max_spans: int, export_timeout: float) -> None:
        self.sink = sink
        self.name = sink.name
        self._stats = stats
        self._ledger = stats.ledger
        self._ledger.add_sink(sink.name, sink.label or sink.name)
        self.max_spans = max_spans
        self.export_timeout = export_timeout
        self._items: deque[tuple[list[Batch], int]] = deque()
        self._spans = 0
        self._busy = 0
        self._cond = threading.Condition()
        self._stop = False
        #: No export may run past this (set by `close`).
        self._cap = float("inf")
        self._thread: Daemon | None = None
        #: Takes nothing new (a relay whose parent is gone); what it holds still goes out.
        self.retired = False

    def start(self) -> None:
        """Start (or, after a stop, restart) the sink's thread; what a stop left queued is
        exported by the new thread."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = False
            self._cap = float("inf")
        try:
            self.sink.limit(float("inf"))
        except Exception:
            pass
        self._thread = start_daemon(f"otel_rl-sink-{self.name}", self._loop, wake=self._wake)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def put(self, batches: Sequence[Batch]) -> None:
        n = span_count(batches)
        if n == 0 or self.retired:
            return
        self._ledger.offered(self.name, n)
        with self._cond:
            if self._spans + n > self.max_spans:
                full = True
            else:
                full = False
                self._items.append((list(batches), n))
                self._spans += n
                self._cond.notify_all()
        if full:
            self._stats.add_dropped("buffer full", n, self.name,
                                    f"{self.name}: its queue of {self.max_spans} spans was full")

    def export_now(self, batches: Sequence[Batch], deadline: float) -> None:
        """Offer `batches` and export them in the calling thread (shutdown has stopped this
        queue's thread already)."""
        n = span_count(batches)
        if n:
            self._ledger.offered(self.name, n)
            self._export(list(batches), n, deadline)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stop and not stopping():
                    self._cond.wait(1.0)
                if stopping():  # a fork: `threads` starts this loop again after it
                    return
                if self._stop and (not self._items or time.monotonic() >= self._cap):
                    self._cond.notify_all()
                    return  # stopped: nothing left, or the rest waits for a restart
                batches, n = self._items.popleft()
                self._busy = n
            try:
                self._export(batches, n)
            finally:
                with self._cond:
                    self._spans -= n
                    self._busy = 0
                    self._cond.notify_all()

    def _export(self, batches: list[Batch], n: int, deadline: float | None = None) -> None:
        if deadline is None:
            deadline = min(time.monotonic() + self.export_timeout, self._cap)
        if deadline <= time.monotonic():
            return  # past shutdown's deadline: `close` counts it
        try:
            self.sink.export(batches, deadline)
        except Exception as exc:  # Sinks never raise; a bug costs this batch, counted
            self._stats.warn_once(f"sink-{self.name}-{type(exc).__name__}",
                                  f"{self.name} failed: {exc!r}")

    def idle(self, deadline: float) -> bool:
        """Wait until everything put so far went through the sink (or `deadline`)."""
        with self._cond:
            while self._items or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def stop(self, deadline: float) -> None:
        """Ask the thread to export what is queued until `deadline`, then return (at once
        with a deadline now: before a fork, say; `start` resumes with what is left)."""
        with self._cond:
            self._cap = deadline
            self._stop = True
            self._cond.notify_all()
        try:
            self.sink.limit(deadline)  # a send under way (a collector backing off) too
        except Exception:
            pass

    def close(self, deadline: float, shutdown_s: float) -> None:
        """After `stop`: wait for the thread until `deadline`; what is left then is lost
        ("timed out"); release the sink unless a send is still stuck in it."""
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = thread is not None and thread.is_alive()
        try:  # before `abort`, whose failure would look like the collector's
            trouble = self.sink.failing()
        except Exception:
            trouble = None
        reason, last = trouble or ("timed out", "")
        if stuck:  # a request written whole, its answer cut off: the collector may have it
            try:
                sent = self.sink.unanswered()
            except Exception:
                sent = 0
        else:
            sent = 0
        if reason == "unconfirmed":  # the rest was never sent
            reason = "timed out"
        # Settled (closed) first: what the woken send reports afterwards no longer counts.
        self._ledger.settle(self.name, reason,
                            f"{self.name}: not sent by the shutdown deadline ({shutdown_s:g} s)"
                            + (f"; last failure: {last}" if last else ""), unconfirmed=sent)
        if stuck:
            try:
                self.sink.abort()  # wake the blocked send
            except Exception:
                pass
        with self._cond:
            self._items.clear()
            self._spans = 0
        if not stuck:
            try:
                self.sink.shutdown(deadline)
            except Exception:
                pass
