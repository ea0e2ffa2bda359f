"""Readers: OTLP/JSON files, Jaeger api_v3 and Tempo answers -> the same tree as the SDK saw.

The documents are made from real OTel SDK spans through the SDK's own OTLP encoder, then put
into each backend's documented shape; the HTTP fetches run against a local http.server.
"""

from __future__ import annotations

import copy
import gzip
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal.errors import UserError
from otel_rl._internal.readers import (
    fetch_jaeger,
    fetch_tempo,
    normalize_trace_id,
    parse_jaeger,
    parse_tempo,
    read_spans_file,
)
from otel_rl._internal.readers.otlp_json import any_value, parse_otlp_json_lines
from otel_rl._internal.readers.sdk import spans_from_sdk
from otel_rl._internal.treebuild import build_tree
from tests.test_sdk_exporter import otlp_request, run_sdk_workload, to_otlp_json


@pytest.fixture(scope="module")
def workload() -> tuple[dict[str, Any], list[Any], str]:
    """(expected timer tree dict, the SDK spans, their trace id)."""
    exporter, spans = run_sdk_workload()
    expected = exporter.timer_tree()
    trace_id = f"{spans[0].context.trace_id:032x}"
    return expected, spans, trace_id


def _one_request_per_span(spans: list[Any], **kwargs: Any) -> list[str]:
    return [json.dumps(to_otlp_json(otlp_request([s]), **kwargs)) + "\n" for s in spans]


# --- OTLP/JSON files ---------------------------------------------------------------------


def test_collector_file_gives_the_same_tree_as_the_exporter(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    expected, spans, _ = workload
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(_one_request_per_span(spans)))
    read = read_spans_file(path)
    assert len(read) == len(spans)
    assert build_tree(read).to_dict() == expected


def test_spans_read_back_equal_the_sdk_spans(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    _, spans, _ = workload
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(to_otlp_json(otlp_request(spans))) + "\n")
    key = lambda s: s.span_id  # noqa: E731
    assert sorted(read_spans_file(path), key=key) == sorted(spans_from_sdk(spans), key=key)


def test_protobuf_canonical_json_and_numeric_int64_read_the_same(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    expected, spans, _ = workload
    canonical = tmp_path / "canonical.jsonl"  # base64 ids, enum names, int64 as strings
    canonical.write_text(json.dumps(otlp_request(spans)) + "\n")
    numbers = tmp_path / "numbers.jsonl"  # hex ids, int64 as plain numbers
    numbers.write_text("".join(_one_request_per_span(spans, int64_as_numbers=True)))
    assert build_tree(read_spans_file(canonical)).to_dict() == expected
    assert build_tree(read_spans_file(numbers)).to_dict() == expected


def test_gzip_file_and_last_line_without_newline(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    expected, spans, _ = workload
    path = tmp_path / "spans.jsonl.gz"
    path.write_bytes(gzip.compress("".join(_one_request_per_span(spans)).rstrip("\n").encode()))
    assert build_tree(read_spans_file(path)).to_dict() == expected


def test_saved_pretty_printed_jaeger_answer_reads_as_a_file(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    expected, spans, _ = workload
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"result": to_otlp_json(otlp_request(spans))}, indent=2))
    assert build_tree(read_spans_file(path)).to_dict() == expected


def test_other_signals_in_the_same_file_are_skipped(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    expected, spans, _ = workload
    lines = _one_request_per_span(spans)
    lines.insert(1, json.dumps({"resourceMetrics": []}) + "\n")
    path = tmp_path / "all.jsonl"
    path.write_text("\n".join(lines))  # blank lines between records, too
    assert build_tree(read_spans_file(path)).to_dict() == expected


def test_any_value_converts_every_kind() -> None:
    value = {
        "kvlistValue": {
            "values": [
                {"key": "s", "value": {"stringValue": "x"}},
                {"key": "b", "value": {"boolValue": True}},
                {"key": "i", "value": {"intValue": "-9007199254740993"}},
                {"key": "j", "value": {"intValue": 7}},
                {"key": "d", "value": {"doubleValue": 0.5}},
                {"key": "inf", "value": {"doubleValue": "Infinity"}},
                {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}, {}]}}},
                {"key": "y", "value": {"bytesValue": "AAE="}},
                {"key": "e", "value": {}},
            ]
        }
    }
    assert any_value(value, "x") == {
        "s": "x",
        "b": True,
        "i": -9007199254740993,
        "j": 7,
        "d": 0.5,
        "inf": float("inf"),
        "a": [1, None],
        "y": b"\x00\x01",
        "e": None,
    }


