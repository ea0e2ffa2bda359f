"""The span record: what every timed block (and every span otel_rl makes itself) becomes, from
the hot path to the encoders. Defined here once; a leaf but for `shapes` and `semconv`.

A record is a plain tuple, read by name through the field constants below (``record[START]``;
mypy types each field, since the constants are `Final`) or unpacked in field order. It is not a
`typing.NamedTuple` or a slots class because the hot path builds one per block: a tuple literal
costs 0.06 µs, a NamedTuple 0.31 µs (``tuple.__new__(NT, ...)`` 0.32 µs), a slots object about
0.3 µs, i.e. +20 % of a whole timed block (measured on CPython 3.11; see docs/DESIGN.md).

- Built by `make` everywhere but the hot path (`recorder.hierarchical_timer.__exit__` keeps its
  literal; `tests/test_record.py` pins its field order to the constants here) and the relay's
  column decoder (which zips whole columns, in the order of `FIELDS`).
- Its rare parts (`Extra`): an exception, a link, the sampling verdict, extra attributes.
- `block_span` is the one place that decides what a record's span carries (attributes, the
  exception event, the status, the link): the OTLP protobuf and JSON encoders and the SDK sink
  all use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple, TypedDict

from otel_rl._internal import semconv
from otel_rl._internal.shapes import AttributeValue

__all__ = ["END", "EXTRA", "FIELDS", "NAME", "PARENT_ID", "SPAN_ID", "START", "STARTER_ENDED",
           "THREAD_ID", "TRACE_ID", "BlockSpan", "Extra", "OpenSpan", "Record", "block_span",
           "make", "thread_attributes", "with_attrs"]


class Extra(TypedDict, total=False):
    """A record's rare parts: an exception (type, message, stack), a link to another span
    (trace id, span id), the `auto` policy's sampling verdict, extra attributes."""

    error: Sequence[str]
    link: Sequence[int]
    sampled: str
    attrs: Mapping[str, AttributeValue]


#: (span id, parent span id, name, start ns, end ns, thread id, trace id, extra); times are
#: perf_counter_ns, turned into epoch ns by the batch's offset. Parent id 0: a root span.
Record = tuple[int, int, str, int, int, int, int, Extra | None]

SPAN_ID: Final = 0
PARENT_ID: Final = 1
NAME: Final = 2
START: Final = 3
END: Final = 4
THREAD_ID: Final = 5
TRACE_ID: Final = 6
EXTRA: Final = 7
#: The field names, in record order (the relay's columns, the hot path's literal).
FIELDS: Final = ("span_id", "parent_id", "name", "start_ns", "end_ns", "thread_id", "trace_id",
                 "extra")


#: The extra of a span with none of its own whose starter ended (`windows`: the block that
#: started its thread or process ended before its window, so it hangs under the window span).
#: One object for all of them, never changed in place: in ML-Agents' kept windows a quarter of
#: the spans carry it (its trainer thread is started by a block that ends at once), and the
#: OTLP/JSON encoder and report.html know it by identity and write it as fast as a span
#: without one (the protobuf encoder's general path for extras is cheap already).
STARTER_ENDED: Final[Extra] = {"attrs": {semconv.STARTER_ENDED: True}}


def make(span_id: int, parent_id: int, name: str, start_ns: int, end_ns: int, thread_id: int,
         trace_id: int, extra: Extra | None = None) -> Record:
    """A record, fields by name (every builder but the hot path's literal)."""
    return (span_id, parent_id, name, start_ns, end_ns, thread_id, trace_id, extra)


def with_attrs(record: Record, attrs: Mapping[str, AttributeValue]) -> Record:
    """`record` with `attrs` added to its extra attributes (later keys win)."""
    extra: Extra = dict(record[EXTRA] or {})  # type: ignore[assignment]
    extra["attrs"] = {**(extra.get("attrs") or {}), **attrs}
    return (*record[:EXTRA], extra)  # type: ignore[return-value]


