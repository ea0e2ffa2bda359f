"""Serialised ``ExportTraceServiceRequest``s: read from OTLP-JSON spans files, split to a
size, written as OTLP-JSON lines, counted (`otel-rl replay` and `otel-rl import`).

OTLP-JSON (the Collector's ``file`` exporter format: one ``ExportTraceServiceRequest`` per
line) differs from protobuf's canonical JSON in one way that matters: trace and span ids are
**hex**, not base64. ``json_format.Parse`` would read a hex id as base64 without complaint and
produce the wrong bytes, so ids are translated on the way in and out.

Example::

    for lineno, request, count in read_request_lines("spans.otlp.jsonl"):
        transport.send(request)
    line = request_to_json_line(request)     # one line of an OTLP-JSON spans file
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from otel_rl._internal.errors import UserError

__all__ = [
    "read_request_lines",
    "request_span_count",
    "request_to_json_line",
    "split_request",
]

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


# OTLP-JSON <-> protobuf --------------------------------------------------------------------


def request_to_json_line(request: bytes | ExportTraceServiceRequest) -> str:
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


def read_request_lines(path: str | Path) -> Iterator[tuple[int, bytes, int]]:
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


def request_span_count(request: bytes | ExportTraceServiceRequest) -> int:
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
