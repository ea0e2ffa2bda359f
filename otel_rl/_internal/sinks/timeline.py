"""`TimelineKeeper`: the longest spans a `FileSink` writes, kept for report.html's timeline.

See `timeline_side` for why and for the side file. The keeper chooses as
`readers.timeline` chooses from the file (the longer first, then the earlier start, then the
smaller span id, then the earlier in the file), so the spans it keeps are the ones a read of
the whole file would show: it sees each span's record with the offset that makes its
file times, and counts what the reader counts (every span but aggregates). A record whose
times the reader would not take as written (before the epoch, ending before it starts, past
64 bits) makes the keeper give up: the report then reads the whole file, as before.
"""

from __future__ import annotations

import heapq
import operator
import os
from collections.abc import Sequence
from typing import Any

from otel_rl._internal import semconv, timeline_side
from otel_rl._internal.otlp.records import Batch, JsonEncoder, json_request, json_resource
from otel_rl._internal.record import Extra

__all__ = ["TimelineKeeper"]

_LAST_NS = (1 << 64) - 1
_START = operator.itemgetter(3)
_END = operator.itemgetter(4)


def _aggregate(extra: Extra) -> bool:
    attrs = extra.get("attrs")
    return bool(attrs) and attrs.get(semconv.KIND) == semconv.KIND_AGGREGATE  # type: ignore[union-attr]


class TimelineKeeper:
    """The `cap` longest spans of the lines a `FileSink` wrote, each with what makes its JSON
    again (its record, time offset, thread name, resource); `side_file` makes the side file.
    `usable` turns False for good when the side file could not describe the spans file."""

    __slots__ = ("cap", "floor", "heap", "pid", "seq", "usable")

    def __init__(self, cap: int = timeline_side.CAP) -> None:
        self.cap = cap
        # Items compare largest-wins: (duration, -start, -span id, -seq, what makes its JSON:
        # (record, offset, thread name, resource JSON)); -seq differs between any two.
        self.heap: list[tuple[int, int, int, int, Any]] = []
        self.floor = -1  # a span shorter than this is not kept (once `cap` are)
        self.seq = 0  # spans taken in but aggregates: what the timeline stands for
        self.usable = True
        self.pid = os.getpid()  # a forked child's copy writes nothing

    def written(self, request: Sequence[Batch]) -> None:
        """Take in the spans of a line the spans file now holds."""
        if not self.usable:
            return
        heap, cap, floor, seq = self.heap, self.cap, self.floor, self.seq
        for batch in request:
            records = batch.records
            if not records:
                continue
            offset = batch.offset_ns
            if (min(map(_START, records)) < -offset or max(map(_END, records)) > _LAST_NS - offset
                    or min(map(operator.sub, map(_END, records), map(_START, records))) < 0):
                self.usable = False
                self.heap.clear()
                return
            resource: str | None = None
            for record in records:
                sid, _, _, start, end, tid, _, extra = record
                if extra and _aggregate(extra):
                    continue
                seq += 1
                duration = end - start
                if duration < floor:  # (most spans, once `cap` are kept)
                    continue
                if resource is None:
                    resource = json_resource(batch.resource)
                item = (duration, -start - offset, -sid, -seq,
                        (record, offset, batch.thread_names.get(tid, ""), resource))
                if len(heap) < cap:
                    heapq.heappush(heap, item)
                    if len(heap) == cap:
                        floor = heap[0][0]
                elif item > heap[0]:
                    heapq.heapreplace(heap, item)
                    floor = heap[0][0]
        self.floor, self.seq = floor, seq

    def chosen(self, spans_path: str, size: int) -> tuple[list[Any], int] | None:
        """What a read of `spans_path` (which this process wrote whole: `size` bytes) gives
        the timeline, in the reader's order (`readers.timeline`): each span as (record, time
        offset, thread name, resource JSON), and how many spans it stands for; None unless
        the file is still all this process wrote."""
        if not self.usable or os.getpid() != self.pid:
            return None
        if os.stat(spans_path).st_size != size:  # another writer appended too
            return None
        if self.seq <= self.cap:  # every span, in file order
            items = sorted(self.heap, key=lambda item: -item[3])
        else:  # the longest first, as the reader's own heap gives them
            items = sorted(self.heap, reverse=True)
        return [item[4] for item in items], self.seq

    def side_file(self, spans_path: str, size: int, encoder: JsonEncoder) -> bytes | None:
        """The side file of `spans_path` (which this process wrote whole: `size` bytes), if
        the file has more spans than the timeline shows; else None."""
        if not self.usable or self.seq <= self.cap or os.getpid() != self.pid:
            return None
        st = os.stat(spans_path)
        if st.st_size != size:  # another writer appended too
            return None
        groups: list[tuple[str, list[str]]] = []
        for *_, (record, offset, thread_name, resource) in sorted(self.heap,
                                                                  key=lambda item: -item[3]):
            if not groups or groups[-1][0] != resource:
                groups.append((resource, []))
            groups[-1][1].append(encoder.span(record, offset, {record[5]: thread_name}))
        text = (timeline_side.header(size, st.st_mtime_ns, self.seq, len(self.heap)) + "\n"
                + json_request(groups) + "\n")
        return text.encode("utf-8")
