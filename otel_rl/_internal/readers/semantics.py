"""Checks on the attributes otel_rl itself gives meaning to, for spans read from outside.

Any attribute is allowed on a span, but those the tree builder reads (``otel_rl.kind``, the
synthetic count, gauges on run and process spans, worker identity) must have the types that
otel_rl writes: a gauge of ``"abc"`` or a count of ``1e300`` would otherwise reach the
reports and fail there. A span breaking them is bad input (one line naming the span).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from otel_rl._internal import semconv
from otel_rl._internal.errors import UserError, shown
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree

__all__ = ["MAX_TOTAL_SECONDS", "check_span", "check_span_set", "check_tree"]

_MAX_COUNT = 2**63 - 1
_GAUGE_FIELDS = ("value", "min", "max")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Largest magnitude of a gauge or GPU time: room for sums and means that stay finite.
_LARGEST = 1e300


def _finite_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < _LARGEST
    )


def _bad(where: str, span: SpanData, key: str, expected: str, value: Any) -> UserError:
    return UserError(
        f"{where}: span {shown(span.name, 30)}: attribute {key!r} must be {expected}, "
        f"got {shown(value, 30)}"
    )


#: The span attributes `check_span` checks (gauges only on spans with a kind): a span with
#: none of them (most block spans) skips straight to its resource.
_CHECKED = frozenset({semconv.KIND, semconv.SYNTHETIC, semconv.IS_PARALLEL,
                      semconv.GPU_SECONDS, semconv.GPU_COUNT, semconv.COUNT})


def check_span(span: SpanData, where: str) -> None:
    """Raise `UserError` if `span`'s otel_rl attributes have the wrong types or ranges."""
    if not _CHECKED.isdisjoint(span.attributes):
        _check_attributes(span, where)
    resource = span.resource
    if resource.get(semconv.WORKER_ROLE) is not None:
        role = resource[semconv.WORKER_ROLE]
        if not isinstance(role, str):
            raise _bad(where, span, semconv.WORKER_ROLE, "a string", role)
        for key in (semconv.WORKER_INDEX, semconv.PROCESS_PID):
            value = resource.get(key)
            if value is not None and not (_is_int(value) and 0 <= value <= _MAX_COUNT):
                raise _bad(where, span, key, "a non-negative integer", value)


def _check_attributes(span: SpanData, where: str) -> None:
    attributes = span.attributes
    kind = attributes.get(semconv.KIND)
    if kind is not None and not isinstance(kind, str):
        raise _bad(where, span, semconv.KIND, "a string", kind)
    for key in (semconv.SYNTHETIC, semconv.IS_PARALLEL):
        value = attributes.get(key)
        if value is not None and not isinstance(value, bool):
            raise _bad(where, span, key, "true or false", value)
    seconds = attributes.get(semconv.GPU_SECONDS)
    if seconds is not None and not (_finite_number(seconds) and seconds >= 0):
        raise _bad(where, span, semconv.GPU_SECONDS, f"a non-negative number below {_LARGEST:g}", seconds)
    for key in (semconv.GPU_COUNT,):
        value = attributes.get(key)
        if value is not None and not (_is_int(value) and 0 <= value <= _MAX_COUNT):
            raise _bad(where, span, key, "a non-negative integer", value)
    count = attributes.get(semconv.COUNT)
    if count is not None and not (_is_int(count) and 0 <= count <= _MAX_COUNT):
        raise _bad(where, span, semconv.COUNT, "a non-negative integer", count)
    gpu_seconds = attributes.get(semconv.GPU_SECONDS)
    if gpu_seconds is not None and not (_finite_number(gpu_seconds) and gpu_seconds >= 0):
        raise _bad(where, span, semconv.GPU_SECONDS, f"a non-negative number below {_LARGEST:g}", gpu_seconds)
    gpu_count = attributes.get(semconv.GPU_COUNT)
    if gpu_count is not None and not (_is_int(gpu_count) and 0 <= gpu_count <= _MAX_COUNT):
        raise _bad(where, span, semconv.GPU_COUNT, "a non-negative integer", gpu_count)
    if kind == semconv.KIND_AGGREGATE:
        _check_aggregate(span, where)
    if kind in (semconv.KIND_RUN, semconv.KIND_PROCESS, semconv.KIND_AGGREGATE):
        for key, value in attributes.items():
            if not key.startswith(semconv.GAUGE_PREFIX):
                continue
            part = key.rpartition(".")[2]
            if part in _GAUGE_FIELDS and not _finite_number(value):
                raise _bad(where, span, key, f"a number between ±{_LARGEST:g}", value)
            if part == "count" and not (_is_int(value) and 0 <= value <= _MAX_COUNT):
                raise _bad(where, span, key, "a non-negative integer", value)


