"""Span records -> OTLP, without SDK objects.

`encode_batches` writes the protobuf wire format of an ``ExportTraceServiceRequest`` directly
(field numbers from opentelemetry-proto's trace.proto); `JsonEncoder` writes the same content as
OTLP/JSON (hex ids, 64-bit integers as strings), the OpenTelemetry Collector file-exporter
format. Both take `Batch`es: records that share a resource, a clock offset and thread names.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from otel_rl._internal import semconv
from otel_rl._internal.record import (
    STARTER_ENDED,
    BlockSpan,
    Extra,
    Record,
    block_span,
    thread_attributes,
)
from otel_rl._internal.shapes import Attributes, AttributeValue

KIND_INTERNAL = 1
STATUS_ERROR = 2


class Columns(NamedTuple):
    """A batch's records as typed columns (what a relayed batch arrived as): buffers of span
    ids, parent ids (``Q``), name indexes into `names` (``I``), starts, ends (``q``) and
    thread ids (``Q``), and the positions of the records with an extra. Lets the metrics count
    a worker's records without a Python step per record."""

    sids: Any
    psids: Any
    name_idx: Any
    names: list[str]
    starts: Any
    ends: Any
    tids: Any
    extras: list[int]


class Batch:
    """Records from one process: `resource` attributes, `offset_ns` turning record times
    (perf_counter_ns) into Unix epoch ns, and thread names by thread id; `columns`: the same
    records as `Columns`, when they arrived so."""

    __slots__ = ("columns", "offset_ns", "records", "resource", "thread_names")

    def __init__(self, resource: Attributes, offset_ns: int, records: Sequence[Record],
                 thread_names: Mapping[int, str] | None = None,
                 columns: Columns | None = None) -> None:
        self.resource = resource
        self.offset_ns = offset_ns
        self.records = records
        self.thread_names = thread_names if thread_names is not None else {}
        self.columns = columns


# --- protobuf wire primitives -----------------------------------------------------------------

def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


_DOUBLE = struct.Struct("<d")
_TIMES = struct.Struct("<BQBQ")  # start (field 7) and end (field 8), both fixed64


