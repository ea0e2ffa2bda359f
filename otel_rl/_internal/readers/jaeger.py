"""Jaeger v2 query API (api_v3) -> `SpanData`.

``GET /api/v3/traces/{trace_id}`` answers OTLP/JSON wrapped as ``{"result": {"resourceSpans":
[...]}}`` with hex ids; older builds answer the ``TracesData`` without the wrapper, and a large
trace may come as several such objects one after another. Trace not found: HTTP 404.
"""

from __future__ import annotations

import json
from typing import Any

from otel_rl._internal.errors import UserError
from otel_rl._internal.readers._common import (
    DEFAULT_TIMEOUT,
    error_message,
    http_get_json,
    normalize_trace_id,
)
from otel_rl._internal.readers.otlp_json import spans_from_document
from otel_rl._internal.spandata import SpanData

__all__ = ["fetch_jaeger", "parse_jaeger"]


def parse_jaeger(document: Any, source: str = "Jaeger answer") -> list[SpanData]:
    """Spans from a parsed api_v3 answer, or its text (possibly several concatenated objects)."""
    if isinstance(document, (str, bytes)):
        text = document.decode("utf-8") if isinstance(document, bytes) else document
        spans: list[SpanData] = []
        for i, chunk in enumerate(_json_values(text, source)):
            spans.extend(spans_from_document(chunk, source if i == 0 else f"{source}[{i}]"))
        return spans
    return spans_from_document(document, source)


def fetch_jaeger(url: str, trace_id: str, timeout: float = DEFAULT_TIMEOUT) -> list[SpanData]:
    """Fetch one trace from the Jaeger query service at `url` (e.g. ``http://host:16686``).

    Raises `UserError` when Jaeger cannot be reached, the trace is not there, or the answer is
    malformed.
    """
    tid = normalize_trace_id(trace_id)
    base = url.rstrip("/")
    endpoint = f"{base}/api/v3/traces/{tid}"
    status, payload = http_get_json(endpoint, "Jaeger", base, timeout)
    if status == 404:
        raise UserError(f"trace ID {tid} not found in Jaeger at {base}")
    if status != 200:
        detail = error_message(payload)
        raise UserError(
            f"Jaeger at {base} answered HTTP {status}" + (f": {detail}" if detail else "")
        )
    spans = parse_jaeger(payload, endpoint)
    if not spans:
        raise UserError(f"trace ID {tid} not found in Jaeger at {base} (no spans)")
    return spans


def _json_values(text: str, source: str) -> list[Any]:
    decoder = json.JSONDecoder()
    values = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{source} line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        values.append(value)
    if not values:
        raise UserError(f"{source}: empty answer")
    return values
