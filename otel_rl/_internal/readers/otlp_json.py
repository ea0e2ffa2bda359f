"""OTLP/JSON -> `SpanData`: the Collector's file-exporter format and the shapes built on it.

The Collector's ``file`` exporter writes one ``ExportTraceServiceRequest`` per line as OTLP/JSON:
camelCase keys, hex ids, enums as integers, 64-bit integers as strings. Jaeger's api_v3 and
Tempo answer with the same ``resourceSpans`` structure, Tempo with base64 ids and enum names
(the protobuf canonical JSON). One parser reads them all: ids are recognised by length (32/16
hex characters or 24/12 base64 characters), integers may be numbers or strings, enums numbers or
names, and the proto field names (``trace_id``) are accepted beside the JSON names (``traceId``).

The JSON is parsed directly rather than through ``google.protobuf.json_format``, which would
read OTLP's hex ids as base64 and fail or, worse, silently decode them to the wrong bytes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from otel_rl._internal.errors import UserError, one_line, shown
from otel_rl._internal.readers.boundary import (
    DEFAULT_LIMITS,
    MAX_TIME_NS,
    JSONInputError,
    Limits,
    decode_text,
    describe_path,
    parse_json,
    read_input,
)
from otel_rl._internal.readers.semantics import check_span
from otel_rl._internal.spandata import SpanData, SpanEvent

__all__ = [
    "any_value",
    "decode_id",
    "parse_otlp_json_line",
    "parse_otlp_json_lines",
    "parse_spans_text",
    "read_otlp_json_file",
    "resource_of",
    "scopes_of",
    "span_from_json",
    "spans_from_document",
    "spans_from_resource_spans",
    "spans_of_scope",
]

_STATUS_CODE_ERROR = 2
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Longest id text worth decoding (base64 of 16 bytes is 24 characters).
_MAX_ID_CHARS = 64


def _get(obj: dict[str, Any], json_name: str, proto_name: str, default: Any = None) -> Any:
    """A field by its JSON name or, as protobuf JSON parsers also accept, its proto name."""
    if json_name in obj:
        return obj[json_name]
    return obj.get(proto_name, default)


def _list(obj: dict[str, Any], json_name: str, proto_name: str, where: str) -> list[Any]:
    value = _get(obj, json_name, proto_name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise UserError(f"{where}: '{json_name}' must be a list")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a JSON object")
    return value


def decode_id(value: Any, size: int, where: str, what: str) -> str:
    """A trace (16 bytes) or span (8 bytes) id given as hex or base64, as lowercase hex.

    ``""``/missing gives ``""``; an all-zero id (invalid in OTel) also means "none".
    """
    if value is None or value == "":
        return ""
    if type(value) is str and len(value) == 2 * size:  # the hex otel_rl and OTLP/JSON write
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if len(raw) == size:
            return raw.hex() if any(raw) else ""
    if isinstance(value, str) and len(value) <= _MAX_ID_CHARS:
        text = value.strip()
        if len(text) == 2 * size:
            try:
                raw = bytes.fromhex(text)
            except ValueError:
                raw = b""
        else:
            try:
                raw = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
        if len(raw) == size:
            return "" if not any(raw) else raw.hex()
    raise UserError(
        f"{where}: bad {what} {shown(value)} (expected {2 * size} hex characters or base64 of "
        f"{size} bytes)"
    )


_INT64 = (-(2**63), 2**63 - 1)


def _int64(
    value: Any, where: str, what: str, low: int = _INT64[0], high: int = _INT64[1]
) -> int:
    # proto3 JSON writes 64-bit integers as strings; some writers use plain numbers.
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise UserError(f"{where}: '{what}' must be an integer, got {shown(value)}")
    if not low <= number <= high:
        raise UserError(f"{where}: '{what}' {shown(number)} is out of range ({low} to {high})")
    return number


def _double(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and len(value) <= 64:
        # proto3 JSON spells non-finite doubles "NaN", "Infinity", "-Infinity".
        try:
            return float(value)
        except ValueError:
            pass
    raise UserError(f"{where}: 'doubleValue' must be a number, got {shown(value)}")


def _typed(value: Any, kind: type, where: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise UserError(f"{where}: '{what}' must be a {kind.__name__}, got {shown(value)}")
    return value


def any_value(value: Any, where: str, depth: int = 0) -> Any:
    """An OTLP ``AnyValue`` object as a Python value (str, bool, int, float, list, dict)."""
    if value is None:
        return None
    if depth > DEFAULT_LIMITS.max_value_depth:
        raise UserError(
            f"{where}: attribute value nested deeper than {DEFAULT_LIMITS.max_value_depth} levels"
        )
    obj = _object(value, where)
    if "stringValue" in obj or "string_value" in obj:
        return _typed(_get(obj, "stringValue", "string_value"), str, where, "stringValue")
    if "boolValue" in obj or "bool_value" in obj:
        return _typed(_get(obj, "boolValue", "bool_value"), bool, where, "boolValue")
    if "intValue" in obj or "int_value" in obj:
        return _int64(_get(obj, "intValue", "int_value"), where, "intValue")
    if "doubleValue" in obj or "double_value" in obj:
        return _double(_get(obj, "doubleValue", "double_value"), where)
    if "arrayValue" in obj or "array_value" in obj:
        array = _object(_get(obj, "arrayValue", "array_value"), where)
        return [any_value(v, where, depth + 1) for v in _list(array, "values", "values", where)]
    if "kvlistValue" in obj or "kvlist_value" in obj:
        kvlist = _object(_get(obj, "kvlistValue", "kvlist_value"), where)
        return _attributes(_list(kvlist, "values", "values", where), where, depth + 1)
    if "bytesValue" in obj or "bytes_value" in obj:
        encoded = _typed(_get(obj, "bytesValue", "bytes_value"), str, where, "bytesValue")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise UserError(f"{where}: 'bytesValue' is not base64") from None
    return None  # an empty AnyValue


def _attributes(items: list[Any], where: str, depth: int = 0) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for item in items:
        if type(item) is dict:  # the two common spellings first, decoded as any_value does
            key = item.get("key")
            value = item.get("value")
            if type(key) is str and type(value) is dict and len(value) == 1:
                text = value.get("stringValue")
                if type(text) is str:
                    attributes[key] = text
                    continue
                number = value.get("intValue")
                if type(number) is str and len(number) <= 40:
                    try:
                        number = int(number)
                    except ValueError:
                        number = None
                if type(number) is int and _INT64[0] <= number <= _INT64[1]:
                    attributes[key] = number
                    continue
        kv = _object(item, f"{where}.attributes")
        key = kv.get("key")
        if not isinstance(key, str):
            raise UserError(f"{where}.attributes: an attribute has no string 'key'")
        attributes[key] = any_value(kv.get("value"), f"{where}.attributes[{shown(key)}]", depth)
    return attributes


def _is_error(status: Any, where: str) -> bool:
    if status is None:
        return False
    status_obj = _object(status, f"{where}.status")
    if not isinstance(status_obj.get("message", ""), str):
        raise UserError(f"{where}.status: 'message' must be a string")
    code = status_obj.get("code", 0)
    if isinstance(code, str):
        return code.strip().upper() in ("STATUS_CODE_ERROR", "ERROR", str(_STATUS_CODE_ERROR))
    if not isinstance(code, int) or isinstance(code, bool):
        raise UserError(f"{where}.status: 'code' must be an integer or a name, got {shown(code)}")
    return code == _STATUS_CODE_ERROR


def _span(obj: Any, resource: dict[str, Any], where: str) -> SpanData:
    return _span_as_written(obj, resource, where) or _span_any(obj, resource, where)


#: A span's fields as otel_rl's writers spell them (and OTLP/JSON exporters commonly do).
_WRITTEN_FIELDS = frozenset(("traceId", "spanId", "parentSpanId", "name", "kind",
                             "startTimeUnixNano", "endTimeUnixNano", "attributes", "status",
                             "events", "links"))
#: Decimal digits of the largest time `_int64` accepts (`MAX_TIME_NS`).
_TIME_DIGITS = len(str(MAX_TIME_NS))


def _span_as_written(span: Any, resource: dict[str, Any], where: str) -> SpanData | None:
    """`_span_any` for a span spelled as otel_rl writes it: those fields only, times as
    decimal strings, no events or links. The same `SpanData`, at about half the cost (a
    report's timeline converts 5,000 of them: issue 19); None for anything else, which
    `_span_any` then reads (and says what is wrong with). Checked against it field by field
    in `tests/test_report_timeline.py`."""
    if type(span) is not dict or not _WRITTEN_FIELDS.issuperset(span):
        return None
    name = span.get("name", "")
    start, end = span.get("startTimeUnixNano"), span.get("endTimeUnixNano")
    attributes, kind = span.get("attributes"), span.get("kind")
    if (type(name) is not str or type(start) is not str or type(end) is not str
            or not (0 < len(start) <= _TIME_DIGITS and start.isascii() and start.isdigit())
            or not (0 < len(end) <= _TIME_DIGITS and end.isascii() and end.isdigit())
            or not (kind is None or type(kind) is int or type(kind) is str)
            or not (attributes is None or type(attributes) is list)
            or span.get("events") not in (None, []) or span.get("links") not in (None, [])):
        return None
    start_ns, end_ns = int(start), int(end)
    if end_ns < start_ns or end_ns > MAX_TIME_NS:
        return None
    try:
        trace_id = decode_id(span.get("traceId"), 16, where, "traceId")
        span_id = decode_id(span.get("spanId"), 8, where, "spanId")
        parent_id = decode_id(span.get("parentSpanId"), 8, where, "parentSpanId")
    except UserError:
        return None
    if not trace_id or not span_id:
        return None
    data = SpanData(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_id,
        name=name,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=_attributes(attributes, where) if attributes else {},
        resource=resource,
        is_error=_is_error(span.get("status"), where),
    )
    check_span(data, where)
    return data


def _span_any(obj: Any, resource: dict[str, Any], where: str) -> SpanData:
    """One span in any spelling OTLP/JSON and protobuf's JSON parsers accept, checked."""
    span = _object(obj, where)
    name = span.get("name", "")
    if not isinstance(name, str):
        raise UserError(f"{where}: 'name' must be a string, got {shown(name)}")
    trace_id = decode_id(_get(span, "traceId", "trace_id"), 16, where, "traceId")
    span_id = decode_id(_get(span, "spanId", "span_id"), 8, where, "spanId")
    if not trace_id or not span_id:
        raise UserError(f"{where}: span {shown(name)} has no traceId or spanId")
    _check_plain_fields(span, where)
    start = _get(span, "startTimeUnixNano", "start_time_unix_nano")
    end = _get(span, "endTimeUnixNano", "end_time_unix_nano")
    if start is None or end is None:
        raise UserError(f"{where}: span {shown(name)} has no start or end time")
    start_ns = _int64(start, where, "startTimeUnixNano", 0, MAX_TIME_NS)
    end_ns = _int64(end, where, "endTimeUnixNano", 0, MAX_TIME_NS)
    if end_ns < start_ns:
        raise UserError(f"{where}: span {shown(name)} ends before it starts")
    events = []
    for i, event in enumerate(_list(span, "events", "events", where)):
        event_where = f"{where}.events[{i}]"
        event_obj = _object(event, event_where)
        events.append(
            SpanEvent(
                name=_typed(event_obj.get("name", ""), str, event_where, "name"),
                time_ns=_int64(
                    _get(event_obj, "timeUnixNano", "time_unix_nano", 0),
                    event_where,
                    "timeUnixNano",
                    0,
                    MAX_TIME_NS,
                ),
                attributes=_attributes(
                    _list(event_obj, "attributes", "attributes", event_where), event_where
                ),
            )
        )
    links = []
    for i, link in enumerate(_list(span, "links", "links", where)):
        link_where = f"{where}.links[{i}]"
        link_obj = _object(link, link_where)
        link_ids = (
            decode_id(_get(link_obj, "traceId", "trace_id"), 16, link_where, "traceId"),
            decode_id(_get(link_obj, "spanId", "span_id"), 8, link_where, "spanId"),
        )
        if not all(link_ids):
            raise UserError(f"{link_where}: a link needs a traceId and a spanId")
        links.append(link_ids)
    data = SpanData(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=decode_id(
            _get(span, "parentSpanId", "parent_span_id"), 8, where, "parentSpanId"
        ),
        name=name,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=_attributes(_list(span, "attributes", "attributes", where), where),
        resource=resource,
        is_error=_is_error(span.get("status"), where),
        events=events,
        links=links,
    )
    check_span(data, where)
    return data


#: Span fields otel_rl does not use, and the JSON types OTLP gives them (checked all the same:
#: a file with a list where a number belongs is not what it claims to be).
_PLAIN_FIELDS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("kind", "kind", (int, str)),
    ("flags", "flags", (int,)),
    ("traceState", "trace_state", (str,)),
    ("droppedAttributesCount", "dropped_attributes_count", (int,)),
    ("droppedEventsCount", "dropped_events_count", (int,)),
    ("droppedLinksCount", "dropped_links_count", (int,)),
)