def any_value(value: AttributeValue) -> bytes:
    """An OTLP ``AnyValue`` message."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, (list, tuple)):
        items = b"".join(len_field(1, any_value(v)) for v in value)
        return len_field(5, items)
    return len_field(1, str(value).encode("utf-8", "replace"))


def key_value(key: str, value: AttributeValue) -> bytes:
    return len_field(1, key.encode("utf-8", "replace")) + len_field(2, any_value(value))


def attributes_field(number: int, attrs: Attributes) -> bytes:
    return b"".join(len_field(number, key_value(k, v)) for k, v in attrs.items())


def _scope() -> bytes:
    return len_field(1, len_field(1, semconv.SCOPE_NAME.encode())
                      + len_field(2, semconv.SCOPE_VERSION.encode()))


_SCOPE = _scope()


_IDS = struct.Struct(">BBQ")  # span_id (field 2), big-endian bytes
_IDS_PARENT = struct.Struct(">BBQBBQ")  # span_id (field 2) and parent_span_id (field 4)


class Encoder:
    """Caches the bytes that repeat: trace ids, and span names with per-thread attributes.

    Protobuf fields may come in any order, so a span is a handful of ready-made pieces:
    trace id, span/parent ids, name + kind + thread attributes, start/end times.
    """

    def __init__(self) -> None:
        self.names: dict[tuple[str, int, str], bytes] = {}
        self.traces: dict[int, bytes] = {}

    def _name_thread(self, name: str, tid: int, tname: str) -> bytes:
        key = (name, tid, tname)
        cached = self.names.get(key)
        if cached is None:
            if len(self.names) > 65536:
                self.names.clear()
            cached = self.names[key] = (len_field(5, name.encode("utf-8", "replace"))
                                        + b"\x30\x01"
                                        + attributes_field(9, thread_attributes(tid, tname)))
        return cached

    def _trace(self, trace_id: int) -> bytes:
        cached = self.traces.get(trace_id)
        if cached is None:
            if len(self.traces) > 4096:
                self.traces.clear()
            cached = self.traces[trace_id] = b"\x0a\x10" + trace_id.to_bytes(16, "big")
        return cached


def _encode_spans(enc: Encoder, batch: Batch) -> bytes:
    """Every record of a batch as ScopeSpans.spans fields: `Encoder.span` unrolled into one
    loop over local names (this loop is most of the CPU that exporting costs)."""
    offset, thread_names = batch.offset_ns, batch.thread_names
    name_cache, trace_cache = enc.names, enc.traces
    pack_ids, pack_both, pack_times = _IDS.pack, _IDS_PARENT.pack, _TIMES.pack
    out: list[bytes] = []
    append = out.append
    for sid, psid, name, start, end, tid, trace_id, extra in batch.records:
        head = trace_cache.get(trace_id) or enc._trace(trace_id)
        label = name_cache.get((name, tid, thread_names.get(tid, "")))
        if label is None:
            label = enc._name_thread(name, tid, thread_names.get(tid, ""))
        body = (head + (pack_both(0x12, 8, sid, 0x22, 8, psid) if psid else pack_ids(0x12, 8, sid))
                + label + pack_times(0x39, start + offset, 0x41, end + offset))
        if extra:  # the label holds the thread's attributes; the rest of `record.block_span`
            body += _extra(block_span(tid, "", extra), end + offset)
        n = len(body)
        append(b"\x12" + (bytes((n,)) if n < 128 else varint(n)) + body)
    return b"".join(out)


def _extra(span: BlockSpan, end_ns: int) -> bytes:
    """A span's extra attributes, exception event, link and status (Span fields 9, 11, 13,
    15); its thread's attributes are in the cached name label."""
    parts = [attributes_field(9, span.extra_attributes)]
    if span.error_attributes is not None:
        event = (b"\x09" + struct.pack("<Q", end_ns) + len_field(2, b"exception")
                 + attributes_field(3, span.error_attributes))
        parts.append(len_field(11, event))
    if span.link is not None:
        trace_id, span_id = span.link
        parts.append(len_field(13, b"\x0a\x10" + trace_id.to_bytes(16, "big")
                                + b"\x12\x08" + span_id.to_bytes(8, "big")))
    if span.status_message is not None:
        message = span.status_message.encode("utf-8", "replace")
        parts.append(len_field(15, len_field(2, message) + b"\x18\x02"))
    return b"".join(parts)


def resource_bytes(resource: Attributes) -> bytes:
    """The ``Resource`` message (field 1 of ResourceSpans) for these attributes."""
    return len_field(1, attributes_field(1, resource))


def encode_batches(batches: Iterable[Batch], encoder: Encoder | None = None) -> bytes:
    """Serialise batches as one ``ExportTraceServiceRequest``."""
    enc = encoder or Encoder()
    out = []
    for batch in batches:
        if not batch.records:
            continue
        scope_spans = len_field(2, _SCOPE + _encode_spans(enc, batch))
        out.append(len_field(1, resource_bytes(batch.resource) + scope_spans))
    return b"".join(out)



# --- OTLP/JSON ---------------------------------------------------------------------------------

def json_value(value: AttributeValue) -> dict[str, object]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [json_value(v) for v in value]}}
    return {"stringValue": str(value)}


def json_attributes(attrs: Attributes) -> list[dict[str, object]]:
    return [{"key": k, "value": json_value(v)} for k, v in attrs.items()]


def _json_span(record: Record, offset: int, thread_names: Mapping[int, str]) -> dict[str, Any]:
    sid, psid, name, start, end, tid, trace_id, extra = record
    parts = block_span(tid, thread_names.get(tid, ""), extra)
    span: dict[str, Any] = {
        "traceId": f"{trace_id:032x}",
        "spanId": f"{sid:016x}",
        "parentSpanId": f"{psid:016x}" if psid else "",
        "name": name,
        "kind": KIND_INTERNAL,
        "startTimeUnixNano": str(start + offset),
        "endTimeUnixNano": str(end + offset),
    }
    span["attributes"] = json_attributes(parts.attributes)
    if parts.error_attributes is not None:
        span["events"] = [{"timeUnixNano": str(end + offset), "name": "exception",
                           "attributes": json_attributes(parts.error_attributes)}]
        span["status"] = {"code": STATUS_ERROR, "message": parts.status_message}
    else:
        span["status"] = {}
    if parts.link is not None:
        span["links"] = [{"traceId": f"{parts.link[0]:032x}", "spanId": f"{parts.link[1]:016x}"}]
    return span


