"""OTLP metrics -> protobuf, without SDK or protobuf-library objects.

`encode_metrics` writes an ``ExportMetricsServiceRequest`` directly (field numbers from
opentelemetry-proto's metrics.proto), as `records.encode_batches` does for spans. The data
model is small and plain: a `Metric` holds its points; every point is cumulative (OTLP
``AGGREGATION_TEMPORALITY_CUMULATIVE``), which is what Prometheus' OTLP receiver stores without
a feature flag.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Literal

from otel_rl._internal.otlp.records import attributes_field, len_field, resource_bytes, varint
from otel_rl._internal.shapes import Attributes

__all__ = ["Exemplar", "ExponentialPoint", "HistogramPoint", "Metric", "NumberPoint",
           "encode_metrics"]

CUMULATIVE = 2
_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_SFIXED64 = struct.Struct("<q")

MetricKind = Literal["gauge", "sum", "histogram", "exponential_histogram"]


class Exemplar:
    """One measurement tied to a span: its value, time (Unix ns) and ids."""

    __slots__ = ("span_id", "time_ns", "trace_id", "value")

    def __init__(self, value: float, time_ns: int, trace_id: int, span_id: int) -> None:
        self.value, self.time_ns = value, time_ns
        self.trace_id, self.span_id = trace_id, span_id

    def encode(self) -> bytes:
        return (b"\x11" + _FIXED64.pack(self.time_ns) + b"\x19" + _DOUBLE.pack(self.value)
                + b"\x22\x08" + self.span_id.to_bytes(8, "big")
                + b"\x2a\x10" + self.trace_id.to_bytes(16, "big"))


class NumberPoint:
    """A gauge or sum point: a double, or an int (``as_int``)."""

    __slots__ = ("attributes", "start_ns", "time_ns", "value")

    def __init__(self, attributes: Attributes, value: float | int, time_ns: int,
                 start_ns: int = 0) -> None:
        self.attributes, self.value = attributes, value
        self.time_ns, self.start_ns = time_ns, start_ns

    def encode(self) -> bytes:
        body = attributes_field(7, self.attributes)
        if self.start_ns:
            body += b"\x11" + _FIXED64.pack(self.start_ns)
        body += b"\x19" + _FIXED64.pack(self.time_ns)
        if isinstance(self.value, int) and not isinstance(self.value, bool):
            body += b"\x31" + _SFIXED64.pack(self.value)
        else:
            body += b"\x21" + _DOUBLE.pack(float(self.value))
        return body


class HistogramPoint:
    """An explicit-bucket histogram point: ``len(bounds) + 1`` bucket counts."""

    __slots__ = ("attributes", "bounds", "counts", "exemplars", "max", "min", "start_ns", "sum",
                 "time_ns")

    def __init__(self, attributes: Attributes, bounds: Sequence[float], counts: Sequence[int],
                 total: float, start_ns: int, time_ns: int, minimum: float | None = None,
                 maximum: float | None = None, exemplars: Sequence[Exemplar] = ()) -> None:
        self.attributes, self.bounds, self.counts = attributes, bounds, counts
        self.sum, self.start_ns, self.time_ns = total, start_ns, time_ns
        self.min, self.max, self.exemplars = minimum, maximum, exemplars

    def encode(self) -> bytes:
        counts = b"".join(_FIXED64.pack(c) for c in self.counts)
        bounds = b"".join(_DOUBLE.pack(b) for b in self.bounds)
        body = (attributes_field(9, self.attributes)
                + b"\x11" + _FIXED64.pack(self.start_ns) + b"\x19" + _FIXED64.pack(self.time_ns)
                + b"\x21" + _FIXED64.pack(sum(self.counts)) + b"\x29" + _DOUBLE.pack(self.sum)
                + len_field(6, counts) + len_field(7, bounds))
        body += b"".join(len_field(8, e.encode()) for e in self.exemplars)
        if self.min is not None and self.max is not None:
            body += b"\x59" + _DOUBLE.pack(self.min) + b"\x61" + _DOUBLE.pack(self.max)
        return body


def _zigzag(value: int) -> bytes:
    return varint((value << 1) ^ (value >> 63) if value < 0 else value << 1)


class ExponentialPoint:
    """A base-2 exponential histogram point: bucket `offset + i` counts values in
    ``(2**((offset + i) / 2**scale), 2**((offset + i + 1) / 2**scale)]``."""

    __slots__ = ("attributes", "counts", "exemplars", "offset", "scale", "start_ns", "sum",
                 "time_ns", "zero_count")

    def __init__(self, attributes: Attributes, scale: int, offset: int, counts: Sequence[int],
                 zero_count: int, total: float, start_ns: int, time_ns: int,
                 exemplars: Sequence[Exemplar] = ()) -> None:
        self.attributes, self.scale, self.offset, self.counts = attributes, scale, offset, counts
        self.zero_count, self.sum, self.start_ns, self.time_ns = zero_count, total, start_ns, time_ns
        self.exemplars = exemplars

    def encode(self) -> bytes:
        buckets = b"\x08" + _zigzag(self.offset) + len_field(
            2, b"".join(varint(c) for c in self.counts))
        body = (attributes_field(1, self.attributes)
                + b"\x11" + _FIXED64.pack(self.start_ns) + b"\x19" + _FIXED64.pack(self.time_ns)
                + b"\x21" + _FIXED64.pack(sum(self.counts) + self.zero_count)
                + b"\x29" + _DOUBLE.pack(self.sum) + b"\x30" + _zigzag(self.scale)
                + b"\x39" + _FIXED64.pack(self.zero_count) + len_field(8, buckets))
        return body + b"".join(len_field(11, e.encode()) for e in self.exemplars)


class Metric:
    """One instrument's stream: name, unit, description, kind and points."""

    __slots__ = ("description", "kind", "monotonic", "name", "points", "unit")

    def __init__(self, name: str, kind: MetricKind,
                 points: Sequence[NumberPoint | HistogramPoint | ExponentialPoint],
                 unit: str = "", description: str = "", monotonic: bool = True) -> None:
        self.name, self.kind, self.points = name, kind, points
        self.unit, self.description, self.monotonic = unit, description, monotonic

    def encode(self) -> bytes:
        points = b"".join(len_field(1, p.encode()) for p in self.points)
        if self.kind == "gauge":
            data = len_field(5, points)
        elif self.kind == "sum":
            data = len_field(7, points + b"\x10" + varint(CUMULATIVE)
                              + b"\x18" + (b"\x01" if self.monotonic else b"\x00"))
        elif self.kind == "histogram":
            data = len_field(9, points + b"\x10" + varint(CUMULATIVE))
        else:
            data = len_field(10, points + b"\x10" + varint(CUMULATIVE))
        head = len_field(1, self.name.encode("utf-8", "replace"))
        if self.description:
            head += len_field(2, self.description.encode("utf-8", "replace"))
        if self.unit:
            head += len_field(3, self.unit.encode("utf-8", "replace"))
        return head + data


def _scope(name: str, version: str) -> bytes:
    return len_field(1, len_field(1, name.encode()) + len_field(2, version.encode()))


def encode_metrics(resource: Attributes, metrics: Iterable[Metric], *, scope: str = "otel_rl",
                   version: str = "0.1.0") -> bytes:
    """One ``ExportMetricsServiceRequest``: one resource, one scope, these metrics."""
    body = b"".join(len_field(2, m.encode()) for m in metrics if m.points)
    scope_metrics = len_field(2, _scope(scope, version) + body)
    return len_field(1, resource_bytes(resource) + scope_metrics)
