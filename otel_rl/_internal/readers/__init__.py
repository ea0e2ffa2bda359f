"""Readers: every source of finished spans -> ``list[SpanData]``.

- `read_spans_file`: an OTLP/JSON spans file (the Collector's file exporter, otel_rl's own
  spans file, or a saved Jaeger/Tempo answer), plain or gzip.
- `fetch_jaeger` / `fetch_tempo`: one trace by id from a running backend.
- ``readers.sdk.spans_from_sdk``: OTel SDK ``ReadableSpan``s (imported on demand, so the
  CLI does not pay for the SDK).

Malformed input raises `UserError` with a one-line reason and, for files, the line number.
"""

from __future__ import annotations

from otel_rl._internal.readers._common import SpanList, normalize_trace_id
from otel_rl._internal.readers.jaeger import fetch_jaeger, parse_jaeger
from otel_rl._internal.readers.otlp_json import read_otlp_json_file as read_spans_file
from otel_rl._internal.readers.tempo import fetch_tempo, parse_tempo

__all__ = [
    "SpanList",
    "fetch_jaeger",
    "fetch_tempo",
    "normalize_trace_id",
    "parse_jaeger",
    "parse_tempo",
    "read_spans_file",
]