def _error(lines: list[str]) -> str:
    with pytest.raises(UserError) as info:
        parse_otlp_json_lines(lines, "spans.jsonl")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_malformed_json_line_names_the_line(
    workload: tuple[dict[str, Any], list[Any], str],
) -> None:
    lines = _one_request_per_span(workload[1])
    lines[2] = lines[2][:40] + "}\n"
    assert _error(lines).startswith("spans.jsonl line 3: invalid JSON (")


def test_truncated_last_line_is_an_error_not_a_shorter_trace(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    text = "".join(_one_request_per_span(workload[1]))
    path = tmp_path / "spans.jsonl"
    path.write_text(text[:-25])
    with pytest.raises(UserError, match=r"line \d+: truncated record"):
        read_spans_file(path)
    gz = tmp_path / "spans.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode())[:-30])
    with pytest.raises(UserError, match="broken gzip file"):
        read_spans_file(gz)


def test_truncated_pretty_printed_document_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text('{\n  "result": {\n    "resourceSpans": [\n')
    with pytest.raises(UserError, match="truncated JSON document"):
        read_spans_file(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", "line 1: expected an OTLP JSON object, got a list"),
        ('{"spans": []}', "line 1: not an OTLP trace export"),
        ('{"resourceSpans": {}}', "line 1: 'resourceSpans' must be a list"),
        (
            '{"name": "root", "total": 1.0, "count": 1, "self": 1.0}',
            "line 1: this is a timers.json, not spans",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abc", "spanId": '
            '"0102030405060708", "name": "x", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]}',
            "line 1: resourceSpans[0].scopeSpans[0].spans[0]: bad traceId 'abc'",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
            + "ab" * 16
            + '", "spanId": "0102030405060708", "name": "x", "startTimeUnixNano": "soon", '
            '"endTimeUnixNano": "2"}]}]}]}',
            "'startTimeUnixNano' must be an integer",
        ),
    ],
)
def test_wrong_shapes_are_one_line_errors(line: str, message: str) -> None:
    assert message in _error([line + "\n"])


def test_missing_and_binary_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_spans_file(tmp_path / "nope.jsonl")
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError, match="not UTF-8"):
        read_spans_file(binary)


