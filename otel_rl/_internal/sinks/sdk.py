"""`SpanExporterSink`: the pipeline's records as OTel SDK `ReadableSpan`s for any standard
`SpanExporter` (converted off the hot path)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_rl._internal import semconv
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.record import block_span
from otel_rl._internal.sinks.base import Sink, Stats, span_count

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope(semconv.SCOPE_NAME, semconv.SCOPE_VERSION)


def to_readable_spans(batches: Sequence[Batch]) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []
    for batch in batches:
        resource = Resource(dict(batch.resource))
        offset = batch.offset_ns
        for record in batch.records:
            sid, psid, name, start, end, tid, trace_id, extra = record
            parts = block_span(tid, batch.thread_names.get(tid, ""), extra)
            attrs: dict[str, Any] = parts.attributes
            events = []
            status = Status(StatusCode.UNSET)
            if parts.error_attributes is not None:
                events.append(Event("exception", parts.error_attributes, end + offset))
                status = Status(StatusCode.ERROR, parts.status_message)
            links = []
            if parts.link is not None:
                ltrace, lspan = parts.link
                links.append(Link(SpanContext(ltrace, lspan, False, _SAMPLED)))
            context = SpanContext(trace_id, sid, False, _SAMPLED)
            parent = SpanContext(trace_id, psid, False, _SAMPLED) if psid else None
            spans.append(ReadableSpan(
                name=name, context=context, parent=parent, resource=resource,
                attributes=attrs, events=events, links=links, kind=SpanKind.INTERNAL,
                status=status, start_time=start + offset, end_time=end + offset,
                instrumentation_scope=_SCOPE,
            ))
    return spans


class SpanExporterSink(Sink):
    """Feeds a standard OTel `SpanExporter` with SDK `ReadableSpan`s made from the records."""

    def __init__(self, exporter: SpanExporter, stats: Stats) -> None:
        self.exporter = exporter
        self.name = f"exporter:{type(exporter).__name__}"
        self.label = self.name
        self._stats = stats

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        n = span_count(batches)
        if n == 0:
            return
        try:
            spans = to_readable_spans(batches)
            # Handed to the exporter now: if the process dies before it returns, it may have
            # sent them (a survivor calls them unconfirmed, not lost).
            self._stats.sending(self.name, n)
            result = self.exporter.export(spans)
            ok = getattr(result, "name", "SUCCESS") == "SUCCESS"
        except Exception as exc:
            self._stats.warn_once(f"exporter-{id(self.exporter)}",
                                  f"{type(self.exporter).__name__}.export raised {exc!r}")
            ok = False
        if ok:
            self._stats.add_exported(self.name, n)
        else:
            self._stats.add_dropped("error", n, self.name,
                                    f"{type(self.exporter).__name__}.export failed")

    def shutdown(self, deadline: float) -> None:
        try:
            self.exporter.force_flush(max(0, int((deadline - time.monotonic()) * 1000)))
        except Exception:
            pass
        try:
            self.exporter.shutdown()
        except Exception:
            pass
