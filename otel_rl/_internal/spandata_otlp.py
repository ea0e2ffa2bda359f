"""`SpanData` to OTLP protobuf, and OTLP-JSON spans files to serialised export requests.

The offline tools (`otel-rl import`, `otel-rl replay`) speak OTLP through these functions; the
live pipeline encodes its own compact records elsewhere, without going through `SpanData`.

OTLP-JSON (the Collector's ``file`` exporter format: one ``ExportTraceServiceRequest`` per
line) differs from protobuf's canonical JSON in one way that matters: trace and span ids are
**hex**, not base64. ``json_format.Parse`` would read a hex id as base64 without complaint and
produce the wrong bytes, so ids are translated on the way in and out.

Example::

    request = encode_request(spans)          # bytes, ready for OtlpTransport.send
    line = request_to_json_line(request)     # one line of an OTLP-JSON spans file
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from otel_rl._internal.errors import UserError
from otel_rl._internal.spandata import SpanData

__all__ = [
    "encode_request",
    "iter_spans_file",
    "load_spans_file_requests",
    "request_span_count",
    "request_to_json_line",
    "split_request",
]

#: Instrumentation scope written on spans encoded from `SpanData` (which carries none).
SCOPE_NAME = "otel_rl"

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


# SpanData -> protobuf ----------------------------------------------------------------------


def encode_request(spans: Sequence[SpanData]) -> bytes:
    """Serialise `spans` as one ``ExportTraceServiceRequest``, one ``ResourceSpans`` per resource.

    Resources are grouped by value, in first-seen order; spans keep their order within a group.
    """
    data: bytes = build_request(spans).SerializeToString()
    return data


def build_request(spans: Iterable[SpanData]) -> Any:
    """The ``ExportTraceServiceRequest`` message for `spans` (see `encode_request`)."""
    request = ExportTraceServiceRequest()
    groups: dict[tuple[tuple[str, str], ...], Any] = {}
    for span in spans:
        key = _resource_key(span.resource)
        scope_spans = groups.get(key)
        if scope_spans is None:
            resource_spans: ResourceSpans = request.resource_spans.add()
            _fill_attributes(resource_spans.resource.attributes, span.resource)
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = SCOPE_NAME
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


# OTLP-JSON <-> protobuf --------------------------------------------------------------------


def request_to_json_line(request: bytes | Any) -> str:
    """One OTLP-JSON line (no newline) for a request given as bytes or as a message.

    Ids are hex, enums integers, 64-bit integers strings — as the Collector's file exporter
    writes them.
    """
    if isinstance(request, bytes):
        message = ExportTraceServiceRequest()
        message.ParseFromString(request)
    else:
        message = request
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    _convert_ids(data, _b64_to_hex)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def iter_spans_file(path: str | Path) -> Iterator[tuple[int, bytes, int]]:
    """Yield ``(line number, serialised request, span count)`` for each line of an OTLP-JSON file.

    The file may be gzip-compressed. Blank lines are skipped. A line that is not an OTLP-JSON
    trace request — including a last line cut short by a crash — raises `UserError` naming the
    line.
    """
    for lineno, raw_line in _numbered_lines(path):
        if not raw_line.strip():
            continue
        truncated = not raw_line.endswith(b"\n")
        try:
            message = _parse_line(raw_line)
        except ValueError as exc:
            hint = " (the last line is cut short)" if truncated else ""
            raise UserError(
                f"{_shown_path(path)}:{lineno}: not an OTLP-JSON trace request{hint}: {exc}"
            ) from None
        yield lineno, message.SerializeToString(), request_span_count(message)


def _numbered_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    # Through the input boundary: regular files only, bounded lines (see readers.boundary).
    from otel_rl._internal.readers.boundary import describe_path, iter_lines, open_input

    with open_input(path, "a spans file") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"  # gzip's magic number
        raw.seek(0)
        handle: Any = gzip.GzipFile(fileobj=raw) if compressed else raw
        yield from iter_lines(handle, describe_path(path))


def _shown_path(path: str | Path) -> str:
    from otel_rl._internal.readers.boundary import describe_path

    return describe_path(path)


def load_spans_file_requests(path: str | Path) -> Iterator[bytes]:
    """Yield each line of an OTLP-JSON spans file as a serialised ``ExportTraceServiceRequest``.

    Malformed lines raise `UserError` with the line number (see `iter_spans_file`).
    """
    for _lineno, request, _count in iter_spans_file(path):
        yield request


def request_span_count(request: bytes | Any) -> int:
    """How many spans a request (bytes or message) holds."""
    if isinstance(request, bytes):
        message = ExportTraceServiceRequest()
        message.ParseFromString(request)
        request = message
    return sum(
        len(scope_spans.spans)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
    )


def split_request(request: bytes, max_bytes: int) -> list[bytes]:
    """Split a serialised request into requests of at most about `max_bytes` each.

    Spans keep their resource and scope; a single span larger than `max_bytes` stays alone in
    its own request (the receiver will reject it, with a clear error).
    """
    if len(request) <= max_bytes:
        return [request]
    message = ExportTraceServiceRequest()
    message.ParseFromString(request)
    spans = [
        (r_index, s_index, span)
        for r_index, resource_spans in enumerate(message.resource_spans)
        for s_index, scope_spans in enumerate(resource_spans.scope_spans)
        for span in scope_spans.spans
    ]
    if len(spans) <= 1:
        return [request]
    half = len(spans) // 2
    parts = []
    for chunk in (spans[:half], spans[half:]):
        part = ExportTraceServiceRequest()
        targets: dict[tuple[int, int], Any] = {}
        last_resource: tuple[int, Any] | None = None
        for r_index, s_index, span in chunk:
            target = targets.get((r_index, s_index))
            if target is None:
                if last_resource is None or last_resource[0] != r_index:
                    source = message.resource_spans[r_index]
                    resource_spans = part.resource_spans.add()
                    resource_spans.resource.CopyFrom(source.resource)
                    resource_spans.schema_url = source.schema_url
                    last_resource = (r_index, resource_spans)
                source_scope = message.resource_spans[r_index].scope_spans[s_index]
                target = last_resource[1].scope_spans.add()
                target.scope.CopyFrom(source_scope.scope)
                target.schema_url = source_scope.schema_url
                targets[(r_index, s_index)] = target
            target.spans.add().CopyFrom(span)
        parts.extend(split_request(part.SerializeToString(), max_bytes))
    return parts


def _parse_line(raw_line: bytes) -> Any:
    from otel_rl._internal.readers.boundary import decode_text, parse_json
    from otel_rl._internal.readers.otlp_json import spans_from_document

    try:
        data = parse_json(decode_text(raw_line, "@"), "@")
        if not isinstance(data, dict) or not ("resourceSpans" in data or "resource_spans" in data):
            raise ValueError("expected an object with 'resourceSpans'")
        # What `otel-rl tree` would refuse is not sent either (ids, times, types, limits).
        spans_from_document(data, "@")
    except UserError as exc:
        raise ValueError(re.sub(r"^@( line \d+)?: ", "", str(exc))) from None
    _convert_ids(data, _hex_to_b64)
    message = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    return message


def _convert_ids(data: Any, convert: Any) -> None:
    """Rewrite every span and link id in an OTLP-JSON dict in place with `convert`."""
    for resource_spans in _items(data, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            for span in _items(scope_spans, "spans"):
                _convert_keys(span, convert)
                for link in _items(span, "links"):
                    _convert_keys(link, convert)


def _items(data: Any, *keys: str) -> list[Any]:
    if not isinstance(data, dict):
        return []
    for key in keys:
        value = data.get(key)
        if isinstance(value, list):
            return value
    return []


def _convert_keys(obj: Any, convert: Any) -> None:
    if not isinstance(obj, dict):
        return
    for key in _ID_KEYS:
        for spelling in (key, _snake(key)):
            value = obj.get(spelling)
            if isinstance(value, str) and value:
                obj[spelling] = convert(value, spelling)


def _snake(camel: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in camel)


def _hex_to_b64(value: str, key: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"{key} {value!r} is not hex") from None
    return base64.b64encode(raw).decode("ascii")


def _b64_to_hex(value: str, key: str) -> str:
    try:
        return base64.b64decode(value, validate=True).hex()
    except binascii.Error:
        raise ValueError(f"{key} {value!r} is not base64") from None
