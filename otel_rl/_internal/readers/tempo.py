"""Grafana Tempo trace-by-id API -> `SpanData`.

``GET /api/v2/traces/<id>`` answers ``{"trace": {"resourceSpans": [...]}}`` (and a ``status``
of ``PARTIAL`` when Tempo cut a trace that outgrew its limits); the older ``GET
/api/traces/<id>`` answers ``{"batches": [ResourceSpans...]}``. In both, ids are base64 and
enums are names (``"SPAN_KIND_INTERNAL"``, ``"STATUS_CODE_ERROR"``).
"""

from __future__ import annotations

from typing import Any

from otel_rl._internal.errors import UnavailableError, UserError, one_line
from otel_rl._internal.readers._common import (
    DEFAULT_TIMEOUT,
    SpanList,
    check_base_url,
    error_message,
    http_get_json,
    normalize_trace_id,
)
from otel_rl._internal.readers.otlp_json import spans_from_document

__all__ = ["fetch_tempo", "parse_tempo"]


def parse_tempo(document: Any, source: str = "Tempo answer") -> SpanList:
    """Spans from a parsed Tempo answer (either endpoint's shape); notes say if it is partial."""
    if not isinstance(document, dict) or not ("batches" in document or "trace" in document):
        if isinstance(document, dict) and "resourceSpans" in document:
            return SpanList(spans_from_document(document, source))
        raise UserError(f"{source}: not a Tempo trace (no 'batches' or 'trace')")
    spans = SpanList(spans_from_document(document, source))
    status = document.get("status")
    if isinstance(status, str) and status.strip().upper() in ("PARTIAL", "PARTIAL_STATUS"):
        message = one_line(document.get("message") or "")
        spans.notes.append(
            "Tempo returned only part of the trace" + (f" ({message})" if message else "")
        )
    return spans


def fetch_tempo(url: str, trace_id: str, timeout: float = DEFAULT_TIMEOUT) -> SpanList:
    """Fetch one trace from Tempo at `url` (e.g. ``http://host:3200``).

    Tries ``/api/v2/traces`` first and falls back to ``/api/traces`` for Tempo versions
    without it. Raises `UserError` when Tempo cannot be reached or the trace is not there.
    """
    base = check_base_url(url, "--tempo")
    tid = normalize_trace_id(trace_id)
    for path in (f"/api/v2/traces/{tid}", f"/api/traces/{tid}"):
        endpoint = base + path
        status, payload = http_get_json(endpoint, "Tempo", base, timeout)
        if status == 404:
            continue
        if status != 200:
            detail = error_message(payload)
            raise UnavailableError(
                f"Tempo at {base} answered HTTP {status}" + (f": {detail}" if detail else "")
            )
        spans = parse_tempo(payload, endpoint)
        if spans:
            return spans
    raise UserError(f"trace ID {tid} not found in Tempo at {base}")