def _check_plain_fields(span: dict[str, Any], where: str) -> None:
    for json_name, proto_name, types in _PLAIN_FIELDS:
        value = _get(span, json_name, proto_name)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise UserError(f"{where}: '{json_name}' has the wrong type ({shown(value)})")


def _scope(scope_obj: dict[str, Any], where: str) -> None:
    scope = scope_obj.get("scope")
    if scope is None:
        return
    scope = _object(scope, f"{where}.scope")
    for key in ("name", "version"):
        if not isinstance(scope.get(key, ""), str):
            raise UserError(f"{where}.scope: '{key}' must be a string")


def spans_from_resource_spans(
    resource_spans: Any, where: str, path: str = "resourceSpans"
) -> list[SpanData]:
    """The spans in a ``resourceSpans`` list.

    Error messages read ``<where>: <path>[i].scopeSpans[j].spans[k]: <reason>``.
    """
    if not isinstance(resource_spans, list):
        raise UserError(f"{where}: '{path}' must be a list")
    spans: list[SpanData] = []
    for i, item in enumerate(resource_spans):
        rs_where = f"{where}: {path}[{i}]"
        rs, resource = resource_of(item, rs_where)
        for j, scope in enumerate(scopes_of(rs, rs_where)):
            ss_where = f"{rs_where}.scopeSpans[{j}]"
            for k, span in enumerate(spans_of_scope(scope, ss_where)):
                spans.append(_span(span, resource, f"{ss_where}.spans[{k}]"))
    return spans


