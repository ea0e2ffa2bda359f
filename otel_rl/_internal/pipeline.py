"""The bounded buffer, the background flusher, and one queue per sink.

The hot path appends records to `Pipeline.buffer` (a deque bounded by `recorder.buffer_cap`);
worker processes' records arrive as ready `Batch`es in `Pipeline.relayed`. A daemon thread
drains both every `flush_interval` seconds (sooner when the buffer is half full) and hands the
batches to every sink's own `SinkQueue` (its thread, its bound, its deadline), so a slow or
dead collector never holds up the spans file or timers.json. Sinks never raise into the
pipeline's caller: a failure is logged once and what it cost goes into the ledger.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.otlp.rows import Rows
from otel_rl._internal.record import Record
from otel_rl._internal.shapes import Attributes
from otel_rl._internal.sinks.base import Sink, Stats
from otel_rl._internal.sinks.queue import SinkQueue
from otel_rl._internal.threads import Daemon, start_daemon, stopping

__all__ = ["PACK_RECORDS", "Packer", "Pipeline"]

#: A packing pipeline lays out its buffer about every this many records (`Pipeline.pack`):
#: under CPython's free list of 2,000 tuples of a size, so the records' tuples are reused.
PACK_RECORDS = 1000
#: ... and at most this often (seconds), however fast blocks come.
PACK_MIN_INTERVAL = 0.02


class Packer(Protocol):
    """Where a relaying worker's records (or those a process's windows take) go between
    flushes (`relay_columns.Packs`)."""

    count: int

    def add(self, records: Sequence[Record]) -> None: ...

    def take(self) -> Rows | None: ...


class Pipeline:
    """Drains records into batches and hands them to the sinks, off the training thread."""

    def __init__(self, *, resource: Attributes, offset_ns: int,
                 thread_names: dict[int, str], sinks: Sequence[Sink], stats: Stats,
                 flush_interval: float, max_relayed: int,
                 on_flush: Callable[[float], None] | None = None,
                 transform: Callable[[list[Batch], bool], list[Batch]] | None = None,
                 after_flush: Callable[[], None] | None = None) -> None:
        self.buffer: deque[Record] = deque()
        #: Records taken from `buffer` so far (a relaying worker reports it to its parent).
        self.drained = 0
        self.relayed: deque[Batch] = deque()
        self.resource = resource
        self.offset_ns = offset_ns
        self.thread_names = thread_names
        self.sinks = sinks
        self.stats = stats
        self.flush_interval = flush_interval
        self.max_relayed = max_relayed
        self.on_flush = on_flush
        # The `auto` policy's windows (`windows.Windower.process_now`), and what to do once a
        # flush has been exported (write the timers.json of the aggregate just sent).
        self.transform = transform
        self.after_flush = after_flush
        #: One queue and thread per sink, bounded like the hot path's buffer.
        self.queues = [SinkQueue(sink, stats, max(max_relayed * 64, 1024),
                                 max(flush_interval * 5, 10.0)) for sink in sinks]
        self._final = False
        self.deadline = 0.0
        self.wake = threading.Event()
        self._stop = False
        self._flush_lock = threading.Lock()
        #: Held while a hand-off puts a flush into the queues and while `reroute` swaps them.
        self._put_lock = threading.Lock()
        self._thread: Daemon | None = None
        self._next_flush = 0.0
        #: Set where records leave in frames or go through windows: the flush lays the
        #: buffer out in the relay's columns and sends what it packed as one batch.
        self.packs: Packer | None = None
        #: And between flushes too, every ~`PACK_RECORDS` records (`pack`), not held as tuples
        #: until the flush: a relaying worker's flusher wakes to. A main process packs in the
        #: thread whose block fills the buffer (`pack_full`, the recorder's `on_full`): no
        #: wakes of its flusher, each taking the GIL from the training's threads.
        self.pack_between = False
        self._next_pack = 0.0
        self._packed_at = 0.0
        self._pack_interval = 0.05  # seconds: what the last pack measured (a first guess)
        #: Records a pack could not lay out (the relay's writer raised): sent as they are.
        self._unpacked: list[Record] = []

    def start(self) -> None:
        """Start the flusher and the sinks' threads (a sink's queue stopped by a shutdown
        starts again; across a fork `threads` stops and restarts them all)."""
        for queue in self.queues:
            queue.start()
        if self._thread is None:
            self._next_flush = time.monotonic() + self.flush_interval
            self._packed_at = time.monotonic()
            self._next_pack = self._packed_at + self._pack_interval
            self._thread = start_daemon("otel_rl-flush", self._loop, wake=self.wake.set)

    def add_relayed(self, batch: Batch) -> None:
        if len(self.relayed) >= self.max_relayed:
            self.stats.add_dropped("buffer full", len(batch.records), None,
                                   f"relay buffer of {self.max_relayed} batches was full")
            return
        self.relayed.append(batch)

    def reroute(self, retire: Sequence[SinkQueue], add: Sequence[SinkQueue]) -> None:
        """From now on the queues `retire` take nothing new (what they hold still goes out)
        and `add` take every flush: both at once between two hand-offs, so a flush is never
        put into neither or into both (a relaying worker whose parent died)."""
        with self._put_lock:
            for queue in retire:
                queue.retired = True
            self.queues.extend(add)

    def _loop(self) -> None:
        # Stopped for every fork and started again after it (`threads`): the schedule lives
        # in `_next_flush`, so a program forking more often than `flush_interval` still flushes.
        while not self._stop:
            due = self._next_flush
            packing = self.packs is not None and self.pack_between
            if packing:
                due = min(due, self._next_pack)
            woken = self.wake.wait(max(0.0, due - time.monotonic()))
            self.wake.clear()
            if self._stop or stopping():
                break
            if not woken and packing and time.monotonic() < self._next_flush:
                self.pack()
                continue
            self._next_flush = time.monotonic() + self.flush_interval
            self.flush(time.monotonic() + max(self.flush_interval * 5, 10.0), wait=False)

    def pack(self) -> None:
        """Lay out what the buffer holds now (`packs`), and schedule the next pack for about
        `PACK_RECORDS` more records at the rate they came since the last one (a worker that
        records little packs only at its flushes)."""
        packs = self.packs
        if packs is None:
            return
        with self._flush_lock:
            now = time.monotonic()
            taken = self._pack_buffer(packs)
            # At most twice the last wait: a quiet moment does not put packing off to the flush.
            rate = taken / max(now - self._packed_at, 1e-3)
            self._pack_interval = max(PACK_MIN_INTERVAL, min(
                PACK_RECORDS / max(rate, 1e-9), 2 * self._pack_interval, self.flush_interval))
            self._packed_at = now
            self._next_pack = now + self._pack_interval

    def pack_full(self, sink: object) -> None:
        """The recorder's `on_full`: a block's record left `sink` holding more than
        `PACK_RECORDS` records; if it is this buffer, the recording thread (never the main
        thread: `recorder.full_skip`) lays them out now (so they live ~1,000 records as tuples,
        under CPython's free list, and never count towards a collection), unless a flush or
        pack is under way (it takes them) or the pipeline is shutting down (its last flush
        takes them)."""
        packs = self.packs
        if (sink is not self.buffer or packs is None or self._stop
                or not self._flush_lock.acquire(False)):
            return
        try:
            self._pack_buffer(packs)
        except Exception as exc:  # never let a bug in export reach the training loop
            self.stats.warn_once(f"pack-{type(exc).__name__}", f"packing failed: {exc!r}")
        finally:
            self._flush_lock.release()

    def _pack_buffer(self, packs: Packer) -> int:
        """Lay out what the buffer holds now (the flush lock held); how many records."""
        records = self._take()
        if records:
            self._pack_into(packs, records)
        return len(records)

    def _pack_into(self, packs: Packer, records: list[Record]) -> None:
        try:
            packs.add(records)
        except Exception as exc:  # records the relay cannot lay out: sent as they are
            self._unpacked.extend(records)
            self.stats.warn_once(f"pack-{type(exc).__name__}", f"packing failed: {exc!r}")

    def _take(self) -> list[Record]:
        """The buffer's records now, less those of GPU-timed blocks still waiting."""
        records = []
        pop = self.buffer.popleft
        try:
            for _ in range(len(self.buffer)):
                records.append(pop())
        except IndexError:
            pass
        self.drained += len(records)  # the ledger counts per flush, not per block
        gpu = sys.modules.get("otel_rl._internal.gpu")  # loaded only if a block asked for it
        if gpu is not None:
            records = gpu.ready(records)  # spans of GPU-timed blocks wait for their GPU time
        return records

    def _drain(self) -> list[Batch]:
        records = self._take()
        batches = []
        packs = self.packs
        if packs is not None:
            if records:
                self._pack_into(packs, records)
            packed = packs.take()
            self._packed_at = time.monotonic()
            self._next_pack = self._packed_at + self._pack_interval
            if packed:
                batches.append(Batch(self.resource, self.offset_ns, packed,
                                     dict(self.thread_names), packed.columns))
            records, self._unpacked = self._unpacked, []
        if records:
            batches.append(Batch(self.resource, self.offset_ns, records, dict(self.thread_names)))
        pop_batch = self.relayed.popleft
        try:
            for _ in range(len(self.relayed)):
                batches.append(pop_batch())
        except IndexError:
            pass
        return batches

    def flush(self, deadline: float, wait: bool = True) -> None:
        """Hand everything buffered now to the sinks; with `wait`, wait until they took it
        (at most until `deadline`)."""
        self._hand_off(deadline)
        if wait:
            for queue in self.queues:
                queue.idle(deadline)

    def _hand_off(self, deadline: float) -> None:
        with self._flush_lock:
            self.deadline = deadline  # for `after_flush` steps that send too (metrics)
            try:
                if self.on_flush is not None:
                    self.on_flush(deadline)
                batches = self._drain()
                if self.transform is not None:
                    batches = self.transform(batches, self._final)
                if batches:
                    with self._put_lock:
                        for queue in self.queues:
                            queue.put(batches)
                if self.after_flush is not None:
                    self.after_flush()
            except Exception as exc:  # never let a bug in export reach the training loop
                self.stats.warn_once(f"flush-{type(exc).__name__}", f"flush failed: {exc!r}")

    def shutdown(self, deadline: float, timeout: float) -> None:
        """The last hand-off, then every sink finishes by `deadline` in parallel; what is
        not delivered by then is counted ("timed out"), never waited for."""
        self._stop = True
        self.wake.set()
        thread = self._thread
        if thread is not None:  # (not when called from the flush thread itself)
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._flush_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._flush_lock.release()
            self._final = True
            for queue in self.queues:
                queue.start()  # restart one stopped before a fork, say
            self._hand_off(deadline)
        left = (len(self.buffer) + sum(len(b.records) for b in self.relayed)
                + len(self._unpacked))
        self.buffer.clear()
        self.relayed.clear()
        self._unpacked = []
        if self.packs is not None:
            left += self.packs.count
            self.packs.take()
        self.stats.add_dropped("timed out", left, None,
                               f"the flusher was busy past the shutdown deadline ({timeout:g} s)")
        for queue in self.queues:
            queue.stop(deadline)
        for queue in self.queues:
            queue.close(deadline, timeout)
