"""A request sent whole whose answer comes after the deadline is "unconfirmed", not lost
(issue 16): the collector has it. Over real loopback collectors (`collectors.Collector`, and
`GrpcCollector`, a grpcio server: a gRPC deadline on a ready connection is unconfirmed, one
while it could not connect is lost)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_rl._internal.otlp.delivery import Delivery, SerializedRequest
from otel_rl._internal.otlp.transport import OtlpTransport
from tests.faults.collectors import collector, dead_endpoint, grpc_collector
from tests.faults.helpers import blocks, exit_lines, file_spans, ledger, lost, run_workload
from tests.faults.workload import expected_blocks


def _request(spans: int) -> SerializedRequest:
    message = ExportTraceServiceRequest()
    scope = message.resource_spans.add().scope_spans.add()
    for i in range(spans):
        scope.spans.append(Span(trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"),
                                name="step"))
    return SerializedRequest(message.SerializeToString(), spans)


@pytest.mark.parametrize(("protocol", "deadline_s", "says"), [
    ("http/protobuf", 0.5, "no answer before the deadline"),
    ("grpc", 1.0, "no answer"),  # (a ready channel: the request left)
])
def test_an_answer_after_the_deadline_is_unconfirmed_what_never_left_timed_out(
        protocol: str, deadline_s: float, says: str) -> None:
    opened = grpc_collector(delay=3.0) if protocol == "grpc" else collector("slow", delay=3.0)
    with opened as c:
        # A backoff far past both deadlines: the second request is never tried.
        delivery = Delivery(lambda: OtlpTransport(c.endpoint, protocol=protocol,
                                                  timeout_s=10.0), backoff_s=60.0)
        first = delivery.send(_request(7), deadline=time.monotonic() + deadline_s)
        # Never sent: the deadline passed while the first was still unanswered.
        second = delivery.send(_request(5), deadline=time.monotonic() + 0.1)
        received = c.received
        delivery.close()
    assert (first.sent, first.lost, first.kind, first.unconfirmed) == (0, 7, "unconfirmed", 7)
    assert says in first.reason
    assert second.kind == "timed out" and second.unconfirmed == 0 and second.lost == 5
    assert received == 7  # the collector has the unconfirmed spans, and only those


def test_grpc_nothing_listening_is_unreachable_and_lost_not_unconfirmed() -> None:
    delivery = Delivery(lambda: OtlpTransport(dead_endpoint(), protocol="grpc",
                                              timeout_s=10.0), backoff_s=60.0)
    outcome = delivery.send(_request(4), deadline=time.monotonic() + 1.0)
    delivery.close()
    assert (outcome.lost, outcome.kind, outcome.unconfirmed) == (4, "unreachable", 0)


def test_grpc_workload_slower_than_the_deadline_counts_unconfirmed_exactly(
        tmp_path: Path) -> None:
    # Every request answered after 60 s: shutdown's deadline (2 s) cuts them off; the
    # requests the collector read are unconfirmed, the rest (never sent) lost, exactly.
    with grpc_collector(delay=60.0) as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--protocol", "grpc",
                               "--blocks", "150", "--shutdown-timeout", "2")
        received, accepted = c.received, c.accepted
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    assert book is not None
    otlp, file = book["sinks"]["otlp"], book["sinks"]["file"]
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert blocks(spans) == expected_blocks(150) and file["delivered"] == len(spans)
    assert accepted == otlp["delivered"] == 0
    assert otlp["unconfirmed"] == received > 0
    assert otlp["unconfirmed"] + lost(otlp) == otlp["recorded"] == len(spans)
    assert set(otlp["lost"]) <= {"timed out"}
    (line,) = exit_lines(proc.stderr)
    assert f"{received} unconfirmed (sent, no answer before the deadline)" in line
    print(f"LEDGER grpc slow 60 s: expected {len(spans)} / otlp delivered 0 / lost "
          f"{lost(otlp)} / unconfirmed {received} (the collector received {received})")
