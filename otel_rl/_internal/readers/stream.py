"""Spans files read one line (one export request) at a time, in bounded memory.

`iter_spans` yields the spans of an OTLP/JSON lines file (plain or gzip) line by line through
the input boundary; a saved Jaeger/Tempo answer (one document over many lines) is read whole,
as it must be. `scan_aggregates` keeps only what the tree needs when the file has aggregate
spans: a line that cannot hold one (no ``otel_rl.aggregate.data`` in its bytes) is checked
through the boundary like any other and its spans dropped, so `otel-rl tree` on millions of
spans holds a few lines at a time and still refuses a corrupt file.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from otel_rl._internal import semconv
from otel_rl._internal.errors import UserError
from otel_rl._internal.readers.boundary import (
    DEFAULT_LIMITS,
    Limits,
    describe_path,
    iter_lines,
    open_input,
    parse_json,
)
from otel_rl._internal.readers.otlp_json import parse_otlp_json_line, read_otlp_json_file
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree

if TYPE_CHECKING:  # (loaded by the functions that need it: the timeline reader does not)
    from otel_rl._internal.aggregates import Collected

__all__ = [
    "SpanSample",
    "is_spans_lines",
    "iter_spans",
    "open_spans",
    "scan_aggregates",
    "tree_from_collected",
]

_MARKER = semconv.AGGREGATE_DATA.encode()


def open_spans(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> IO[bytes]:
    """`path` opened through the input boundary, gunzipped when it is gzip."""
    handle = open_input(path, "a spans file", limits)
    if handle.peek(2)[:2] == b"\x1f\x8b":  # type: ignore[attr-defined]
        return gzip.GzipFile(fileobj=handle)  # type: ignore[return-value]
    return handle


_NOT_JSON = object()


def _first_document(path: str | Path, limits: Limits) -> object:
    """The first non-blank line of `path` parsed as JSON; `_NOT_JSON` when that line is not a
    whole JSON document (a document over many lines), None for a file of blank lines."""
    source = describe_path(path)
    with open_spans(path, limits) as handle:
        for _number, raw in iter_lines(handle, source, limits):
            text = raw.decode("utf-8-sig", "replace").strip()
            if not text:
                continue
            try:
                return parse_json(text, source, limits)
            except UserError:
                return _NOT_JSON
    return None


def _is_lines(path: str | Path, limits: Limits) -> bool:
    """Whether the file is one request per line (else one document over many lines)."""
    return _first_document(path, limits) is not _NOT_JSON


def is_spans_lines(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> bool:
    """Whether `path` is a spans file of one export request per line (its first line is a
    whole JSON object with ``resourceSpans``), the shape `iter_spans` streams."""
    doc = _first_document(path, limits)
    return isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc)


class SpanSample(list[SpanData]):
    """Some of a file's spans; `total` is how many spans the file held (what the report's
    timeline draws from a larger file: `readers.timeline`)."""

    def __init__(self, spans: list[SpanData], total: int) -> None:
        super().__init__(spans)
        self.total = total


def iter_spans(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> Iterator[SpanData]:
    """The spans of `path`, one line at a time (see the module docstring)."""
    if not _is_lines(path, limits):
        yield from read_otlp_json_file(path, limits)
        return
    source = describe_path(path)
    n = 0
    with open_spans(path, limits) as handle:
        for number, raw in iter_lines(handle, source, limits):
            spans = parse_otlp_json_line(_text(raw, source, number), number, source, limits)
            n += len(spans)
            if n > limits.max_spans:
                raise UserError(f"{source}: more than {limits.max_spans:,} spans")
            yield from spans


def scan_aggregates(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> Collected:
    """The aggregate spans of `path` (empty if it has none), parsing only lines that may
    hold one."""
    from otel_rl._internal.aggregates import Collected

    collected = Collected()
    if not _is_lines(path, limits):
        for span in read_otlp_json_file(path, limits):
            collected.add(span.attributes)
        return collected
    source = describe_path(path)
    with open_spans(path, limits) as handle:
        for number, raw in iter_lines(handle, source, limits):
            if _MARKER not in raw:
                _check_unused_line(raw, source, number, limits)
                continue
            for span in parse_otlp_json_line(_text(raw, source, number), number, source, limits):
                collected.add(span.attributes)
    return collected


def _check_unused_line(raw: bytes, source: str, number: int, limits: Limits) -> None:
    """A line the tree does not need is checked all the same and its spans dropped: a file
    with a corrupt or cut line is refused, not silently half-used (issue 12's contract).
    Memory stays bounded; the check costs about 13 µs a span."""
    parse_otlp_json_line(_text(raw, source, number), number, source, limits)


def tree_from_collected(collected: Collected, source: str) -> Tree:
    """The whole-run tree from aggregate spans read from `source`, checked like any input.

    An aggregate's payload is otel_rl's own compressed JSON inside a span attribute; it is
    decoded within the boundary's limits, and a payload that does not have the shape the tree
    builder expects (corrupt or forged) is bad input, one line, not a traceback.
    """
    from otel_rl._internal.readers.semantics import check_tree
    from otel_rl._internal.treebuild import tree_from_aggregates

    try:
        tree = tree_from_aggregates(collected)
    except UserError as exc:
        raise UserError(f"{source}: aggregate spans: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
            OverflowError, zlib.error) as exc:
        raise UserError(
            f"{source}: an aggregate span's payload is malformed ({type(exc).__name__})"
        ) from None
    try:
        return check_tree(tree)
    except UserError as exc:
        raise UserError(f"{source}: aggregate spans: {exc}") from None


def _text(raw: bytes, source: str, number: int) -> str:
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{source} line {number}: not UTF-8 text (byte {exc.start})") from None
