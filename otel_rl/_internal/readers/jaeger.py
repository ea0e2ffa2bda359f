"""Jaeger v2 query API (api_v3) -> `SpanData`.

``GET /api/v3/traces/{trace_id}`` answers OTLP/JSON wrapped as ``{"result": {"resourceSpans":
[...]}}`` with hex ids; older builds answer the ``TracesData`` without the wrapper, and a large
trace may come as several such objects one after another. Trace not found: HTTP 404.
"""

from __future__ import annotations

from typing import Any

from otel_rl._internal.errors import UnavailableError, UserError
from otel_rl._internal.readers._common import (
    DEFAULT_TIMEOUT,
    check_base_url,
    error_message,
    http_get_json,
    normalize_trace_id,
)
from otel_rl._internal.readers.boundary import decode_text, parse_json_values
from otel_rl._internal.readers.otlp_json import spans_from_document
from otel_rl._internal.spandata import SpanData

__all__ = ["fetch_jaeger", "parse_jaeger"]


def parse_jaeger(document: Any, source: str = "Jaeger answer") -> list[SpanData]:
    """Spans from a parsed api_v3 answer, or its text (possibly several concatenated objects)."""
    if isinstance(document, (str, bytes)):
        text = decode_text(document, source) if isinstance(document, bytes) else document
        values = parse_json_values(text, source)
        if not values:
            raise UserError(f"{source}: empty answer")
        spans: list[SpanData] = []
        for i, chunk in enumerate(values):
            spans.extend(spans_from_document(chunk, source if i == 0 else f"{source}[{i}]"))
        return spans
    return spans_from_document(document, source)


def fetch_jaeger(url: str, trace_id: str, timeout: float = DEFAULT_TIMEOUT) -> list[SpanData]:
    """Fetch one trace from the Jaeger query service at `url` (e.g. ``http://host:16686``).

    Raises `UserError` when Jaeger cannot be reached, the trace is not there, or the answer is
    malformed.
    """
    base = check_base_url(url, "--jaeger")
    tid = normalize_trace_id(trace_id)
    endpoint = f"{base}/api/v3/traces/{tid}"
    status, payload = http_get_json(endpoint, "Jaeger", base, timeout)
    if status == 404:
        raise UserError(f"trace ID {tid} not found in Jaeger at {base}")
    if status != 200:
        detail = error_message(payload)
        raise UnavailableError(
            f"Jaeger at {base} answered HTTP {status}" + (f": {detail}" if detail else "")
        )
    spans = parse_jaeger(payload, endpoint)
    if not spans:
        raise UserError(f"trace ID {tid} not found in Jaeger at {base} (no spans)")
    return spans
