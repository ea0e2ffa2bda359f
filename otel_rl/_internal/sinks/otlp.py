"""`OtlpSink`: the pipeline's batches as OTLP protobuf requests over an `OtlpTransport`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from otel_rl._internal.otlp import records
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.otlp.transport import ExportError, OtlpTransport
from otel_rl._internal.sinks.base import Sink, Stats, span_count

__all__ = ["OtlpSink"]


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



class OtlpSink(Sink):
    """Sends protobuf requests over an `OtlpTransport`, retrying what is retryable until the
    caller's deadline; what cannot be sent by then is dropped and counted."""

    name = "otlp"

    def __init__(self, transport_factory: Callable[[], OtlpTransport], batch_size: int,
                 stats: Stats, endpoint: str) -> None:
        self._factory = transport_factory
        self._transport: OtlpTransport | None = None
        self._batch_size = batch_size
        self._stats = stats
        self._endpoint = endpoint
        self._encoder = records.Encoder()
        self._backoff_until = 0.0
        self._failures = 0
        self._timeout = 10.0

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        pending = _chunks(batches, self._batch_size)
        while pending:
            request = pending.pop(0)
            n = span_count(request)
            data = records.encode_batches(request, self._encoder)
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
