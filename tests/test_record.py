"""The one span record (`otel_rl._internal.record`): the hot path's tuple literal has the
fields in the order the named constants say, every other builder goes through `record.make`,
and the OTLP protobuf encoder, the OTLP/JSON encoder and the SDK sink carry what `block_span`
decides, all the same."""

from __future__ import annotations

import ast
import builtins
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import otel_rl
from otel_rl._internal import recorder, semconv
from otel_rl._internal.otlp.records import Batch, JsonEncoder, encode_batches
from otel_rl._internal.readers.otlp_json import parse_spans_text
from otel_rl._internal.record import (
    END,
    EXTRA,
    FIELDS,
    NAME,
    PARENT_ID,
    SPAN_ID,
    START,
    THREAD_ID,
    TRACE_ID,
    OpenSpan,
    Record,
    block_span,
    make,
    with_attrs,
)
from otel_rl._internal.recorder import TimerStack, Trace, hierarchical_timer
from tests.fixtures.otlp_receiver import request_spans

PACKAGE = Path(otel_rl.__file__).parent


def test_the_constants_name_every_field_once_in_order() -> None:
    assert [SPAN_ID, PARENT_ID, NAME, START, END, THREAD_ID, TRACE_ID, EXTRA] == list(range(8))
    assert len(FIELDS) == 8
    record = make(1, 2, "n", 3, 4, 5, 6, {"sampled": "x"})
    assert [record[i] for i in range(8)] == [1, 2, "n", 3, 4, 5, 6, {"sampled": "x"}]
    assert make(1, 2, "n", 3, 4, 5, 6)[EXTRA] is None


class _Boom(Exception):
    pass


@contextmanager
def _traced_stack() -> Iterator[tuple[TimerStack, list[Record]]]:
    """A stack whose blocks append their records (a real trace, room for them) to the list."""
    records: list[Record] = []
    stack = TimerStack()
    stack.trace = Trace(0xABC, 100, records)
    old_cap = recorder.buffer_cap
    recorder.buffer_cap = 1000
    try:
        yield stack, records
    finally:
        recorder.buffer_cap = old_cap


def test_the_hot_path_literal_has_the_fields_where_the_constants_say() -> None:
    # A real block with a real trace: the record the hot path appends, read by name.
    with _traced_stack() as (stack, records):
        with hierarchical_timer("outer", stack):
            with hierarchical_timer("inner", stack):
                pass
        with pytest.raises(_Boom), hierarchical_timer("fails", stack):
            raise _Boom("k")
    inner, outer, fails = records
    assert [r[NAME] for r in records] == ["inner", "outer", "fails"]
    assert inner[PARENT_ID] == outer[SPAN_ID] != 0
    assert outer[PARENT_ID] == 0  # a stack's OpenRoot(0): no parent span
    assert outer[START] <= inner[START] <= inner[END] <= outer[END]
    assert {r[THREAD_ID] for r in records} == {threading.get_ident()}
    assert {r[TRACE_ID] for r in records} == {0xABC}
    assert inner[EXTRA] is None
    extra = fails[EXTRA]
    assert extra is not None and extra["error"][0].endswith("_Boom")


def test_open_blocks_are_open_spans_that_cross_a_snapshot_and_end_as_records() -> None:
    # The one form of an open block: made by the stack, sent in a snapshot as `wire`, read
    # back by `all_from_wire` (what is not one skipped), ended as a record by `record`.
    with _traced_stack() as (stack, records), hierarchical_timer("outer", stack), \
            hierarchical_timer("inner", stack):
        inner, outer = stack.open_blocks()
    assert (inner.name, outer.name) == ("inner", "outer")
    assert inner.parent_id == outer.span_id != 0 and outer.parent_id == 0
    assert {inner.pid, outer.pid} == {stack.pid}
    assert {inner.thread_id, outer.thread_id} == {threading.get_ident()}
    assert inner.start_ns >= outer.start_ns
    # The records the blocks then made carry the same ids, names and starts.
    done = {r[SPAN_ID]: r for r in records}
    for block in (inner, outer):
        record = done[block.span_id]
        assert (record[PARENT_ID], record[NAME], record[START], record[THREAD_ID]) == (
            block.parent_id, block.name, block.start_ns, block.thread_id)
    wire = [inner.wire(), "junk", [1, 2], outer.wire(), [1, 2, "x", "not a time", 3]]
    assert OpenSpan.all_from_wire(stack.pid, wire) == [inner, outer]
    assert OpenSpan.all_from_wire(7, {"not": "a list"}) == []
    cut = inner.record(inner.start_ns - 5, 0xABC, {"attrs": {semconv.CUT_SHORT: True}})
    assert cut[START] == cut[END] == inner.start_ns  # never ends before it started
    assert (cut[SPAN_ID], cut[PARENT_ID], cut[TRACE_ID]) == (inner.span_id, outer.span_id, 0xABC)


