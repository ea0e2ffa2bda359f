"""Readers: every source of finished spans -> ``list[SpanData]``.

- `read_spans_file`: an OTLP/JSON spans file (the Collector's file exporter, otel_rl's own
  spans file, or a saved Jaeger/Tempo answer), plain or gzip.
- `fetch_jaeger` / `fetch_tempo`: one trace by id from a running backend.
- ``readers.sdk.spans_from_sdk``: OTel SDK ``ReadableSpan``s (imported on demand, so the
  CLI does not pay for the SDK).

Malformed input raises `UserError` with a one-line reason and, for files, the line number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_rl._internal.readers._common import SpanList, normalize_trace_id
    from otel_rl._internal.readers.jaeger import fetch_jaeger, parse_jaeger
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file as read_spans_file
    from otel_rl._internal.readers.tempo import fetch_tempo, parse_tempo

#: Loaded on first use: a reader of files (``otel-rl run``'s report) does not pay for the
#: HTTP clients of the backend readers.
_LAZY = {
    "SpanList": ("_common", "SpanList"),
    "normalize_trace_id": ("_common", "normalize_trace_id"),
    "fetch_jaeger": ("jaeger", "fetch_jaeger"),
    "parse_jaeger": ("jaeger", "parse_jaeger"),
    "read_spans_file": ("otlp_json", "read_otlp_json_file"),
    "fetch_tempo": ("tempo", "fetch_tempo"),
    "parse_tempo": ("tempo", "parse_tempo"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


__all__ = [
    "SpanList",
    "fetch_jaeger",
    "fetch_tempo",
    "normalize_trace_id",
    "parse_jaeger",
    "parse_tempo",
    "read_spans_file",
]
