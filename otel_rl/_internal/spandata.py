"""A backend-neutral span, the common currency of every offline tool.

Readers turn OTLP-JSON files, Jaeger api/v3 responses, Tempo responses and OTel SDK
`ReadableSpan`s into `SpanData`; the tree builder and the reports consume only `SpanData`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SpanData:
    """One finished span, ids as lowercase hex, times as Unix epoch nanoseconds."""

    trace_id: str  # 32 hex chars
    span_id: str  # 16 hex chars
    parent_span_id: str  # "" for a root span
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    is_error: bool = False
    events: list[SpanEvent] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace_id, span_id)

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9
