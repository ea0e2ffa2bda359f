"""The spans a report's timeline shows, read from a spans file without converting the rest.

The timeline draws at most `cap` spans (`otel_rl.renderers.html.MAX_TIMELINE_SPANS`): the
longest ones, or all of them in a smaller file. Turning every span of a file into a checked
`SpanData` (ids, times, every attribute, events) was most of the ~0.45 s of CPU ``otel-rl run``
spent writing report.html after a 60,000-step Sample Factory run, on ~20,000 spans of which the
page shows 5,000 (issue 19). Here each
line is still parsed and checked as JSON through the input boundary, and each span is looked
at only for what choosing needs (start, end, span id, whether it is an aggregate); only the
spans chosen are converted and checked in full (`otlp_json.span_from_json`), so the timeline
is the one `html.render` draws from a full read, span for span and in the same order.

The writer of a run's spans file keeps the longest spans as it writes them and leaves them in
a side file (`timeline_side`); while that still describes the spans file (its size and
modification time), its spans are read instead of the file's, checked the same way. The
result is the same: they are the spans a read of the whole file chooses.

A span in an unusual spelling (proto field names, integer times, base64 ids) is converted in
full to be placed. What is not checked: the attributes, events and links of spans that are
not shown. A file that is not one request per line (a saved Jaeger/Tempo answer) is read in
full. A last line cut off mid-record (a writer killed while writing) is skipped and said.
"""

from __future__ import annotations

import heapq
import json
import os
from pathlib import Path
from typing import Any

from otel_rl._internal import semconv, timeline_side
from otel_rl._internal.errors import UserError
from otel_rl._internal.readers.boundary import (
    DEFAULT_LIMITS,
    MAX_TIME_NS,
    JSONInputError,
    Limits,
    describe_path,
    iter_lines,
    open_input,
    parse_json,
)
from otel_rl._internal.readers.otlp_json import (
    read_otlp_json_file,
    resource_of,
    scopes_of,
    span_from_json,
    spans_from_document,
    spans_of_scope,
)
from otel_rl._internal.readers.stream import SpanSample, is_spans_lines, open_spans
from otel_rl._internal.spandata import SpanData

__all__ = ["TimelineSample", "timeline_spans"]

_KIND = semconv.KIND
_AGGREGATE = semconv.KIND_AGGREGATE
_HEX = frozenset("0123456789abcdefABCDEF")


class TimelineSample(SpanSample):
    """The spans a timeline shows; `total`: the file's spans it stands for (aggregates left
    out), `skipped`: one note per torn last line left out."""

    def __init__(self, spans: list[SpanData], total: int, skipped: list[str]) -> None:
        super().__init__(spans, total)
        self.skipped = skipped


class _Chooser:
    """The `cap` longest spans seen, in `html.longest`'s order (the longer first, then the
    earlier start, then the smaller span id; then file order), each as the raw JSON object
    it came from until it is chosen."""

    __slots__ = ("cap", "floor", "heap", "seq", "total")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        # Items compare largest-wins: (duration, -start, -span id, -seq, payload).
        self.heap: list[tuple[int, int, int, int, Any]] = []
        self.seq = 0
        self.total = 0
        #: A span shorter than this is not kept (once `cap` are): the caller need not offer
        #: it, only count it in `total`.
        self.floor = -1

    def offer(self, duration: int, start: int, sid: int, payload: Any) -> None:
        self.total += 1
        self.seq += 1
        item = (duration, -start, -sid, -self.seq, payload)
        if len(self.heap) < self.cap:
            heapq.heappush(self.heap, item)
            if len(self.heap) == self.cap:
                self.floor = self.heap[0][0]
        elif item > self.heap[0]:
            heapq.heapreplace(self.heap, item)
            self.floor = self.heap[0][0]

    def chosen(self) -> list[Any]:
        if self.total <= self.cap:  # all of them: in file order, as a full read has them
            items = sorted(self.heap, key=lambda item: -item[3])
        else:
            items = sorted(self.heap, reverse=True)
        return [item[4] for item in items]


def _light(span: Any, kinds: bool) -> tuple[int, int, int, bool] | None:
    """(start, end, span id as a number, is an aggregate) of a span object in the spelling
    otel_rl writes; None when it must be converted in full to be placed (or refused).
    `kinds`: whether its line may hold an aggregate span at all (see `_may_aggregate`)."""
    if type(span) is not dict:
        return None
    start = span.get("startTimeUnixNano")
    end = span.get("endTimeUnixNano")
    sid = span.get("spanId")
    if type(start) is not str or type(end) is not str or type(sid) is not str:
        return None
    if len(sid) != 16 or not _HEX.issuperset(sid) or len(start) > 40 or len(end) > 40:
        return None
    try:
        start_ns = int(start)
        end_ns = int(end)
    except ValueError:
        return None
    if not 0 <= start_ns <= end_ns <= MAX_TIME_NS:
        return None
    aggregate = False
    attributes = span.get("attributes") if kinds else None
    if attributes is not None:
        if type(attributes) is not list:
            return None
        for item in attributes:
            if type(item) is not dict:
                return None
            if item.get("key") == _KIND:
                value = item.get("value")
                if type(value) is not dict or type(value.get("stringValue")) is not str:
                    return None
                aggregate = value["stringValue"] == _AGGREGATE
    return start_ns, end_ns, int(sid, 16), aggregate


