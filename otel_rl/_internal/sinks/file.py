"""`FileSink`: the pipeline's batches as an OTLP-JSON spans file (one request a line)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any

from otel_rl._internal import atomic, log, timeline_side
from otel_rl._internal.otlp import records
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.sinks.base import Sink, Stats, chunk_batches, span_count
from otel_rl._internal.sinks.timeline import TimelineKeeper

__all__ = ["FileSink"]

#: Spans per line of a spans file at most.
LINE_SPANS = 2048
#: Bytes the spans file leaves free on its disk at least, so that timers.json (written at
#: every checkpoint and at exit) still fits once the big file has filled the disk.
MIN_RESERVE = 1 << 20
_NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class FileSink(Sink):
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per line (the Collector's file
    exporter format), so the file can be replayed or turned back into a tree.

    A line is written whole or not at all: a failed write is cut back to the end of the last
    whole line (a reader never meets a torn last line from this process). The file stops
    growing before the disk is full (`reserve`): the spans that no longer fit are lost as
    "disk full", and timers.json keeps its room.

    With `timeline` (the run's spans file, which report.html draws), the longest spans written
    are kept and, at shutdown, put in the side file `timeline_side` describes, if this sink
    wrote the whole file."""

    name = "file"

    def __init__(self, path: str, stats: Stats, reserve: int = MIN_RESERVE,
                 timeline: bool = False) -> None:
        self.path = path
        self.label = path
        self.reserve = reserve
        self._stats = stats
        self._fd: int | None = None
        self._size = 0
        self._encoder = records.JsonEncoder()
        self._timeline = TimelineKeeper() if timeline else None
        #: After shutdown, the keeper of a file this sink wrote (`timeline_spans`).
        self._kept: TimelineKeeper | None = None

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        n = span_count(batches)
        if n == 0:
            return
        written = 0
        try:
            if self._fd is None:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self._size = os.fstat(self._fd).st_size
                if self._timeline is not None:
                    self._open_timeline()
            # One request per line of at most LINE_SPANS spans, as the Collector writes one
            # per export: a reader can stream the file a line at a time.
            for request in chunk_batches(batches, LINE_SPANS):
                if self._timeline is not None:
                    # Thread names as this line is written (a batch may hold the live map of
                    # its process): the kept spans get the names the file has.
                    request = [Batch(b.resource, b.offset_ns, b.records, dict(b.thread_names))
                               for b in request]
                line = (self._encoder.request_line(request) + "\n").encode("utf-8")
                self._check_room(len(line))
                spans = span_count(request)
                self._stats.sending(self.name, spans, (self._size, self._size + len(line)))
                self._write_line(line)
                written += spans
                self._stats.add_exported(self.name, spans)  # per line: exact if killed
                if self._timeline is not None:
                    self._keep(request)
        except OSError as exc:
            full = exc.errno in _NO_SPACE
            self._stats.add_dropped("disk full" if full else "error", n - written, self.name,
                                    f"cannot write {self.path}: {exc.strerror or exc}")
            if not full:
                self._stats.warn_once(f"file-{self.path}",
                                      f"cannot write spans to {self.path}: {exc}")
        except Exception as exc:
            self._stats.add_dropped("error", n - written, self.name, f"{self.path}: {exc!r}")
            self._stats.warn_once(f"file-{self.path}", f"cannot write spans to {self.path}: {exc}")

    def timeline_spans(self) -> tuple[list[Any], int] | None:
        """Once shut down: what a read of the spans file gives report.html's timeline, from
        the spans this sink kept as it wrote them (`TimelineKeeper.chosen`); None unless it
        wrote the file, and the file is still all it wrote."""
        kept = self._kept
        if kept is None or self._fd is not None:
            return None
        try:
            return kept.chosen(self.path, self._size)
        except OSError:
            return None

    def _check_room(self, size: int) -> None:
        assert self._fd is not None
        try:
            st = os.fstatvfs(self._fd)
        except (OSError, AttributeError):
            return  # no statvfs here (Windows): the write itself will say
        if st.f_bavail * st.f_frsize - size < self.reserve:
            raise OSError(errno.ENOSPC, f"fewer than {self.reserve} bytes would be left free "
                                        "(kept for timers.json)")

    def _write_line(self, line: bytes) -> None:
        fd = self._fd
        assert fd is not None
        view = memoryview(line)
        done = 0
        try:
            while done < len(line):
                done += os.write(fd, view[done:])
        except OSError:
            if done:
                try:  # never leave a torn line behind
                    os.ftruncate(fd, self._size)
                except OSError:
                    pass
            raise
        self._size += len(line)

    def _open_timeline(self) -> None:
        try:  # an older side file no longer describes the file
            os.unlink(timeline_side.side_path(self.path))
        except OSError:
            pass
        if self._size:  # spans of another writer (an earlier run) the keeper never saw
            self._timeline = None

    def _keep(self, request: Sequence[Batch]) -> None:
        try:
            assert self._timeline is not None
            self._timeline.written(request)
        except Exception as exc:  # the report then reads the whole file; no span is lost
            self._timeline = None
            log.info("otel_rl: not keeping the timeline's spans: %r", exc)

    def shutdown(self, deadline: float) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        timeline, self._timeline = self._timeline, None
        if fd is not None and timeline is not None:
            self._kept = timeline
            try:
                side = timeline.side_file(self.path, self._size, self._encoder)
                if side is not None:
                    # timers.json is written once more after this: its room stays free.
                    st = os.statvfs(os.path.dirname(self.path) or ".")
                    if st.f_bavail * st.f_frsize - len(side) >= self.reserve:
                        atomic.write_bytes(timeline_side.side_path(self.path), side)
            except Exception as exc:  # the report then reads the whole file
                log.info("otel_rl: no timeline side file: %r", exc)