def test_empty_file_has_no_spans(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    assert read_spans_file(path) == []


# --- Backend documents -------------------------------------------------------------------


def tempo_v1(spans: list[Any]) -> dict[str, Any]:
    return {"batches": otlp_request(spans)["resourceSpans"]}


def tempo_v2(spans: list[Any]) -> dict[str, Any]:
    return {"trace": {"resourceSpans": otlp_request(spans)["resourceSpans"]}}


def jaeger_doc(spans: list[Any]) -> dict[str, Any]:
    return {"result": to_otlp_json(otlp_request(spans))}


def test_tempo_documents_give_the_same_tree(
    workload: tuple[dict[str, Any], list[Any], str],
) -> None:
    expected, spans, _ = workload
    v1, v2 = tempo_v1(spans), tempo_v2(spans)
    # Tempo's shape: base64 ids and enum names.
    first = v1["batches"][0]["scopeSpans"][0]["spans"][0]
    assert len(first["traceId"]) == 24 and first["kind"] == "SPAN_KIND_INTERNAL"
    assert build_tree(parse_tempo(v1)).to_dict() == expected
    assert build_tree(parse_tempo(v2)).to_dict() == expected


def test_tempo_partial_answer_makes_the_tree_incomplete(
    workload: tuple[dict[str, Any], list[Any], str],
) -> None:
    doc = tempo_v2(workload[1])
    doc.update(status="PARTIAL", message="trace exceeds max size")
    tree = build_tree(parse_tempo(doc))
    assert not tree.complete
    assert tree.notes == ["Tempo returned only part of the trace (trace exceeds max size)"]


def test_jaeger_documents_give_the_same_tree_whole_or_in_chunks(
    workload: tuple[dict[str, Any], list[Any], str],
) -> None:
    expected, spans, _ = workload
    doc = jaeger_doc(spans)
    first = doc["result"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(first["traceId"]) == 32 and isinstance(first["kind"], int)
    assert build_tree(parse_jaeger(doc)).to_dict() == expected
    chunks = "\n".join(json.dumps(jaeger_doc([s])) for s in spans)
    assert build_tree(parse_jaeger(chunks)).to_dict() == expected


def test_error_status_read_from_names_and_numbers(
    workload: tuple[dict[str, Any], list[Any], str],
) -> None:
    _, spans, _ = workload
    for parsed in (parse_tempo(tempo_v1(spans)), parse_jaeger(jaeger_doc(spans))):
        errors = {s.name for s in parsed if s.is_error}
        assert errors == {"save_model"}  # caught right outside it
        save = next(s for s in parsed if s.name == "save_model")
        assert save.events[0].name == "exception"
        assert save.events[0].attributes["exception.message"] == "disk full"


def test_trace_ids_are_normalized_or_rejected() -> None:
    assert normalize_trace_id("ABC") == "0" * 29 + "abc"
    for bad in ("xyz", "1" * 33, "", "0" * 32):
        with pytest.raises(UserError, match="bad trace ID"):
            normalize_trace_id(bad)


# --- HTTP fetches against a local server ---------------------------------------------------


class _Server:
    """A tiny http.server on 127.0.0.1 answering path -> (status, JSON body)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, Any]] = {}
        self.requests: list[str] = []
        routes, requests = self.routes, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                status, body = routes.get(self.path, (404, {"error": {"message": "not found"}}))
                payload = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_fetch_jaeger_reads_the_trace(
    workload: tuple[dict[str, Any], list[Any], str], server: _Server
) -> None:
    expected, spans, trace_id = workload
    server.routes[f"/api/v3/traces/{trace_id}"] = (200, jaeger_doc(spans))
    fetched = fetch_jaeger(server.url + "/", trace_id.upper(), timeout=5)
    assert build_tree(fetched).to_dict() == expected


def test_fetch_jaeger_unknown_trace_is_not_found(server: _Server) -> None:
    with pytest.raises(UserError, match=r"^trace ID 0+1234 not found in Jaeger at http://"):
        fetch_jaeger(server.url, "1234", timeout=5)
    assert server.requests == ["/api/v3/traces/" + "0" * 28 + "1234"]


def test_fetch_jaeger_server_error_and_bad_body(server: _Server) -> None:
    server.routes["/api/v3/traces/" + "1" * 32] = (500, {"error": {"message": "storage\ndown"}})
    server.routes["/api/v3/traces/" + "2" * 32] = (200, b"<html>not json</html>")
    with pytest.raises(UserError, match=r"answered HTTP 500: storage down$"):
        fetch_jaeger(server.url, "1" * 32, timeout=5)
    with pytest.raises(UserError, match="invalid JSON"):
        fetch_jaeger(server.url, "2" * 32, timeout=5)


def test_fetch_unreachable_backend_is_a_one_line_error() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(UserError, match=rf"^cannot reach Jaeger at {url}: connection refused$"):
        fetch_jaeger(url, "1" * 32, timeout=2)
    with pytest.raises(UserError, match=rf"^cannot reach Tempo at {url}: "):
        fetch_tempo(url, "1" * 32, timeout=2)


def test_fetch_times_out_on_a_silent_server() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts connections, never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(UserError, match=rf"^cannot reach Jaeger at {url}: "):
            fetch_jaeger(url, "1" * 32, timeout=0.3)


def test_fetch_tempo_prefers_v2_and_falls_back_to_v1(
    workload: tuple[dict[str, Any], list[Any], str], server: _Server
) -> None:
    expected, spans, trace_id = workload
    server.routes[f"/api/traces/{trace_id}"] = (200, tempo_v1(spans))
    assert build_tree(fetch_tempo(server.url, trace_id, timeout=5)).to_dict() == expected
    assert server.requests == [f"/api/v2/traces/{trace_id}", f"/api/traces/{trace_id}"]
    server.routes[f"/api/v2/traces/{trace_id}"] = (200, tempo_v2(spans))
    server.requests.clear()
    assert build_tree(fetch_tempo(server.url, trace_id, timeout=5)).to_dict() == expected
    assert server.requests == [f"/api/v2/traces/{trace_id}"]


def test_fetch_tempo_unknown_trace_is_not_found(server: _Server) -> None:
    with pytest.raises(UserError, match=r"^trace ID 0+beef not found in Tempo at http://"):
        fetch_tempo(server.url, "beef", timeout=5)


def test_documents_are_not_modified_by_reading(
    workload: tuple[dict[str, Any], list[Any], str],
) -> None:
    doc = tempo_v2(workload[1])
    before = copy.deepcopy(doc)
    parse_tempo(doc)
    assert doc == before
