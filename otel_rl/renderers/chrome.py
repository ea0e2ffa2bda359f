"""Spans as the Chrome trace-event format (JSON object form), which Perfetto, chrome://tracing
and speedscope open; what torch.profiler and ``ray timeline`` write.

Streamed: `render_chunks` takes spans one at a time and yields text pieces, so a spans file of
any size becomes a trace in memory that grows only with the number of processes and threads.

- One track per process and thread: a ``process_name`` / ``thread_name`` metadata event ('M')
  the first time a process or thread appears (metadata may come anywhere in the array). The
  track's pid is the span's ``process.pid`` (another number when two hosts share a pid), its
  tid the ``thread.id`` attribute.
- Each timed block is a complete event ('X'): ``ts`` and ``dur`` in microseconds (the format's
  unit; nanoseconds kept as three decimals), the span's attributes, trace and span ids under
  ``args``. Blocks of one thread nest by time, as the viewers draw them.
- Left out, because they are not a block's run: aggregate spans, window spans and window
  continuations (clipped repeats of a long block in a later window, which would overlap the
  block's own span on the same track). A run span and process marker spans are kept: they
  frame each process's track.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from otel_rl._internal import semconv
from otel_rl._internal.spandata import SpanData

__all__ = ["render_chunks"]

_SKIP_KINDS = frozenset((semconv.KIND_AGGREGATE, semconv.KIND_WINDOW))
_HIDDEN = frozenset((semconv.THREAD_ID, semconv.THREAD_NAME))


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=str)


def _plain(value: Any) -> Any:
    """An attribute value the format's ``args`` can hold (strict JSON: no NaN)."""
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class _Tracks:
    """Process and thread ids of the output, and which were named already."""

    def __init__(self) -> None:
        self.pids: dict[tuple[str, Any, str], int] = {}
        self.used: set[int] = set()
        self.threads: set[tuple[int, int]] = set()

    def process(self, span: SpanData) -> tuple[int, list[dict[str, Any]]]:
        resource = span.resource
        raw_pid = resource.get(semconv.PROCESS_PID)
        key = (str(resource.get(semconv.HOST_NAME, "")), raw_pid,
               str(resource.get(semconv.SERVICE_NAME, "")))
        pid = self.pids.get(key)
        if pid is not None:
            return pid, []
        pid = raw_pid if isinstance(raw_pid, int) and 0 < raw_pid < 2**31 else 1
        while pid in self.used:
            pid += 1_000_000  # another host (or service) with the same pid: a track of its own
        self.used.add(pid)
        self.pids[key] = pid
        role = resource.get(semconv.WORKER_ROLE)
        index = resource.get(semconv.WORKER_INDEX)
        name = str(resource.get(semconv.SERVICE_NAME) or "process")
        if role is not None:
            name += f" {role} {index if index is not None else 0}"
        name += f" (pid {raw_pid})" if raw_pid is not None else ""
        if key[0]:
            name += f" on {key[0]}"
        sort = 0 if role is None else 1 + (index if isinstance(index, int) else 0)
        return pid, [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
             "args": {"sort_index": sort}},
        ]

    def thread(self, pid: int, span: SpanData) -> tuple[int, list[dict[str, Any]]]:
        raw = span.attributes.get(semconv.THREAD_ID)
        tid = raw if isinstance(raw, int) and 0 <= raw < 2**63 else 0
        if (pid, tid) in self.threads:
            return tid, []
        self.threads.add((pid, tid))
        name = str(span.attributes.get(semconv.THREAD_NAME) or f"thread {tid}")
        return tid, [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                      "args": {"name": name}}]


def events(spans: Iterable[SpanData]) -> Iterator[dict[str, Any]]:
    """The trace events of `spans`, in order, metadata first for each new track."""
    tracks = _Tracks()
    for span in spans:
        attrs = span.attributes
        if attrs.get(semconv.KIND) in _SKIP_KINDS or attrs.get(semconv.CONTINUATION):
            continue
        pid, meta = tracks.process(span)
        tid, thread_meta = tracks.thread(pid, span)
        yield from meta
        yield from thread_meta
        args = {k: _plain(v) for k, v in attrs.items() if k not in _HIDDEN}
        args["trace_id"], args["span_id"] = span.trace_id, span.span_id
        if span.parent_span_id:
            args["parent_span_id"] = span.parent_span_id
        event: dict[str, Any] = {"name": span.name, "cat": "otel_rl", "ph": "X",
                                 "ts": _us(span.start_ns),
                                 "dur": _us(max(0, span.end_ns - span.start_ns)),
                                 "pid": pid, "tid": tid, "args": args}
        if span.is_error:
            event["cname"] = "terrible"  # the viewers' red
        yield event


def render_chunks(spans: Iterable[SpanData]) -> Iterator[str]:
    """The whole trace file as text pieces: ``{"traceEvents":[`` events ``],...}``."""
    yield '{"traceEvents":['
    first = True
    for event in events(spans):
        yield ("" if first else ",\n") + _dumps(event)
        first = False
    yield '],"displayTimeUnit":"ms","otherData":{"producer":"otel_rl"}}\n'
