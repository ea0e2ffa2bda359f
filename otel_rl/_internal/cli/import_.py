"""``otel-rl import``: turn an existing ML-Agents ``timers.json`` into a synthetic trace.

A timers.json keeps totals, not individual runs, so the trace is a layout, not a recording:
one span per tree node lasting the node's total, children placed one after another from their
parent's start. Every span says so (``otel_rl.synthetic=true``) and carries the node's count
(``otel_rl.count``), which the tree builder reads back instead of counting spans — so
``otel-rl tree`` on the imported trace gives back the same tree.
"""

from __future__ import annotations

import argparse
import os
import time

from otel_rl._internal import semconv
from otel_rl._internal.cli.replay import add_endpoint_arguments, make_transport, send_all
from otel_rl._internal.errors import UsageError, UserError
from otel_rl._internal.node import Gauge
from otel_rl._internal.otlp.requests import request_to_json_line
from otel_rl._internal.otlp.spans import build_request
from otel_rl._internal.readers.boundary import MAX_TIME_NS
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree, TreeNode

#: Attributes only synthetic spans carry (the node's own time, and ML-Agents' parallel flag).
SELF_SECONDS = semconv.SELF_SECONDS
IS_PARALLEL = semconv.IS_PARALLEL
DEFAULT_SERVICE_NAME = "otel-rl-import"
ROOT_SPAN_NAME = "root"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="TIMERS_JSON", help="an ML-Agents timers.json")
    add_endpoint_arguments(parser, required=False)
    parser.add_argument(
        "--service-name",
        default=DEFAULT_SERVICE_NAME,
        metavar="NAME",
        help=f"service.name of the trace (default: {DEFAULT_SERVICE_NAME})",
    )
    parser.add_argument(
        "--output", metavar="FILE", help="also (or only) write the spans as an OTLP-JSON file"
    )


def tree_to_spans(
    tree: Tree, service_name: str, start_ns: int, trace_id: str | None = None
) -> list[SpanData]:
    """The synthetic trace for `tree`: the run span first, then its nodes depth-first.

    Example::

        spans = tree_to_spans(Tree.from_json(text), "ppo", start_ns=time.time_ns())
    """
    trace_id = trace_id or _random_id(16)
    resource: dict[str, object] = {semconv.SERVICE_NAME: service_name}
    root = tree.root
    run_attributes: dict[str, object] = {
        semconv.KIND: semconv.KIND_RUN,
        semconv.SYNTHETIC: True,
        semconv.COUNT: root.count,
        SELF_SECONDS: root.self_time,
    }
    if root.is_parallel:
        run_attributes[IS_PARALLEL] = True
    for name, gauge in tree.gauges.items():
        run_attributes.update(Gauge(float(gauge.value), float(gauge.min), float(gauge.max),
                                    int(gauge.count)).to_attributes(name))
    for key, value in tree.metadata.items():
        run_attributes[semconv.METADATA_PREFIX + key] = value
    run_span = SpanData(
        trace_id=trace_id,
        span_id=_random_id(8),
        parent_span_id="",
        name=ROOT_SPAN_NAME,
        start_ns=start_ns,
        end_ns=start_ns + _ns(root.total),
        attributes=run_attributes,
        resource=resource,
    )
    spans = [run_span]
    # Depth first with an explicit stack: a timers.json can be thousands of levels deep.
    todo: list[tuple[TreeNode, SpanData]] = [(root, run_span)]
    while todo:
        node, parent = todo.pop()
        cursor = parent.start_ns
        placed = []
        for child in node.children.values():
            span = _child_span(child, parent, cursor, resource)
            spans.append(span)
            cursor = span.end_ns
            placed.append((child, span))
        todo.extend(reversed(placed))
    if any(span.end_ns > MAX_TIME_NS for span in spans):
        raise UserError(
            "the tree's totals do not fit in spans (they would end after the year 2554); "
            "is a total wrong?"
        )
    return _depth_first(spans)


def _depth_first(spans: list[SpanData]) -> list[SpanData]:
    """`spans` (run span first, children after each level) in depth-first order."""
    children: dict[str, list[SpanData]] = {}
    for span in spans[1:]:
        children.setdefault(span.parent_span_id, []).append(span)
    ordered: list[SpanData] = []
    todo = [spans[0]]
    while todo:
        span = todo.pop()
        ordered.append(span)
        todo.extend(reversed(children.get(span.span_id, ())))
    return ordered


def _child_span(
    child: TreeNode, parent: SpanData, start_ns: int, resource: dict[str, object]
) -> SpanData:
    attributes: dict[str, object] = {
        semconv.SYNTHETIC: True,
        semconv.COUNT: child.count,
        SELF_SECONDS: child.self_time,
    }
    if child.is_parallel:
        attributes[IS_PARALLEL] = True
    if child.gpu_count:
        attributes[semconv.GPU_SECONDS] = child.gpu_total
        attributes[semconv.GPU_COUNT] = child.gpu_count
    return SpanData(
        trace_id=parent.trace_id,
        span_id=_random_id(8),
        parent_span_id=parent.span_id,
        name=child.name,
        start_ns=start_ns,
        end_ns=start_ns + _ns(child.total),
        attributes=attributes,
        resource=resource,
    )


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _random_id(size: int) -> str:
    while True:
        raw = os.urandom(size)
        if any(raw):  # all-zero ids are invalid in OTLP
            return raw.hex()


def _start_ns(tree: Tree) -> int:
    """When the run started: ML-Agents' ``start_time_seconds`` metadata, else now minus its total."""
    try:
        start_s = float(tree.metadata.get("start_time_seconds", ""))
    except ValueError:
        start_s = 0.0
    if 0 < start_s < 2**63 / 1e9:  # also false for NaN and infinity
        return int(start_s * 1e9)
    return max(0, time.time_ns() - _ns(tree.root.total))


def read_timers_file(path: str) -> Tree:
    """The `Tree` in the timers.json at `path`, through the input boundary (one-line errors)."""
    from otel_rl._internal.cli.report import read_timers_document
    from otel_rl._internal.readers.boundary import (
        decode_text,
        describe_path,
        parse_json,
        read_input,
    )

    source = describe_path(path)
    document = parse_json(decode_text(read_input(path, "a timers.json"), source), source)
    return read_timers_document(document, source)


def run(args: argparse.Namespace) -> int:
    from otel_rl._internal.cli._output import check_output_path, write_output

    if args.endpoint is None and args.output is None:
        raise UsageError("nothing to do: give --endpoint to send the trace, --output to save it")
    if not args.service_name.strip():
        raise UsageError("--service-name must not be empty")
    if args.output is not None:
        check_output_path(args.output, "--output")
    transport = make_transport(args) if args.endpoint is not None else None
    try:
        tree = read_timers_file(args.file)
        spans = tree_to_spans(tree, args.service_name, _start_ns(tree))
        request = build_request(spans)
        trace_id = spans[0].trace_id
        if args.output is not None:
            write_output(args.output, request_to_json_line(request) + "\n")
            print(f"wrote {len(spans)} spans to {args.output}")
    except BaseException:
        if transport is not None:
            transport.close()
        raise
    if transport is not None:
        send_all(transport, [(request.SerializeToString(), len(spans))], args.file)
        print(f"sent {len(spans)} spans to {transport.url} ({args.protocol})")
    print(f"trace id: {trace_id}")
    return 0
