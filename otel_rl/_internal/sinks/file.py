"""`FileSink`: the pipeline's batches as an OTLP-JSON spans file (one request a line)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

from otel_rl._internal.otlp import records
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.sinks.base import Sink, Stats, chunk_batches, span_count

__all__ = ["FileSink"]

#: Spans per line of a spans file at most.
LINE_SPANS = 2048


class FileSink(Sink):
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per line (the Collector's file
    exporter format), so the file can be replayed or turned back into a tree."""

    name = "file"

    def __init__(self, path: str, stats: Stats) -> None:
        self.path = path
        self._stats = stats
        self._file: TextIO | None = None
        self._encoder = records.JsonEncoder()

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        n = span_count(batches)
        if n == 0:
            return
        try:
            if self._file is None:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")
            # One request per line of at most LINE_SPANS spans, as the Collector writes one
            # per export: a reader can stream the file a line at a time.
            for request in chunk_batches(batches, LINE_SPANS):
                self._file.write(self._encoder.request_line(request) + "\n")
            self._file.flush()
            self._stats.add_exported(self.name, n)
        except Exception as exc:
            self._stats.add_dropped(f"cannot write {self.path}", n)
            self._stats.warn_once(f"file-{self.path}", f"cannot write spans to {self.path}: {exc}")

    def shutdown(self, deadline: float) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except Exception:
                pass