_AGGREGATE_TYPES: tuple[tuple[str, type, str], ...] = (
    (semconv.AGGREGATE_SOURCE, str, "a string"),
    (semconv.AGGREGATE_DATA, str, "a string"),
    (semconv.AGGREGATE_PAYLOAD_KIND, str, "a string"),
    (semconv.AGGREGATE_FINAL, bool, "true or false"),
)
#: Parts of one aggregate at most (each about 1,900 characters: ~190 MB of payload).
_MAX_AGGREGATE_PARTS = 100_000
#: Kept windows one aggregate may list (each is a trace `tree --run-id` fetches).
_MAX_WINDOWS = 100_000


def _check_aggregate(span: SpanData, where: str) -> None:
    attributes = span.attributes
    for key, kind, expected in _AGGREGATE_TYPES:
        value = attributes.get(key)
        if value is not None and not isinstance(value, kind):
            raise _bad(where, span, key, expected, value)
    for key in (semconv.AGGREGATE_SEQ, semconv.AGGREGATE_PART, semconv.AGGREGATE_PARTS):
        value = attributes.get(key)
        if value is not None and not (_is_int(value) and 0 <= value <= _MAX_COUNT):
            raise _bad(where, span, key, "a non-negative integer", value)
    windows = attributes.get(semconv.WINDOWS)
    if windows is not None and not (
        isinstance(windows, list)
        and len(windows) <= _MAX_WINDOWS
        and all(_is_int(k) and 0 <= k <= _MAX_COUNT for k in windows)
    ):
        raise _bad(where, span, semconv.WINDOWS, f"a list of at most {_MAX_WINDOWS:,} indices",
                   windows)  # fmt: skip
    parts = attributes.get(semconv.AGGREGATE_PARTS)
    if isinstance(parts, int) and parts > _MAX_AGGREGATE_PARTS:
        raise _bad(where, span, semconv.AGGREGATE_PARTS, f"at most {_MAX_AGGREGATE_PARTS:,}", parts)


#: Longest total a node may have: what an OTLP span (uint64 nanoseconds) can hold, ~584 years.
MAX_TOTAL_SECONDS = (2**64 - 1) / 1e9


def check_tree(tree: Tree) -> Tree:
    """`tree` if its numbers are in range for every report and for spans (and of the types
    the tree model says: a tree built from an aggregate span's payload, which is input, is
    checked here, not read back through `Tree.from_dict`); else `UserError`."""
    todo = [("root", tree.root)]
    todo.extend((f"root.workers[{i}].tree", worker.node) for i, worker in enumerate(tree.workers))
    while todo:
        where, node = todo.pop()
        if not (isinstance(node.total, (int, float)) and not isinstance(node.total, bool)
                and math.isfinite(node.total)):
            raise UserError(f"{where}: 'total' must be a finite number")
        if not 0 <= node.total <= MAX_TOTAL_SECONDS:
            raise UserError(f"{where}: total {node.total:g} s is out of range (at most 584 years)")
        if not (_is_int(node.count) and 0 <= node.count <= _MAX_COUNT):
            raise UserError(f"{where}: 'count' is out of range (at most 2^63 - 1)")
        todo.extend(
            (f"{where}.children.{shown(name, 30)}", child) for name, child in node.children.items()
        )
    for name, gauge in tree.gauges.items():
        values = (gauge.value, gauge.min, gauge.max)
        if not all(_finite_number(v) for v in values):
            raise UserError(f"root.gauges.{shown(name, 30)}: values must be numbers between ±{_LARGEST:g}")
        if not (_is_int(gauge.count) and 0 <= gauge.count <= _MAX_COUNT):
            raise UserError(f"root.gauges.{shown(name, 30)}: 'count' is out of range")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tree.metadata.items()):
        raise UserError("root.metadata: keys and values must be strings")
    return tree


def check_span_set(spans: Iterable[SpanData], source: str) -> None:
    """Raise `UserError` if the spans' parent links form a cycle (a span its own ancestor).

    A cycle cannot come from real tracing, only from corrupt or forged data, and no tree can be
    drawn from it. Walks each parent chain once (iteratively: chains can be thousands deep).
    """
    parent_of: dict[tuple[str, str], str] = {}
    for span in spans:
        parent_of.setdefault((span.trace_id, span.span_id), span.parent_span_id)
    done: set[tuple[str, str]] = set()
    for start in parent_of:
        if start in done:
            continue
        chain: list[tuple[str, str]] = []
        on_chain: set[tuple[str, str]] = set()
        key: tuple[str, str] | None = start
        while key is not None and key not in done:
            if key in on_chain:
                raise UserError(
                    f"{source}: the spans' parent links form a cycle (span {key[1]} in trace "
                    f"{key[0]} is its own ancestor)"
                )
            chain.append(key)
            on_chain.add(key)
            parent = parent_of.get(key, "")
            key = (key[0], parent) if parent and (key[0], parent) in parent_of else None
        done.update(chain)