class OpenSpan(NamedTuple):
    """A block open now, in this process or (as of its last snapshot) in a relaying worker:
    what a continuation span, a span cut short or a metrics path needs of it. The one form of
    an open block; `wire` and `from_wire` are its form in a worker's snapshot (``"open"``).
    Not on the hot path: made only when someone asks what is open (a window's close, a flush,
    shutdown)."""

    pid: int
    span_id: int
    parent_id: int
    name: str
    start_ns: int
    thread_id: int

    def wire(self) -> list[Any]:
        """The snapshot form (the pid is the snapshot's)."""
        return [self.span_id, self.parent_id, self.name, self.start_ns, self.thread_id]

    @classmethod
    def from_wire(cls, pid: int, block: object) -> OpenSpan | None:
        """The open block a snapshot sent as `wire` made it; None if it is not one."""
        if not isinstance(block, list) or len(block) != 5:
            return None
        span_id, parent_id, name, start_ns, thread_id = block
        try:
            return cls(pid, int(span_id), int(parent_id), str(name), int(start_ns),
                       int(thread_id))
        except (TypeError, ValueError):
            return None

    @classmethod
    def all_from_wire(cls, pid: int, blocks: object) -> list[OpenSpan]:
        """The open blocks of a snapshot's ``"open"`` list (what is not one is skipped)."""
        if not isinstance(blocks, list):
            return []
        return [span for span in (cls.from_wire(pid, block) for block in blocks)
                if span is not None]

    def record(self, end_ns: int, trace_id: int, extra: Extra | None = None) -> Record:
        """The block as a span ending at `end_ns` (cut short, or continued in a window)."""
        return make(self.span_id, self.parent_id, self.name, self.start_ns,
                    max(self.start_ns, end_ns), self.thread_id, trace_id, extra)


STATUS_MESSAGE_MAX = 1024


def thread_attributes(thread_id: int, thread_name: str) -> dict[str, AttributeValue]:
    """The attributes every record's span has: its thread's (cached by the encoders per name
    and thread; the first part of `BlockSpan.attributes`)."""
    return {semconv.THREAD_ID: thread_id, semconv.THREAD_NAME: thread_name}


class BlockSpan:
    """What a record's span carries besides its ids, name and times: `attributes` (its
    thread's, then `extra_attributes`: the extra's own and the sampling verdict); with an
    exception, `error_attributes` (of the ``exception`` event at the span's end) and
    `status_message` (the status is ERROR); with a link, `link` (trace id, span id).
    A plain class, not a dataclass: every worker imports this module at start-up, and
    `dataclasses` (with `inspect`) costs ~6 ms to import there."""

    __slots__ = ("error_attributes", "extra_attributes", "link", "status_message",
                 "thread_id", "thread_name")

    def __init__(self, thread_id: int, thread_name: str,
                 extra_attributes: dict[str, AttributeValue],
                 error_attributes: dict[str, AttributeValue] | None,
                 status_message: str | None, link: tuple[int, int] | None) -> None:
        self.thread_id = thread_id
        self.thread_name = thread_name
        self.extra_attributes = extra_attributes
        self.error_attributes = error_attributes
        self.status_message = status_message
        self.link = link

    @property
    def attributes(self) -> dict[str, AttributeValue]:
        return {**thread_attributes(self.thread_id, self.thread_name), **self.extra_attributes}


def block_span(thread_id: int, thread_name: str, extra: Extra | None) -> BlockSpan:
    """The one decision of what a record's span carries (see `BlockSpan`)."""
    added: dict[str, AttributeValue] = {}
    error_attributes: dict[str, AttributeValue] | None = None
    status_message = None
    link = None
    if extra:
        attrs = extra.get("attrs")
        if attrs:
            added.update(attrs)
        if extra.get("sampled"):
            added[semconv.SAMPLED] = extra["sampled"]
        error = extra.get("error")
        if error:
            etype, message, stack = error
            error_attributes = {"exception.type": etype, "exception.message": message,
                                "exception.stacktrace": stack}
            status_message = message[:STATUS_MESSAGE_MAX]
        if extra.get("link"):
            trace_id, span_id = extra["link"]
            link = (int(trace_id), int(span_id))
    return BlockSpan(thread_id, thread_name, added, error_attributes, status_message, link)
