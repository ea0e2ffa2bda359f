"""`OtlpSink`: the pipeline's batches as OTLP protobuf requests over an `OtlpTransport`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from otel_rl._internal.otlp import records
from otel_rl._internal.otlp.delivery import Delivery, Request
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.otlp.transport import ExportError, OtlpTransport
from otel_rl._internal.sinks.base import Sink, Stats, chunk_batches, span_count

__all__ = ["OtlpSink"]


class _BatchRequest:
    """Batches of records as one request; encoded on first use, halved by records."""

    __slots__ = ("_data", "_encoder", "batches", "spans")

    def __init__(self, batches: list[Batch], encoder: records.Encoder) -> None:
        self.batches = batches
        self.spans = span_count(batches)
        self._encoder = encoder
        self._data: bytes | None = None

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = records.encode_batches(self.batches, self._encoder)
        return self._data

    def halves(self) -> list[Request]:
        if self.spans < 2:
            return []
        return [_BatchRequest(chunk, self._encoder)
                for chunk in chunk_batches(self.batches, (self.spans + 1) // 2)]


class OtlpSink(Sink):
    """Sends the pipeline's batches as protobuf requests of at most `batch_size` spans through
    the shared `Delivery` (retry until the caller's deadline, halves for a receiver's size
    limit); what cannot be sent by then is dropped and counted."""

    name = "otlp"

    def __init__(self, transport_factory: Callable[[], OtlpTransport], batch_size: int,
                 stats: Stats, endpoint: str) -> None:
        self._batch_size = batch_size
        self._stats = stats
        self._endpoint = endpoint
        self.label = endpoint
        self._encoder = records.Encoder()
        self._delivery = Delivery(transport_factory, where=endpoint, on_retry=self._on_retry)

    def _on_retry(self, error: ExportError) -> None:
        self._stats.warn_once(f"otlp-retry-{self._endpoint}",
                              f"cannot export to {self._endpoint} ({error}); retrying")

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        for chunk in chunk_batches(batches, self._batch_size):
            self._stats.sending(self.name, span_count(chunk))
            outcome = self._delivery.send(_BatchRequest(chunk, self._encoder), deadline)
            if outcome.sent:
                self._stats.add_exported(self.name, outcome.sent)
            if outcome.ok:
                continue
            unconfirmed = outcome.unconfirmed
            self._stats.add_dropped("unconfirmed", unconfirmed, self.name, outcome.reason)
            self._stats.add_dropped("timed out" if unconfirmed else outcome.kind or "error",
                                    outcome.lost - unconfirmed, self.name, outcome.reason)
            if isinstance(outcome.error, ExportError) and outcome.kind == "rejected":
                self._stats.warn_once(f"otlp-reject-{self._endpoint}",
                                      f"{self._endpoint} rejected spans: {outcome.error}")
            elif outcome.kind == "error":
                self._stats.warn_once(f"otlp-error-{type(outcome.error).__name__}",
                                      f"export to {self._endpoint} failed: {outcome.error!r}")

    def abort(self) -> None:
        self._delivery.abort()

    def limit(self, deadline: float) -> None:
        self._delivery.limit(deadline)

    def unanswered(self) -> int:
        return self._delivery.unanswered()

    def failing(self) -> tuple[str, str] | None:
        last = self._delivery.last_error
        if last is None:
            return None
        wait = f" (it asked to retry after {last.retry_after_s:g} s)" if last.retry_after_s else ""
        return last.kind, last.message + wait

    def shutdown(self, deadline: float) -> None:
        self._delivery.close()

    def forget_after_fork(self) -> None:
        """In a forked child: let go of the parent's connection (see `OtlpTransport`)."""
        transport = self._delivery.transport
        if transport is not None:
            transport.reset_after_fork()
