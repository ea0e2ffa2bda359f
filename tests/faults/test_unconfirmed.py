"""A request sent whole whose answer comes after the deadline is "unconfirmed", not lost
(issue 16): the collector has it. Over a real loopback collector (`collectors.Collector`)."""

from __future__ import annotations

import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_rl._internal.otlp.delivery import Delivery, SerializedRequest
from otel_rl._internal.otlp.transport import OtlpTransport
from tests.faults.collectors import collector


def _request(spans: int) -> SerializedRequest:
    message = ExportTraceServiceRequest()
    scope = message.resource_spans.add().scope_spans.add()
    for i in range(spans):
        scope.spans.append(Span(trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"),
                                name="step"))
    return SerializedRequest(message.SerializeToString(), spans)


def test_an_answer_after_the_deadline_is_unconfirmed_and_the_next_request_timed_out() -> None:
    with collector("slow", delay=3.0) as c:
        # A backoff far past both deadlines: the second request is never tried.
        delivery = Delivery(lambda: OtlpTransport(c.endpoint, protocol="http/protobuf",
                                                  timeout_s=10.0), backoff_s=60.0)
        first = delivery.send(_request(7), deadline=time.monotonic() + 0.5)
        # Never sent: the deadline passed while the first was still unanswered.
        second = delivery.send(_request(5), deadline=time.monotonic() + 0.1)
        received = c.received
        delivery.close()
    assert (first.sent, first.lost, first.kind, first.unconfirmed) == (0, 7, "unconfirmed", 7)
    assert "no answer before the deadline" in first.reason
    assert second.kind == "timed out" and second.unconfirmed == 0 and second.lost == 5
    assert received == 7  # the collector has the unconfirmed spans, and only those
