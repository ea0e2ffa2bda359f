"""OTel SDK ``ReadableSpan`` -> `SpanData`, for spans handed to a standard ``SpanExporter``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from otel_rl._internal.spandata import SpanData, SpanEvent

__all__ = ["span_from_sdk", "spans_from_sdk"]


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    # The SDK keeps sequences as tuples; OTLP readers give lists, and both must compare equal.
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def span_from_sdk(span: ReadableSpan) -> SpanData | None:
    """One finished SDK span as `SpanData`; None for a span without context or end time."""
    context = span.context
    if context is None or span.start_time is None or span.end_time is None:
        return None
    parent = span.parent
    return SpanData(
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None and parent.span_id else "",
        name=span.name,
        start_ns=span.start_time,
        end_ns=span.end_time,
        attributes=_plain(span.attributes),
        resource=_plain(span.resource.attributes if span.resource is not None else None),
        is_error=span.status.status_code is StatusCode.ERROR,
        events=[
            SpanEvent(event.name, event.timestamp, _plain(event.attributes))
            for event in span.events
        ],
        links=[
            (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}")
            for link in span.links
            if link.context is not None
        ],
    )


def spans_from_sdk(spans: Iterable[ReadableSpan]) -> list[SpanData]:
    """`span_from_sdk` over `spans`, skipping unfinished ones."""
    return [data for data in map(span_from_sdk, spans) if data is not None]
