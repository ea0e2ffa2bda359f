"""`SpanData` -> OTLP protobuf (through the protobuf library), for the offline tools.

`otel-rl import` and the tests speak OTLP through `encode_spans`; the live pipeline encodes its
own compact records in `otlp.records`, without going through `SpanData`.

Example::

    request = encode_spans(spans)          # bytes, ready for OtlpTransport.send
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from otel_rl._internal import semconv
from otel_rl._internal.spandata import SpanData

__all__ = ["build_request", "encode_spans"]


def encode_spans(spans: Sequence[SpanData]) -> bytes:
    """Serialise `spans` as one ``ExportTraceServiceRequest``, one ``ResourceSpans`` per resource.

    Resources are grouped by value, in first-seen order; spans keep their order within a group.
    """
    data: bytes = build_request(spans).SerializeToString()
    return data


def build_request(spans: Iterable[SpanData]) -> ExportTraceServiceRequest:
    """The ``ExportTraceServiceRequest`` message for `spans` (see `encode_spans`)."""
    request = ExportTraceServiceRequest()
    groups: dict[tuple[tuple[str, str], ...], ScopeSpans] = {}
    for span in spans:
        key = _resource_key(span.resource)
        scope_spans = groups.get(key)
        if scope_spans is None:
            resource_spans: ResourceSpans = request.resource_spans.add()
            _fill_attributes(resource_spans.resource.attributes, span.resource)
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = semconv.SCOPE_NAME
            groups[key] = scope_spans
        _fill_span(scope_spans.spans.add(), span)
    return request


def _resource_key(resource: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    # repr() keeps 1 and "1" (and True and 1) apart, which str() would merge.
    return tuple(sorted((key, repr(value)) for key, value in resource.items()))


def _fill_span(out: Span, span: SpanData) -> None:
    out.trace_id = _id_bytes(span.trace_id, 16, "trace id")
    out.span_id = _id_bytes(span.span_id, 8, "span id")
    if span.parent_span_id:
        out.parent_span_id = _id_bytes(span.parent_span_id, 8, "parent span id")
    out.name = span.name
    out.kind = Span.SPAN_KIND_INTERNAL
    out.start_time_unix_nano = span.start_ns
    out.end_time_unix_nano = span.end_ns
    _fill_attributes(out.attributes, span.attributes)
    for event in span.events:
        out_event = out.events.add()
        out_event.name = event.name
        out_event.time_unix_nano = event.time_ns
        _fill_attributes(out_event.attributes, event.attributes)
    for trace_id, span_id in span.links:
        link = out.links.add()
        link.trace_id = _id_bytes(trace_id, 16, "link trace id")
        link.span_id = _id_bytes(span_id, 8, "link span id")
    if span.is_error:
        out.status.code = Status.STATUS_CODE_ERROR


def _id_bytes(hex_id: str, size: int, what: str) -> bytes:
    try:
        raw = bytes.fromhex(hex_id)
    except ValueError:
        raise ValueError(f"{what} {hex_id!r} is not hex") from None
    if len(raw) != size:
        raise ValueError(f"{what} {hex_id!r} is not {size * 2} hex digits")
    return raw


def _fill_attributes(out: Any, attributes: Mapping[str, Any]) -> None:
    for key, value in attributes.items():
        if value is None:
            continue  # OTel drops None-valued attributes; so do we
        kv: KeyValue = out.add()
        kv.key = key
        _fill_value(kv.value, value)


def _fill_value(out: AnyValue, value: Any) -> None:
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, Mapping):
        out.kvlist_value.SetInParent()
        _fill_attributes(out.kvlist_value.values, value)
    elif isinstance(value, (list, tuple)):
        out.array_value.SetInParent()
        for item in value:
            _fill_value(out.array_value.values.add(), item)
    else:
        out.string_value = str(value)