def _may_aggregate(raw: bytes) -> bool:
    """Whether a line may have a span whose kind is ``"aggregate"``: the JSON string can be
    there only as those bytes, or spelled with ``\\u`` escapes (no other escape makes a
    letter). Most lines have neither: their spans' attributes need no look."""
    return b'"aggregate"' in raw or b"\\u" in raw


def _offer_full(chooser: _Chooser, span: SpanData) -> None:
    if span.attributes.get(_KIND) == _AGGREGATE:
        return
    chooser.offer(span.end_ns - span.start_ns, span.start_ns, int(span.span_id, 16), span)


def _offer_request(doc: dict[str, Any], where: str, chooser: _Chooser, kinds: bool) -> int:
    """Offer the spans of one request line (resources and scopes checked in full: they are
    few); the number of spans it held."""
    resource_spans = doc["resourceSpans"]
    if not isinstance(resource_spans, list):
        raise UserError(f"{where}: 'resourceSpans' must be a list")
    n = 0
    for i, item in enumerate(resource_spans):
        rs_where = f"{where}: resourceSpans[{i}]"
        rs, resource = resource_of(item, rs_where)
        for j, scope in enumerate(scopes_of(rs, rs_where)):
            ss_where = f"{rs_where}.scopeSpans[{j}]"
            spans = spans_of_scope(scope, ss_where)
            n += len(spans)
            for k, span in enumerate(spans):
                light = _light(span, kinds)
                if light is None:  # another spelling, or bad: the full reader places or refuses
                    _offer_full(chooser, span_from_json(span, resource, f"{ss_where}.spans[{k}]"))
                elif not light[3]:
                    start, end, sid, _ = light
                    if end - start < chooser.floor:  # (most spans, once the heap is full)
                        chooser.total += 1
                    else:
                        chooser.offer(end - start, start, sid,
                                      (span, resource, f"{ss_where}.spans[{k}]"))
    return n


def _offer_lines(handle: Any, source: str, chooser: _Chooser, limits: Limits,
                 skipped: list[str]) -> None:
    """Offer the spans of a file of request lines."""
    n = 0
    for number, raw in iter_lines(handle, source, limits):
        where = f"{source} line {number}"
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
        except UnicodeDecodeError as exc:
            raise UserError(f"{where}: not UTF-8 text (byte {exc.start})") from None
        try:
            doc = parse_json(text, where, limits)
        except JSONInputError:
            if raw.endswith(b"\n"):
                raise
            skipped.append(f"{where} was cut off (its writer was killed or the disk "
                           "filled) and was skipped")
            continue
        if type(doc) is dict and doc.get("resourceSpans") is not None:
            n += _offer_request(doc, where, chooser, _may_aggregate(raw))
        else:
            spans = spans_from_document(doc, where)
            n += len(spans)
            for span in spans:
                _offer_full(chooser, span)
        if n > limits.max_spans:
            raise UserError(f"{source}: more than {limits.max_spans:,} spans")


def _from_side(path: str | Path, cap: int, limits: Limits) -> TimelineSample | None:
    """The timeline from the side file of `path` (`timeline_side`), its spans checked as the
    spans file's lines are; None unless its header describes `path` as it is now and it keeps
    at least the `cap` longest, and it reads back whole."""
    side = timeline_side.side_path(path)
    chooser = _Chooser(cap)
    skipped: list[str] = []
    try:
        info = os.stat(path)
        with open_input(side, "a timeline side file", limits) as handle:
            head = json.loads(handle.readline(1024))
            if (type(head) is not dict
                    or head.get("otel_rl_timeline") != timeline_side.VERSION
                    or head.get("size") != info.st_size
                    or head.get("mtime_ns") != info.st_mtime_ns):
                return None
            total, kept = head.get("total"), head.get("kept")
            if (type(total) is not int or type(kept) is not int
                    or not cap <= kept < total <= limits.max_spans):
                return None
            _offer_lines(handle, describe_path(side), chooser, limits, skipped)
    except (OSError, UserError, ValueError):
        return None
    if skipped or chooser.total != kept:
        return None
    chooser.total = total  # what the kept spans stand for: the order is the longest first
    chosen = [item if isinstance(item, SpanData) else span_from_json(*item)
              for item in chooser.chosen()]
    return TimelineSample(chosen, total, [])


def timeline_spans(path: str | Path, cap: int, limits: Limits = DEFAULT_LIMITS) -> TimelineSample:
    """The spans of `path` the report's timeline shows (at most `cap`), chosen as
    `html.render` chooses them from a full read: from the side file its writer left
    (`timeline_side`) while that describes `path`, else from `path` itself. Bad input raises
    `UserError` (one line)."""
    from_side = _from_side(path, cap, limits)
    if from_side is not None:
        return from_side
    chooser = _Chooser(cap)
    skipped: list[str] = []
    if not is_spans_lines(path, limits):
        for span in read_otlp_json_file(path, limits):
            _offer_full(chooser, span)
    else:
        with open_spans(path, limits) as handle:
            _offer_lines(handle, describe_path(path), chooser, limits, skipped)
    chosen = [item if isinstance(item, SpanData) else span_from_json(*item)
              for item in chooser.chosen()]
    return TimelineSample(chosen, chooser.total, skipped)
