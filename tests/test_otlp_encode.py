"""The direct encoders write what the real opentelemetry-proto classes read, and the OTLP/JSON
lines say the same as the protobuf (hex ids, 64-bit integers as strings)."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_rl._internal import semconv
from otel_rl._internal.otlp.records import Batch, JsonEncoder, _json_span, encode_batches
from otel_rl._internal.readers.otlp_json import parse_spans_text
from otel_rl._internal.record import STARTER_ENDED
from tests.fixtures.otlp_receiver import request_spans

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
RECORDS = [
    (0x00F067AA0BA902B7, 0x1111111111111111, "advance", 1_000, 2_000, 77, TRACE, None),
    (0x1111111111111111, 0, "ünïcødé \"quoted\" <name>", 500, 3_000, 77, TRACE, None),
    (0x2222222222222222, 0x1111111111111111, "boom", 1_500, 1_700, 88, TRACE,
     {"error": ("ValueError", "bad value", "Traceback ...")}),
    (0x3333333333333333, 0, "sampled", 4_000, 9_000, 88, TRACE + 1,
     {"link": (TRACE, 0x1111111111111111), "sampled": "outlier",
      "attrs": {"neg": -5, "big": 2**62, "f": 1.5, "b": True, "s": "x", "arr": [1, 2]}}),
    # The shared extra of a span whose starter ended (written from cached pieces).
    (0x4444444444444444, 0x1111111111111111, "ended", 2_000, 2_500, 88, TRACE, STARTER_ENDED),
    (0x5555555555555555, 0, "ended \"root\" é", 2_600, 2_700, 77, TRACE, STARTER_ENDED),
]
BATCHES = [Batch({"service.name": "svc", "process.pid": 4242}, 10**18, RECORDS,
                 {77: "MainThread", 88: "worker-1"})]


def test_protobuf_bytes_parse_with_the_real_classes() -> None:
    request = ExportTraceServiceRequest.FromString(encode_batches(BATCHES))
    spans = request.resource_spans[0].scope_spans[0].spans
    assert [s.name for s in spans] == [r[2] for r in RECORDS]
    first = spans[0]
    assert first.trace_id.hex() == f"{TRACE:032x}"
    assert first.span_id.hex() == "00f067aa0ba902b7"
    assert first.parent_span_id.hex() == "1111111111111111"
    assert first.start_time_unix_nano == 10**18 + 1_000
    assert first.kind == 1
    assert {kv.key: kv.value for kv in first.attributes}["thread.name"].string_value == "MainThread"
    assert spans[1].parent_span_id == b""
    assert spans[2].status.code == 2 and spans[2].events[0].name == "exception"
    assert spans[3].links[0].span_id.hex() == "1111111111111111"
    attrs = {kv.key: kv.value for kv in spans[3].attributes}
    assert attrs["neg"].int_value == -5 and attrs["big"].int_value == 2**62
    assert attrs["otel_rl.sampled"].string_value == "outlier"
    resource = {kv.key: kv.value for kv in request.resource_spans[0].resource.attributes}
    assert resource["process.pid"].int_value == 4242


def test_json_lines_say_what_the_protobuf_says() -> None:
    # Every field, as read back from each format: the JSON by otel_rl's reader, the protobuf
    # by the real opentelemetry-proto classes.
    line = JsonEncoder().request_line(BATCHES)
    from_json = parse_spans_text(line + "\n", "test")
    from_proto = request_spans(ExportTraceServiceRequest.FromString(encode_batches(BATCHES)))
    assert len(from_json) == len(RECORDS)
    assert from_json == from_proto
    assert from_json[2].is_error and from_json[3].links == [(f"{TRACE:032x}", "1111111111111111")]
    assert [s.attributes.get(semconv.STARTER_ENDED) for s in from_json[4:]] == [True, True]
    raw = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert raw[0]["spanId"] == "00f067aa0ba902b7" and raw[0]["startTimeUnixNano"] == str(10**18 + 1_000)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16_383, 16_384])
def test_long_span_bodies_get_multi_byte_lengths(n: int) -> None:
    record = (1, 0, "x" * n, 0, 1, 1, TRACE, None)
    request = ExportTraceServiceRequest.FromString(encode_batches([Batch({}, 0, [record])]))
    assert request.resource_spans[0].scope_spans[0].spans[0].name == "x" * n


@pytest.mark.parametrize("psid", [0, 0x1111111111111111])
def test_a_starter_ended_span_from_cached_pieces_is_the_general_paths_span(psid: int) -> None:
    # The same span, as JSON, whether its shared extra takes the cached pieces (the first
    # time: pieces made; the second: pieces reused) or the general path for any extra.
    encoder = JsonEncoder()
    names = {88: "learner \ud800 \"x\""}
    for name in ("trainer_advance", "ünï \"q\" <n>", "trainer_advance"):
        record = (0x4444444444444444, psid, name, 2_000, 2_500, 88, TRACE, STARTER_ENDED)
        fast = encoder.span(record, 10**18, names)
        assert json.loads(fast) == json.loads(json.dumps(_json_span(record, 10**18, names),
                                                         separators=(",", ":")))
        plain = encoder.span((*record[:7], None), 10**18, names)
        assert json.loads(plain)["attributes"] == json.loads(fast)["attributes"][:2]
