"""TimerTreeExporter in a real OTel SDK pipeline.

`run_sdk_workload` and the OTLP helpers are shared with test_readers / test_cli_tree, which
check that the same spans read back from files and backends give the same tree.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rl._internal import semconv
from otel_rl._internal.sdk_exporter import ThreadAttributesSpanProcessor, TimerTreeExporter
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import TreeNode

STEPS = 3


def run_sdk_workload() -> tuple[TimerTreeExporter, list[ReadableSpan]]:
    """Nested spans, repeated siblings, a thread joining the trace, and an exception."""
    exporter, memory = TimerTreeExporter(), InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "trainer", "process.pid": os.getpid()})
    )
    provider.add_span_processor(ThreadAttributesSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")

    def trainer_thread(ctx: otel_context.Context) -> None:
        token = otel_context.attach(ctx)
        try:
            with tracer.start_as_current_span("trainer_advance"):
                for _ in range(2):
                    with tracer.start_as_current_span("update_policy"):
                        sum(range(500))
        finally:
            otel_context.detach(token)

    with tracer.start_as_current_span("run_training"):
        for _ in range(STEPS):
            with tracer.start_as_current_span("env_step"):
                with tracer.start_as_current_span("policy.act"):
                    sum(range(200))
        thread = threading.Thread(target=trainer_thread, args=(otel_context.get_current(),))
        thread.start()
        thread.join()
        with pytest.raises(ValueError), tracer.start_as_current_span("save_model"):
            raise ValueError("disk full")
    provider.shutdown()
    return exporter, list(memory.get_finished_spans())


def otlp_request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The spans as protobuf canonical JSON (what Tempo answers: base64 ids, enum names)."""
    result: dict[str, Any] = MessageToDict(encode_spans(spans))
    return result


_ID_KEYS = ("traceId", "spanId", "parentSpanId")
_KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2}
_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def to_otlp_json(obj: Any, int64_as_numbers: bool = False) -> Any:
    """Canonical protobuf JSON -> OTLP/JSON as the Collector writes it (hex ids, int enums)."""
    if isinstance(obj, list):
        return [to_otlp_json(item, int64_as_numbers) for item in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        if key in _ID_KEYS and isinstance(value, str):
            value = base64.b64decode(value).hex()
        elif key == "kind":
            value = _KINDS[value]
        elif key == "code" and isinstance(value, str):
            value = _CODES[value]
        elif int64_as_numbers and (key.endswith("UnixNano") or key == "intValue"):
            value = int(value)
        else:
            value = to_otlp_json(value, int64_as_numbers)
        out[key] = value
    return out


def _check_self_times(node: TreeNode) -> None:
    # Summed left to right, as ML-Agents does (not with sum(): from Python 3.12 it compensates
    # float rounding, and its result can differ in the last bit).
    children = 0.0
    for child in node.children.values():
        children += child.total
    assert node.self_time == max(0.0, node.total - children)
    for child in node.children.values():
        _check_self_times(child)


def test_sdk_pipeline_gives_the_expected_tree() -> None:
    exporter, spans = run_sdk_workload()
    tree = exporter.tree()
    assert tree.complete, tree.notes
    summary = {path: (node.count, node.is_parallel) for path, node in tree.root.walk()}
    assert summary == {
        ("run_training",): (1, False),
        ("run_training", "env_step"): (STEPS, False),
        ("run_training", "env_step", "policy.act"): (STEPS, False),
        ("run_training", "trainer_advance"): (1, True),
        ("run_training", "trainer_advance", "update_policy"): (2, True),
        ("run_training", "save_model"): (1, False),
    }
    assert list(tree.root.children["run_training"].children) == [
        "env_step",
        "trainer_advance",
        "save_model",
    ]
    # Totals are the span durations; the root spans all spans (no run span here).
    by_name: dict[str, float] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        assert span.start_time is not None and span.end_time is not None
        by_name[span.name] = by_name.get(span.name, 0.0) + (span.end_time - span.start_time) / 1e9
    for path, node in tree.root.walk():
        assert node.total == by_name[path[-1]]
    assert tree.root.total == tree.root.children["run_training"].total
    _check_self_times(tree.root)
    data = exporter.timer_tree()
    assert data["children"]["run_training"]["children"]["trainer_advance"]["is_parallel"] is True
    assert "is_parallel" not in data["children"]["run_training"]["children"]["env_step"]


def test_plain_sdk_spans_without_thread_ids_are_not_parallel() -> None:
    exporter = TimerTreeExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("outer"):
        ctx = otel_context.get_current()

        def work() -> None:
            token = otel_context.attach(ctx)
            with tracer.start_as_current_span("in_thread"):
                pass
            otel_context.detach(token)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    node = exporter.tree().find(["outer", "in_thread"])
    assert node is not None and not node.is_parallel  # no thread.id: nothing to compare


def test_tree_is_incomplete_while_a_parent_span_is_still_open() -> None:
    exporter = TimerTreeExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("outer"):
        with tracer.start_as_current_span("inner"):
            pass
        partial = exporter.tree()
    assert not partial.complete and "parent span is not in the data" in partial.notes[0]
    final = exporter.tree()
    assert final.complete and final.find(["outer", "inner"]) is not None


def test_batch_span_processor_still_sees_threads() -> None:
    exporter = TimerTreeExporter()
    provider = TracerProvider()
    provider.add_span_processor(ThreadAttributesSpanProcessor())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("outer"):
        ctx = otel_context.get_current()

        def work() -> None:
            token = otel_context.attach(ctx)
            with tracer.start_as_current_span("in_thread"):
                pass
            otel_context.detach(token)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    provider.shutdown()
    node = exporter.tree().find(["outer", "in_thread"])
    assert node is not None and node.is_parallel and node.count == 3


def test_concurrent_exports_lose_nothing() -> None:
    exporter = TimerTreeExporter()

    def export_many(thread_index: int) -> None:
        for i in range(200):
            span = SpanData(
                trace_id=f"{thread_index + 1:032x}",
                span_id=f"{i + 1:016x}",
                parent_span_id="",
                name="block",
                start_ns=i,
                end_ns=i + 1000,
                attributes={semconv.THREAD_ID: thread_index},
            )
            assert exporter.export([span]) is SpanExportResult.SUCCESS

    threads = [threading.Thread(target=export_many, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(20):
        exporter.tree()  # reading while others write must be safe
    for thread in threads:
        thread.join()
    assert exporter.tree().root.children["block"].count == 800


def test_export_after_shutdown_fails_but_tree_stays_readable() -> None:
    exporter, _ = run_sdk_workload()  # the provider shut the exporter down
    before = exporter.timer_tree()
    extra = SpanData("1" * 32, "2" * 16, "", "late", 0, 1)
    assert exporter.export([extra]) is SpanExportResult.FAILURE
    assert exporter.timer_tree() == before
    assert exporter.force_flush() is True


def test_clear_forgets_spans() -> None:
    exporter, _ = run_sdk_workload()
    assert exporter.spans()
    exporter.clear()
    assert exporter.spans() == [] and not exporter.tree().complete
