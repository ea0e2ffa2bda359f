"""The one retry-and-split policy for OTLP export requests.

Both the live pipeline (`sinks.otlp.OtlpSink`) and ``otel-rl replay`` / ``otel-rl import`` send
serialised ``ExportTraceServiceRequest``s through a `Delivery`:

- what the OTLP specification calls retryable (gRPC UNAVAILABLE, HTTP 429/502/503/504, a
  dropped connection) is retried after the server's ``Retry-After`` when it gives one, else
  after an exponential backoff (`backoff_s` doubling, at most `max_backoff_s`), until the
  caller's deadline or `max_attempts`;
- a request the receiver refuses for its size is sent again in halves (`Request.halves`: the
  pipeline re-encodes half its records, a spans file's request is split by span); a
  serialised request over `max_bytes` is split before it goes over gRPC (servers refuse
  > 4 MiB);
- the first part that cannot be delivered ends the request: `Outcome` says how many spans
  arrived, how many did not, and why. Nothing here raises into the caller.

The backoff state outlives a request, so a collector that is down is not hammered by every
flush.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from otel_rl._internal.otlp.transport import GRPC_MAX_MESSAGE_BYTES, ExportError, OtlpTransport

__all__ = ["GRPC_SPLIT_BYTES", "Delivery", "Outcome", "Request", "SerializedRequest"]

#: Requests larger than this are split before they go over gRPC (7/8 of the 4 MiB limit).
GRPC_SPLIT_BYTES = GRPC_MAX_MESSAGE_BYTES * 7 // 8


class Request(Protocol):
    """One export request: its bytes, how many spans it holds, and its two halves."""

    @property
    def data(self) -> bytes: ...

    @property
    def spans(self) -> int: ...

    def halves(self) -> list[Request]:
        """The request as (at least two) smaller requests; [] if it cannot be split."""
        ...


class SerializedRequest:
    """A request known only as protobuf bytes (a spans file's line); split by parsing it."""

    __slots__ = ("data", "spans")

    def __init__(self, data: bytes, spans: int) -> None:
        self.data = data
        self.spans = spans

    def halves(self) -> list[Request]:
        return self.split(len(self.data) // 2)

    def split(self, max_bytes: int) -> list[Request]:
        # protobuf is imported only here: requests are rarely too large.
        from otel_rl._internal.otlp.requests import request_span_count, split_request

        parts = split_request(self.data, max_bytes)
        if len(parts) < 2:
            return []
        return [SerializedRequest(part, request_span_count(part)) for part in parts]


class Outcome:
    """What became of one request: spans `sent`, spans `lost`, and why (`reason`, `error`)."""

    __slots__ = ("error", "kind", "lost", "reason", "sent", "unconfirmed")

    def __init__(self) -> None:
        self.sent = 0
        self.lost = 0
        #: Of `lost`: spans of the part written whole whose answer never came (the collector
        #: may have them; the ledger says them apart). The parts after it were never sent.
        self.unconfirmed = 0
        #: One line for a person ("collector unreachable at ...", "rejected by ...: ...").
        self.reason = ""
        #: The ledger's reason: "unreachable", "timed out", "rejected" or "error".
        self.kind = ""
        self.error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.lost == 0


class Delivery:
    """Sends serialised requests over one `OtlpTransport` (made on first use by `factory`)."""

    def __init__(self, factory: Callable[[], OtlpTransport], *, where: str | None = None,
                 max_attempts: int | None = None,
                 backoff_s: float = 0.25, max_backoff_s: float = 5.0,
                 max_retry_after_s: float | None = None, max_bytes: int | None = None,
                 on_retry: Callable[[ExportError], None] | None = None) -> None:
        self._factory = factory
        self._where = where
        self.transport: OtlpTransport | None = None
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.max_bytes = max_bytes
        self.on_retry = on_retry
        self._timeout = 10.0
        self._failures = 0
        self._backoff_until = 0.0
        self._last_error: ExportError | None = None
        self._aborted = threading.Event()
        self._poke = threading.Event()
        self._limit: float | None = None
        #: Spans of the part being sent now (see `unanswered`).
        self._part_spans = 0

    @property
    def last_error(self) -> ExportError | None:
        """The failure of the last attempt, while the destination keeps failing."""
        return self._last_error

    @property
    def where(self) -> str:
        """The destination, as messages name it."""
        if self._where is not None:
            return self._where
        return self.transport.url if self.transport is not None else "the collector"

    def send(self, request: Request, deadline: float | None = None) -> Outcome:
        """Deliver `request` by `deadline` (time.monotonic(); None: no deadline, only
        `max_attempts`)."""
        outcome = Outcome()
        try:
            transport = self._transport()
        except Exception as exc:  # a bad endpoint: nothing can be sent
            outcome.lost, outcome.error = request.spans, exc
            outcome.reason = f"cannot export to {self.where}: {exc}"
            outcome.kind = "unreachable"
            return outcome
        parts: list[Request] = [request]
        if (self.max_bytes is not None and transport.protocol == "grpc"
                and len(request.data) > self.max_bytes
                and isinstance(request, SerializedRequest)):
            parts = request.split(self.max_bytes) or parts
        while parts:
            part = parts.pop(0)
            self._part_spans = part.spans
            error = self._send_one(transport, part.data, deadline)
            self._part_spans = 0
            if error is None:
                outcome.sent += part.spans
                continue
            if isinstance(error, ExportError) and error.too_large and part.spans > 1:
                halves = part.halves()  # the receiver's size limit: send it in halves
                if halves:
                    parts[:0] = halves
                    continue
            outcome.lost = part.spans + sum(p.spans for p in parts)
            outcome.error = error
            outcome.reason = self._reason(error)
            outcome.kind = self._kind(error)
            if outcome.kind == "unconfirmed":
                outcome.unconfirmed = part.spans
            break
        return outcome

    def limit(self, deadline: float) -> None:
        """From another thread: no send (one under way included) goes past `deadline` (a
        shutdown starting): a backoff that would outlast it gives up now."""
        self._limit = None if deadline == float("inf") else deadline
        self._poke.set()

    def unanswered(self) -> int:
        """From another thread: spans of a request written whole and not answered yet (what
        shutdown's deadline cuts off there is "unconfirmed": the collector may have it)."""
        transport = self.transport
        return self._part_spans if transport is not None and transport.sent_unanswered() else 0

    def abort(self) -> None:
        """From another thread: wake a send blocked on the network or in a backoff
        (shutdown's deadline); it gives up at once."""
        self._aborted.set()
        self._poke.set()
        transport = self.transport
        if transport is not None:
            transport.abort()

    def close(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            try:
                transport.close()
            except Exception:
                pass

    # -- one request, with retries ---------------------------------------------------------------
    def _transport(self) -> OtlpTransport:
        if self.transport is None:
            self.transport = self._factory()
            self._timeout = self.transport.timeout_s
        return self.transport

    def _send_one(self, transport: OtlpTransport, request: bytes,
                  deadline: float | None) -> Exception | None:
        attempts = 0
        asked = deadline
        while True:
            # A `limit` set meanwhile (shutdown) shortens a send already under way.
            deadline = asked if self._limit is None else min(asked or self._limit, self._limit)
            now = time.monotonic()
            wait = self._backoff_until - now
            if wait > 0:
                if deadline is not None and self._backoff_until >= deadline:
                    # The server asked for (or the backoff needs) more time than is left: say
                    # what the last answer was, not "unreachable".
                    return _GaveUp(self._last_error, self._backoff_until - now, attempts > 0)
                self._poke.wait(wait)  # `limit` and `abort` cut a backoff short
                self._poke.clear()
                continue
            if self._aborted.is_set() or (deadline is not None and now >= deadline):
                return _GaveUp(self._last_error, 0.0, attempts > 0)
            attempts += 1
            try:
                # Never wait on the network past the caller's deadline (shutdown).
                transport.timeout_s = (self._timeout if deadline is None
                                       else max(0.05, min(self._timeout, deadline - now)))
                transport.send(request)
            except ExportError as exc:
                if exc.too_large or not exc.retryable or (
                        self.max_attempts is not None and attempts >= self.max_attempts):
                    return exc
                self._failures += 1
                self._last_error = exc
                delay = exc.retry_after_s
                if delay is None:
                    delay = min(self.max_backoff_s, self.backoff_s * 2 ** self._failures)
                elif self.max_retry_after_s is not None:
                    delay = min(delay, self.max_retry_after_s)
                self._backoff_until = time.monotonic() + delay
                if self.on_retry is not None:
                    self.on_retry(exc)
            except Exception as exc:  # a transport bug must not reach the caller
                return exc
            else:
                self._failures = 0
                self._backoff_until = 0.0
                self._last_error = None
                return None

    def _reason(self, error: Exception) -> str:
        if isinstance(error, _GaveUp):
            last = error.last
            if last is None:
                return f"deadline passed before sending to {self.where}"
            if last.kind == "rejected":
                wait = (f"; asked to retry after {last.retry_after_s:g} s, past the deadline"
                        if last.retry_after_s and error.wait_s > 0 else "")
                return f"{self.where} refused: {last.message}{wait}"
            if last.kind == "timed out":
                return f"{self.where} did not answer in time: {last.message}"
            if last.kind == "unconfirmed":
                return f"sent to {self.where}, no answer before the deadline: {last.message}"
            return f"collector unreachable at {self.where}: {last.message}"
        if isinstance(error, ExportError):
            return f"rejected by {self.where}: {error.message}"
        return f"export error: {type(error).__name__}"

    @staticmethod
    def _kind(error: Exception) -> str:
        if isinstance(error, _GaveUp):
            if error.last is None or (error.last.kind == "unconfirmed" and not error.tried):
                return "timed out"  # (another request's answer was the one that never came)
            return error.last.kind
        if isinstance(error, ExportError):
            return error.kind
        return "error"


class _GaveUp(Exception):
    """The deadline passed while the collector was failing or backing off; `last` is its
    last failure (None: there was no time to try), `wait_s` the backoff still ahead, `tried`
    whether this request was sent at all (else `last` was another request's)."""

    def __init__(self, last: ExportError | None, wait_s: float, tried: bool = True) -> None:
        super().__init__("deadline passed")
        self.last = last
        self.wait_s = wait_s
        self.tried = tried