def resource_of(item: Any, rs_where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``resourceSpans`` entry checked as an object, and its resource's attributes."""
    rs = _object(item, rs_where)
    resource_obj = rs.get("resource")
    if resource_obj is None:
        resource_obj = {}
    resource = _attributes(
        _list(_object(resource_obj, rs_where), "attributes", "attributes", rs_where),
        f"{rs_where}.resource",
    )
    return rs, resource


def scopes_of(rs: dict[str, Any], rs_where: str) -> list[Any]:
    """The scopes of a ``resourceSpans`` entry."""
    # "instrumentationLibrarySpans" is the name before OTLP 0.15; old files still have it.
    return _list(rs, "scopeSpans", "scope_spans", rs_where) or _list(
        rs, "instrumentationLibrarySpans", "instrumentation_library_spans", rs_where
    )


def spans_of_scope(scope: Any, ss_where: str) -> list[Any]:
    """The span objects (not yet checked) of one scope, its own fields checked."""
    scope_obj = _object(scope, ss_where)
    _scope(scope_obj, ss_where)
    return _list(scope_obj, "spans", "spans", ss_where)


def span_from_json(obj: Any, resource: dict[str, Any], where: str) -> SpanData:
    """One OTLP/JSON span object as a checked `SpanData` (`where` names it in errors)."""
    return _span(obj, resource, where)


def spans_from_document(obj: Any, where: str, path: str = "") -> list[SpanData]:
    """Spans from one parsed JSON value in any of the shapes that carry ``resourceSpans``.

    An ``ExportTraceServiceRequest``/``TracesData`` (``{"resourceSpans": [...]}``), Jaeger's
    api_v3 answer (``{"result": {...}}``), Tempo's ``{"batches": [...]}`` (``/api/traces``) or
    ``{"trace": {...}}`` (``/api/v2/traces``).
    """
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected an OTLP JSON object, got {_kind(obj)}")
    resource_spans = _get(obj, "resourceSpans", "resource_spans")
    if resource_spans is not None:
        return spans_from_resource_spans(resource_spans, where, f"{path}resourceSpans")
    if isinstance(obj.get("result"), dict) and not path:  # Jaeger api_v3 (wraps once)
        return spans_from_document(obj["result"], where, f"{path}result.")
    if "batches" in obj:  # Tempo /api/traces
        return spans_from_resource_spans(obj["batches"] or [], where, f"{path}batches")
    if isinstance(obj.get("trace"), dict):  # Tempo /api/v2/traces
        trace = obj["trace"]
        return spans_from_resource_spans(
            _get(trace, "resourceSpans", "resource_spans") or [],
            where,
            f"{path}trace.resourceSpans",
        )
    # The Collector's file exporter can share one file between signals; those lines
    # carry no spans, so skipping them loses nothing.
    if any(k in obj for k in ("resourceMetrics", "resourceLogs", "resourceProfiles")):
        return []
    if isinstance(obj.get("error"), dict):
        message = obj["error"].get("message", "")
        raise UserError(f"{where}: the server answered an error: {shown(one_line(message), 80)}")
    if "total" in obj and ("children" in obj or obj.get("name") == "root"):
        raise UserError(f"{where}: this is a timers.json, not spans")
    raise UserError(
        f"{where}: not an OTLP trace export (no 'resourceSpans', Jaeger 'result' "
        "or Tempo 'batches'/'trace')"
    )


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def parse_otlp_json_lines(
    lines: Iterable[str], source: str, limits: Limits = DEFAULT_LIMITS
) -> list[SpanData]:
    """Spans from OTLP/JSON lines (one ``ExportTraceServiceRequest`` per line).

    Raises `UserError` naming `source` and the line for malformed JSON, a wrong shape, a bad
    id, and a last line cut off mid-record (a file still being written or truncated).
    """
    spans: list[SpanData] = []
    for number, line in enumerate(lines, start=1):
        spans.extend(parse_otlp_json_line(line, number, source, limits))
        if len(spans) > limits.max_spans:
            raise UserError(f"{source}: more than {limits.max_spans:,} spans")
    return spans


def parse_otlp_json_line(
    line: str, number: int, source: str, limits: Limits = DEFAULT_LIMITS
) -> list[SpanData]:
    """The spans of line `number` of an OTLP/JSON lines file (none for a blank line).

    A streaming reader calls this per line; errors name `source` and the line.
    """
    text = line.strip()
    if not text:
        return []
    where = f"{source} line {number}"
    try:
        obj = parse_json(text, where, limits)
    except JSONInputError:
        if not line.endswith("\n"):
            skipped = _torn.get()
            if skipped is not None:  # --allow-partial: the run's writer died mid-line
                skipped.append(f"{where} was cut off (its writer was killed or the disk "
                               "filled) and was skipped")
                return []
            raise UserError(
                f"{where}: truncated record (the file ends mid-line; still being written?); "
                "--allow-partial skips it"
            ) from None
        raise
    return spans_from_document(obj, where)


#: While a command runs with --allow-partial: the torn last lines skipped (see `skip_torn`).
_torn: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("torn", default=None)


@contextlib.contextmanager
def torn_last_lines_skipped(on: bool) -> Iterator[list[str]]:
    """Inside (when `on`), a spans file's last line cut off mid-record is skipped rather than
    refused; the list yielded collects one note per skipped line."""
    skipped: list[str] = []
    token = _torn.set(skipped if on else None)
    try:
        yield skipped
    finally:
        _torn.reset(token)


def _is_json_line(line: str) -> bool:
    try:
        parse_json(line, "")
    except UserError:
        return False
    return True


def parse_spans_text(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> list[SpanData]:
    """Spans from a whole file's text: OTLP/JSON lines, or one (pretty-printed) JSON document.

    A saved Jaeger or Tempo answer is one document over many lines; a Collector file has one
    request per line. The first line decides: if it is a JSON value on its own, it is lines.
    Only ``\n`` separates lines: JSON strings may hold U+2028 and the like unescaped.
    """
    if not text.strip():
        return []
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    first = next((line for line in lines if line.strip()), "")
    if _is_json_line(first.strip()):
        return parse_otlp_json_lines(lines, source, limits)
    try:
        doc = parse_json(text, source, limits)
    except JSONInputError as exc:
        if exc.at_end:
            raise UserError(f"{source}: truncated JSON document (the file ends early)") from None
        raise
    spans = spans_from_document(doc, source)
    if len(spans) > limits.max_spans:
        raise UserError(f"{source}: more than {limits.max_spans:,} spans")
    return spans


def read_otlp_json_file(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> list[SpanData]:
    """Read a spans file (plain or gzip): Collector file-exporter lines or a saved answer.

    See `parse_spans_text`; malformed input raises `UserError` with the line number.
    """
    raw = read_input(path, "a spans file", limits)
    source = describe_path(path)
    if raw.startswith(_ZSTD_MAGIC):
        raise UserError(f"{source}: zstd-compressed files are not supported; decompress it first")
    return parse_spans_text(decode_text(raw, source), source, limits)
