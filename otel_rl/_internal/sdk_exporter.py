"""`TimerTreeExporter`: a standard OTel ``SpanExporter`` that keeps the timer tree.

Plug it into any OTel SDK pipeline (``SimpleSpanProcessor`` or ``BatchSpanProcessor``) — with
otel_rl's spans or any other instrumentation's — and read the ML-Agents-style tree built
from the spans it has seen, by the same `build_tree` that ``otel-rl tree`` uses::

    exporter = TimerTreeExporter()
    provider.add_span_processor(ThreadAttributesSpanProcessor())  # see parallel branches
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ...
    print(exporter.timer_tree())   # the get_timer_tree() dict
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_rl._internal import semconv
from otel_rl._internal.readers.sdk import span_from_sdk
from otel_rl._internal.shapes import TimersDict
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree
from otel_rl._internal.treebuild import build_tree

__all__ = ["ThreadAttributesSpanProcessor", "TimerTreeExporter"]


class TimerTreeExporter(SpanExporter):
    """Collects exported spans and builds the timer tree from them on demand. Thread-safe.

    Accepts SDK ``ReadableSpan``s and otel_rl `SpanData`. Spans whose parent has not ended
    yet make the tree incomplete (`Tree.complete` is False, `Tree.notes` say why) until the
    parent arrives.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[SpanData] = []
        self._stopped = False

    def export(self, spans: Sequence[ReadableSpan | SpanData]) -> SpanExportResult:
        """Keep `spans`; after `shutdown` nothing more is accepted."""
        converted = [span if isinstance(span, SpanData) else span_from_sdk(span) for span in spans]
        with self._lock:
            if self._stopped:
                return SpanExportResult.FAILURE
            self._spans.extend(span for span in converted if span is not None)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Stop accepting spans; what was collected stays readable."""
        with self._lock:
            self._stopped = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered, so there is never anything to flush."""
        return True

    def spans(self) -> list[SpanData]:
        """A copy of the spans collected so far."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        """Forget the spans collected so far."""
        with self._lock:
            self._spans.clear()

    def tree(self) -> Tree:
        """The `Tree` built from the spans collected so far."""
        return build_tree(self.spans())

    def timer_tree(self) -> TimersDict:
        """The tree as ML-Agents' ``get_timer_tree()`` dict (`Tree.to_dict`)."""
        return self.tree().to_dict()


class ThreadAttributesSpanProcessor(SpanProcessor):
    """Sets the ``thread.id``/``thread.name`` span attributes when a span starts.

    The tree marks a span in another thread than its parent as a parallel branch, which it can
    only see when spans carry ``thread.id`` (the OTel semantic convention). otel_rl's own spans
    do; add this processor so plain OTel SDK spans do too.
    """

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span.attributes is not None and semconv.THREAD_ID in span.attributes:
            return  # the instrumentation knows better
        span.set_attribute(semconv.THREAD_ID, threading.get_ident())
        span.set_attribute(semconv.THREAD_NAME, threading.current_thread().name)