def _not_a_record(node: ast.Tuple) -> bool:
    """A tuple that starts with a string or a builtin (reasons, exception types, JSON's
    types): a record starts with a span id."""
    first = node.elts[0] if node.elts else None
    return ((isinstance(first, ast.Constant) and isinstance(first.value, str))
            or (isinstance(first, ast.Name) and first.id in dir(builtins)))


def test_only_the_hot_path_builds_a_record_without_make() -> None:
    # An 8-element tuple display in otel_rl's code is a record built by hand; allowed only
    # in the hot path (its literal, pinned above) and `record` itself. Unpacking one is fine.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Load)
                    and not _not_a_record(node)
                    and (len(node.elts) == 8 or any(isinstance(e, ast.Starred)
                                                    and "record" in ast.unparse(e)
                                                    for e in node.elts))):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    allowed = {"_internal/record.py", "_internal/recorder.py"}
    assert [where for where in found if where.split(":")[0] not in allowed] == []
    hot = [where for where in found if where.startswith("_internal/recorder.py")]
    assert len(hot) == 1  # hierarchical_timer.__exit__'s literal


def test_with_attrs_adds_to_the_extra_attributes_without_touching_the_record() -> None:
    record = make(1, 2, "n", 3, 4, 5, 6, {"attrs": {"a": 1, "b": 2}, "sampled": "s"})
    added = with_attrs(record, {"b": 3, "c": 4})
    assert added[EXTRA] == {"attrs": {"a": 1, "b": 3, "c": 4}, "sampled": "s"}
    assert record[EXTRA] == {"attrs": {"a": 1, "b": 2}, "sampled": "s"}
    assert added[:EXTRA] == record[:EXTRA]
    assert with_attrs(make(1, 2, "n", 3, 4, 5, 6), {"x": True})[EXTRA] == {"attrs": {"x": True}}


def test_block_span_decides_attributes_error_status_and_link() -> None:
    plain = block_span(7, "main", None)
    assert plain.attributes == {semconv.THREAD_ID: 7, semconv.THREAD_NAME: "main"}
    assert (plain.error_attributes, plain.status_message, plain.link) == (None, None, None)
    full = block_span(7, "main", {"error": ("E", "m" * 2000, "stack"), "link": (5, 6),
                                  "sampled": "outlier", "attrs": {"k": "v"}})
    assert full.attributes == {semconv.THREAD_ID: 7, semconv.THREAD_NAME: "main", "k": "v",
                               semconv.SAMPLED: "outlier"}
    assert full.error_attributes == {"exception.type": "E", "exception.message": "m" * 2000,
                                     "exception.stacktrace": "stack"}
    assert full.status_message == "m" * 1024
    assert full.link == (5, 6)


TRACE = 0x0AF7651916CD43DD8448EB211C80319C
RECORDS = [
    make(0x11, 0, "root", 100, 900, 77, TRACE),
    make(0x22, 0x11, "boom", 200, 300, 88, TRACE, {"error": ("ValueError", "bad", "tb")}),
    make(0x33, 0, "window 0", 0, 1000, 0, TRACE + 1,
         {"link": (TRACE, 0x11), "sampled": "schedule", "attrs": {"otel_rl.kind": "window"}}),
]
BATCH = Batch({"service.name": "svc"}, 10**18, RECORDS, {77: "MainThread", 88: "w"})


def test_the_three_span_writers_carry_the_same_span() -> None:
    from otel_rl._internal.sinks.sdk import to_readable_spans

    from_json = parse_spans_text(JsonEncoder().request_line([BATCH]) + "\n", "test")
    from_proto = request_spans(ExportTraceServiceRequest.FromString(encode_batches([BATCH])))
    assert from_json == from_proto
    sdk = to_readable_spans([BATCH])
    for span, readable, record in zip(from_json, sdk, RECORDS, strict=True):
        parts = block_span(record[THREAD_ID], BATCH.thread_names.get(record[THREAD_ID], ""),
                           record[EXTRA])
        assert span.attributes == parts.attributes == dict(readable.attributes or {})
        assert span.name == readable.name == record[NAME]
        assert span.is_error == (parts.status_message is not None)
        assert readable.status.description == parts.status_message
        events = [e.name for e in readable.events]
        assert [e.name for e in span.events] == events == (["exception"] if span.is_error else [])
        links = [parts.link] if parts.link is not None else []
        assert [(f"{t:032x}", f"{s:016x}") for t, s in links] == span.links
        assert [(link.context.trace_id, link.context.span_id)
                for link in readable.links] == links