_JSON_SCOPE = json.dumps({"name": semconv.SCOPE_NAME, "version": semconv.SCOPE_VERSION},
                         separators=(",", ":"))


class JsonEncoder:
    """OTLP/JSON lines (hex ids, 64-bit integers as strings) from cached string pieces; the
    same content as `encode_batches` writes as protobuf."""

    def __init__(self) -> None:
        #: (name, thread id, thread name) -> the span's text from its name to its start time's
        #: opening quote (its attributes: its thread's); `ended`, the same for a span whose
        #: extra is `record.STARTER_ENDED` (its thread's attributes, then that one); trace id
        #: -> the text up to its span id's.
        self.names: dict[tuple[str, int, str], str] = {}
        self.ended: dict[tuple[str, int, str], str] = {}
        self.traces: dict[int, str] = {}

    def _name_thread(self, name: str, tid: int, tname: str,
                     extra: Extra | None = None) -> str:
        key = (name, tid, tname)
        labels = self.ended if extra else self.names
        cached = labels.get(key)
        if cached is None:
            if len(labels) > 65536:
                labels.clear()
            attrs = json.dumps(json_attributes(block_span(tid, tname, extra).attributes),
                               separators=(",", ":"))
            cached = labels[key] = (f'","name":{json.dumps(name)},"kind":1,'
                                    f'"attributes":{attrs},"startTimeUnixNano":"')
        return cached

    def _trace(self, trace_id: int) -> str:
        cached = self.traces.get(trace_id)
        if cached is None:
            if len(self.traces) > 4096:
                self.traces.clear()
            cached = self.traces[trace_id] = f'{{"traceId":"{trace_id:032x}","spanId":"'
        return cached

    def span(self, record: Record, offset: int, thread_names: Mapping[int, str]) -> str:
        return self.spans((record,), offset, thread_names)[0]

    def spans(self, records: Iterable[Record], offset: int,
              thread_names: Mapping[int, str]) -> list[str]:
        """Each record's span as OTLP/JSON: the common record (no extra, or the shared
        `STARTER_ENDED`) from cached pieces in one loop over local names (most of what
        writing the spans file costs), one with any other extra through `_json_span`."""
        names, ended, traces = self.names, self.ended, self.traces
        tname_of = thread_names.get
        out: list[str] = []
        append = out.append
        for record in records:
            sid, psid, name, start, end, tid, trace_id, extra = record
            if extra:
                if extra is not STARTER_ENDED:
                    append(json.dumps(_json_span(record, offset, thread_names),
                                      separators=(",", ":")))
                    continue
                labels = ended
            else:
                labels = names
            head = traces.get(trace_id) or self._trace(trace_id)
            tname = tname_of(tid, "")
            label = labels.get((name, tid, tname)) or self._name_thread(name, tid, tname, extra)
            append(f'{head}{sid:016x}","parentSpanId":"{psid:016x}{label}{start + offset}'
                   f'","endTimeUnixNano":"{end + offset}","status":{{}}}}' if psid else
                   f'{head}{sid:016x}","parentSpanId":"{label}{start + offset}'
                   f'","endTimeUnixNano":"{end + offset}","status":{{}}}}')
        return out

    def request_line(self, batches: Iterable[Batch]) -> str:
        """One ``ExportTraceServiceRequest`` as a line of OTLP/JSON (no newline)."""
        return json_request([
            (json_resource(batch.resource),
             self.spans(batch.records, batch.offset_ns, batch.thread_names))
            for batch in batches if batch.records])


def json_resource(resource: Attributes) -> str:
    """A ``Resource`` as OTLP/JSON."""
    return json.dumps({"attributes": json_attributes(resource)}, separators=(",", ":"))


def json_request(groups: Iterable[tuple[str, Sequence[str]]]) -> str:
    """An ``ExportTraceServiceRequest`` line from (resource JSON, its spans' JSON) groups."""
    return '{"resourceSpans":[' + ",".join(
        f'{{"resource":{resource},"scopeSpans":[{{"scope":{_JSON_SCOPE},'
        f'"spans":[{",".join(spans)}]}}]}}' for resource, spans in groups) + "]}"
