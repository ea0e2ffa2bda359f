"""Bounded buffers, a background flusher, and the sinks records go to.

The hot path appends records to `Pipeline.buffer` (a deque bounded by `recorder.buffer_cap`);
worker processes' records arrive as ready `Batch`es in `Pipeline.relayed`. A daemon thread
drains both every `flush_interval` seconds (sooner when the buffer is half full) and hands the
batches to every sink. Sinks never raise into the pipeline's caller: a failure is logged once
and the spans it cost are counted.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from otel_rl._internal import log, otlp_encode
from otel_rl._internal.otlp_encode import Batch


class Sink(Protocol):
    name: str

    def export(self, batches: Sequence[Batch], deadline: float) -> None: ...

    def shutdown(self, deadline: float) -> None: ...


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


def _count(batches: Sequence[Batch]) -> int:
    return sum(len(b.records) for b in batches)


def _chunks(batches: Sequence[Batch], size: int) -> list[list[Batch]]:
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


class OtlpSink:
    """Sends protobuf requests over an `OtlpTransport`, retrying what is retryable until the
    caller's deadline; what cannot be sent by then is dropped and counted."""

    name = "otlp"

    def __init__(self, transport_factory: Callable[[], Any], batch_size: int, stats: Stats,
                 endpoint: str) -> None:
        self._factory = transport_factory
        self._transport: Any = None
        self._batch_size = batch_size
        self._stats = stats
        self._endpoint = endpoint
        self._encoder = otlp_encode.Encoder()
        self._backoff_until = 0.0
        self._failures = 0
        self._timeout = 10.0

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        from otel_rl._internal.sinks.otlp_transport import ExportError

        pending = _chunks(batches, self._batch_size)
        while pending:
            request = pending.pop(0)
            n = _count(request)
            data = otlp_encode.encode_request(request, self._encoder)
            while True:
                now = time.monotonic()
                if now < self._backoff_until and self._backoff_until < deadline:
                    time.sleep(self._backoff_until - now)
                elif now >= deadline or self._backoff_until >= deadline:
                    self._stats.add_dropped(f"collector unreachable at {self._endpoint}", n)
                    break
                try:
                    if self._transport is None:
                        self._transport = self._factory()
                        self._timeout = self._transport.timeout_s
                    # Never wait on the network past the caller's deadline (shutdown).
                    self._transport.timeout_s = max(0.05, min(self._timeout, deadline - now))
                    self._transport.send(data)
                except ExportError as exc:
                    if exc.too_large and n > 1:  # the receiver's size limit: send it in halves
                        pending[:0] = _chunks(request, (n + 1) // 2)
                        break
                    if exc.retryable:
                        self._failures += 1
                        delay = (exc.retry_after_s if exc.retry_after_s is not None
                                 else min(5.0, 0.25 * 2 ** self._failures))
                        self._backoff_until = time.monotonic() + delay
                        self._stats.warn_once(f"otlp-retry-{self._endpoint}",
                                              f"cannot export to {self._endpoint} ({exc}); retrying")
                        continue
                    self._stats.add_dropped(f"rejected by {self._endpoint}: {exc}", n)
                    self._stats.warn_once(f"otlp-reject-{self._endpoint}",
                                          f"{self._endpoint} rejected spans: {exc}")
                    break
                except Exception as exc:  # a transport bug must not reach training code
                    self._stats.add_dropped(f"export error: {type(exc).__name__}", n)
                    self._stats.warn_once(f"otlp-error-{type(exc).__name__}",
                                          f"export to {self._endpoint} failed: {exc!r}")
                    break
                else:
                    self._failures = 0
                    self._backoff_until = 0.0
                    self._stats.add_exported(self.name, n)
                    break

    def shutdown(self, deadline: float) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            try:
                transport.close()
            except Exception:
                pass


class FileSink:
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per line (the Collector's file
    exporter format), so the file can be replayed or turned back into a tree."""

    name = "file"

    def __init__(self, path: str, stats: Stats) -> None:
        self.path = path
        self._stats = stats
        self._file: Any = None
        self._encoder = otlp_encode.JsonEncoder()

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        n = _count(batches)
        if n == 0:
            return
        try:
            if self._file is None:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")
            line = self._encoder.request_line(batches)
            self._file.write(line + "\n")
            self._file.flush()
            self._stats.add_exported(self.name, n)
        except Exception as exc:
            self._stats.add_dropped(f"cannot write {self.path}", n)
            self._stats.warn_once(f"file-{self.path}", f"cannot write spans to {self.path}: {exc}")

    def shutdown(self, deadline: float) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except Exception:
                pass


class SpanExporterSink:
    """Feeds a standard OTel `SpanExporter` with SDK `ReadableSpan`s made from the records."""

    def __init__(self, exporter: Any, stats: Stats) -> None:
        self.exporter = exporter
        self.name = f"exporter:{type(exporter).__name__}"
        self._stats = stats

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        from otel_rl._internal.sdk_spans import to_readable_spans

        n = _count(batches)
        if n == 0:
            return
        try:
            result = self.exporter.export(to_readable_spans(batches))
            ok = getattr(result, "name", "SUCCESS") == "SUCCESS"
        except Exception as exc:
            self._stats.warn_once(f"exporter-{id(self.exporter)}",
                                  f"{type(self.exporter).__name__}.export raised {exc!r}")
            ok = False
        if ok:
            self._stats.add_exported(self.name, n)
        else:
            self._stats.add_dropped(f"{type(self.exporter).__name__} failed", n)

    def shutdown(self, deadline: float) -> None:
        try:
            self.exporter.force_flush(max(0, int((deadline - time.monotonic()) * 1000)))
        except Exception:
            pass
        try:
            self.exporter.shutdown()
        except Exception:
            pass


class Pipeline:
    """Drains records into batches and hands them to the sinks, off the training thread."""

    def __init__(self, *, resource: dict[str, Any], offset_ns: int, thread_names: dict[int, str],
                 sinks: list[Any], stats: Stats, flush_interval: float, max_relayed: int,
                 on_flush: Callable[[float], None] | None = None) -> None:
        self.buffer: deque[Any] = deque()
        self.relayed: deque[Batch] = deque()
        self.resource = resource
        self.offset_ns = offset_ns
        self.thread_names = thread_names
        self.sinks = sinks
        self.stats = stats
        self.flush_interval = flush_interval
        self.max_relayed = max_relayed
        self.on_flush = on_flush
        self.wake = threading.Event()
        self._stop = False
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="otel_rl-flush", daemon=True)
            self._thread.start()

    def add_relayed(self, batch: Batch) -> None:
        if len(self.relayed) >= self.max_relayed:
            self.stats.add_dropped("relay buffer full", len(batch.records))
            return
        self.relayed.append(batch)

    def _loop(self) -> None:
        while not self._stop:
            self.wake.wait(self.flush_interval)
            self.wake.clear()
            if self._stop:
                break
            self.flush(time.monotonic() + max(self.flush_interval * 5, 10.0))

    def _drain(self) -> list[Batch]:
        records = []
        pop = self.buffer.popleft
        try:
            for _ in range(len(self.buffer)):
                records.append(pop())
        except IndexError:
            pass
        gpu = sys.modules.get("otel_rl._internal.gpu")  # loaded only if a block asked for it
        if gpu is not None:
            records = gpu.ready(records)  # spans of GPU-timed blocks wait for their GPU time
        batches = []
        if records:
            batches.append(Batch(self.resource, self.offset_ns, records, dict(self.thread_names)))
        pop_batch = self.relayed.popleft
        try:
            for _ in range(len(self.relayed)):
                batches.append(pop_batch())
        except IndexError:
            pass
        return batches

    def flush(self, deadline: float) -> None:
        """Export everything buffered now; gives up (counting drops) at `deadline`."""
        with self._flush_lock:
            try:
                if self.on_flush is not None:
                    self.on_flush(deadline)
                batches = self._drain()
                if not batches:
                    return
                for sink in self.sinks:
                    sink.export(batches, deadline)
            except Exception as exc:  # never let a bug in export reach the training loop
                self.stats.warn_once(f"flush-{type(exc).__name__}", f"flush failed: {exc!r}")

    def shutdown(self, deadline: float) -> None:
        self._stop = True
        self.wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
        if not self._flush_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return  # a flush is stuck past the deadline; exit anyway
        self._flush_lock.release()
        self.flush(deadline)
        for sink in self.sinks:
            try:
                sink.shutdown(deadline)
            except Exception:
                pass
        left = len(self.buffer) + sum(len(b.records) for b in self.relayed)
        self.stats.add_dropped("not exported before the shutdown deadline", left)
