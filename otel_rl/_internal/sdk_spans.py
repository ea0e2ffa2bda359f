"""Records -> OTel SDK `ReadableSpan`s, for standard `SpanExporter`s (off the hot path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_rl._internal import semconv
from otel_rl._internal.otlp_encode import (
    SCOPE_NAME,
    SCOPE_VERSION,
    STATUS_MESSAGE_MAX,
    Batch,
    exception_attributes,
    extra_attributes,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope(SCOPE_NAME, SCOPE_VERSION)


def to_readable_spans(batches: Sequence[Batch]) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []
    for batch in batches:
        resource = Resource(dict(batch.resource))
        offset = batch.offset_ns
        for record in batch.records:
            sid, psid, name, start, end, tid, trace_id, extra = record
            extra = extra or {}
            attrs: dict[str, Any] = {semconv.THREAD_ID: tid,
                                     semconv.THREAD_NAME: batch.thread_names.get(tid, "")}
            attrs.update(extra_attributes(extra))
            events = []
            status = Status(StatusCode.UNSET)
            error = extra.get("error")
            if error:
                events.append(Event("exception", exception_attributes(error), end + offset))
                status = Status(StatusCode.ERROR, error[1][:STATUS_MESSAGE_MAX])
            links = []
            if extra.get("link"):
                ltrace, lspan = extra["link"]
                links.append(Link(SpanContext(int(ltrace), int(lspan), False, _SAMPLED)))
            context = SpanContext(trace_id, sid, False, _SAMPLED)
            parent = SpanContext(trace_id, psid, False, _SAMPLED) if psid else None
            spans.append(ReadableSpan(
                name=name, context=context, parent=parent, resource=resource,
                attributes=attrs, events=events, links=links, kind=SpanKind.INTERNAL,
                status=status, start_time=start + offset, end_time=end + offset,
                instrumentation_scope=_SCOPE,
            ))
    return spans
