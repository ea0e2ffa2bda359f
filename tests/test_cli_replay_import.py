"""``otel-rl replay`` and ``otel-rl import`` against the real Jaeger v2, with spans files in the
real OTLP-JSON format (one written by Jaeger itself) and timers.json written by the real
``mlagents_envs.timers``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlagents_envs import timers as mla
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from otel_rl._internal import semconv
from otel_rl._internal.cli import main
from otel_rl._internal.otlp.requests import (
    read_request_lines,
    request_span_count,
    request_to_json_line,
)
from otel_rl._internal.otlp.spans import encode_spans
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree
from tests.fixtures.jaeger import attributes_of, free_port, spans_of, start_backend
from tests.spans import make_spans
from tests.test_otlp_transport import HttpReceiver, http_receiver  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)


def write_spans_file(path: Path, *batches: list[SpanData]) -> Path:
    path.write_text("".join(request_to_json_line(encode_spans(b)) + "\n" for b in batches))
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def grpc_endpoint(jaeger: Any) -> str:
    return f"http://{jaeger.otlp_grpc_endpoint}"


# spans file format -------------------------------------------------------------------------


def test_spans_file_round_trips_ids_as_hex(tmp_path: Path) -> None:
    trace_id, spans = make_spans(3, "svc")
    path = write_spans_file(tmp_path / "spans.jsonl", spans)
    line = json.loads(path.read_text())
    ids = {s["spanId"] for s in line["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    assert ids == {s.span_id for s in spans}  # hex, as the Collector's file exporter writes
    assert line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == trace_id
    ((_lineno, request, _count),) = read_request_lines(path)
    assert request == encode_spans(spans)


def test_spans_file_reader_reads_gzip_and_skips_blank_lines(tmp_path: Path) -> None:
    import gzip

    _, a = make_spans(2, "svc")
    _, b = make_spans(3, "svc")
    text = "\n" + request_to_json_line(encode_spans(a)) + "\n\n"
    text += request_to_json_line(encode_spans(b)) + "\n"
    path = tmp_path / "spans.jsonl.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert [request_span_count(r) for _n, r, _c in read_request_lines(path)] == [2, 3]


# replay ------------------------------------------------------------------------------------


@pytest.mark.jaeger
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_replay_sends_every_span_and_jaeger_has_them(
    jaeger: Any,
    jaeger_service: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    protocol: str,
) -> None:
    t1, first = make_spans(4, jaeger_service)
    t2, second = make_spans(3, jaeger_service)
    path = write_spans_file(tmp_path / "spans.jsonl", first, second)
    endpoint = grpc_endpoint(jaeger) if protocol == "grpc" else jaeger.otlp_http_endpoint
    code, out, err = cli(
        capsys,
        "replay",
        str(path),
        "--endpoint",
        endpoint,
        "--protocol",
        protocol,
        "--header",
        "X-Scope-OrgID=t1",
        "--compression",
        "gzip",
    )
    assert (code, err) == (0, "")
    assert "sent 7 spans in 2 requests" in out
    got = spans_of(jaeger.wait_for_spans(t1, 4)) + spans_of(jaeger.wait_for_spans(t2, 3))
    by_id = {s["spanId"]: s for s in got}
    for span in first + second:
        stored = by_id[span.span_id]
        assert stored["name"] == span.name
        assert stored.get("parentSpanId", "") == span.parent_span_id
        assert int(stored["startTimeUnixNano"]) == span.start_ns
        assert int(stored["endTimeUnixNano"]) == span.end_ns
        assert attributes_of(stored)["i"] == span.attributes["i"]
        assert (stored.get("status", {}).get("code") == 2) is span.is_error


@pytest.mark.jaeger
def test_replay_of_a_file_jaeger_wrote_reproduces_the_trace_in_another_jaeger(
    jaeger: Any,
    jaeger_binary: str,
    jaeger_service: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Spans from the real OTel SDK; the spans file is Jaeger's own OTLP-JSON answer.
    provider = TracerProvider(resource=Resource.create({"service.name": jaeger_service}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True))
    )
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("iteration", attributes={"n": 3}) as root:
        with tracer.start_as_current_span("rollout"):
            pass
        with tracer.start_as_current_span("update") as update:
            update.set_status(Status(StatusCode.ERROR, "nan loss"))
            update.add_event("exception", {"exception.type": "ValueError"})
    provider.shutdown()
    trace_id = format(root.get_span_context().trace_id, "032x")
    original = jaeger.wait_for_spans(trace_id, 3)
    path = tmp_path / "from-jaeger.jsonl"
    path.write_text(json.dumps(original["result"]) + "\n")

    other = start_backend(jaeger_binary, tmp_path / "other")
    try:
        code, out, _ = cli(capsys, "replay", str(path), "--endpoint", grpc_endpoint(other))
        assert code == 0, out
        replayed = other.wait_for_spans(trace_id, 3)
    finally:
        other.process.stop()

    def essence(response: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted(
            (
                s["spanId"],
                s.get("parentSpanId", ""),
                s["name"],
                s["startTimeUnixNano"],
                s["endTimeUnixNano"],
                json.dumps(s.get("attributes"), sort_keys=True),
                json.dumps(s.get("events"), sort_keys=True),
                json.dumps(s.get("status"), sort_keys=True),
                s["_resource"]["service.name"],
            )
            for s in spans_of(response)
        )

    assert essence(replayed) == essence(original)


@pytest.mark.jaeger
def test_replay_splits_lines_over_the_grpc_message_limit(
    jaeger: Any, jaeger_service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_id, spans = make_spans(9, jaeger_service, pad=1024 * 1024)  # one 9 MiB line
    path = write_spans_file(tmp_path / "big.jsonl", spans)
    code, out, err = cli(capsys, "replay", str(path), "--endpoint", grpc_endpoint(jaeger))
    assert (code, err) == (0, "")
    assert "sent 9 spans in 1 requests" in out
    assert len(spans_of(jaeger.wait_for_spans(trace_id, 9))) == 9


@pytest.mark.jaeger
def test_replay_with_a_malformed_line_sends_nothing(
    jaeger: Any, jaeger_service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_id, spans = make_spans(2, jaeger_service)
    path = write_spans_file(tmp_path / "spans.jsonl", spans)
    path.write_text(path.read_text() + '{"resourceSpans": [{"scopeSpans": 7}]}\n')
    since = time.time_ns() - 60 * 10**9
    code, out, err = cli(capsys, "replay", str(path), "--endpoint", grpc_endpoint(jaeger))
    assert code == 4
    assert err.startswith(f"otel-rl replay: {path}:2: not an OTLP-JSON trace request")
    assert err.count("\n") == 1 and out == ""
    time.sleep(0.3)  # longer than Jaeger's batch timeout: anything sent would show by now
    assert jaeger.get_trace(trace_id) is None
    assert jaeger.find_traces(jaeger_service, since) == []


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (
            '{"resourceSpans": []}\n{"resourceSp',
            ":2: not an OTLP-JSON trace request (the last line is cut short)",
        ),
        ("not json\n", ":1: not an OTLP-JSON trace request: invalid JSON"),
        (
            '{"traces": []}\n',
            ":1: not an OTLP-JSON trace request: expected an object with 'resourceSpans'",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}\n',
            "bad traceId 'zz'",
        ),
        ("\n\n", "no spans to send"),
    ],
)
def test_replay_bad_files_get_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, fragment: str
) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text(content)
    port = free_port()  # never contacted: the file is checked first
    code, out, err = cli(capsys, "replay", str(path), "--endpoint", f"http://127.0.0.1:{port}")
    assert code == 4 and out == ""  # bad input
    assert err.startswith("otel-rl replay: ") and err.count("\n") == 1
    assert fragment in err


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_replay_to_an_unreachable_endpoint_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    _, spans = make_spans(2, "svc")
    path = write_spans_file(tmp_path / "spans.jsonl", spans)
    port = free_port()
    started = time.monotonic()
    code, out, err = cli(
        capsys,
        "replay",
        str(path),
        "--endpoint",
        f"http://127.0.0.1:{port}",
        "--protocol",
        protocol,
        "--timeout",
        "2",
    )
    assert time.monotonic() - started < 5  # two short retries, then give up
    assert code == 5 and out == ""  # unavailable
    assert err.startswith(f"otel-rl replay: could not send {path}: ")
    assert str(port) in err and err.count("\n") == 1


def test_replay_says_when_only_part_of_the_file_arrived(
    http_receiver: HttpReceiver,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, a = make_spans(3, "svc")
    _, b = make_spans(2, "svc")
    _, c = make_spans(4, "svc")
    path = write_spans_file(tmp_path / "spans.jsonl", a, b, c)
    http_receiver.replies += [(200, {}, b""), (200, {}, b""), (400, {}, b"bad request")]
    code, out, err = cli(
        capsys, "replay", str(path), "--endpoint", http_receiver.url, "--protocol", "http/protobuf"
    )
    assert code == 3 and out == ""
    assert err.startswith("otel-rl replay: partly sent: only 5 of 9 spans reached")
    assert "HTTP 400" in err and err.count("\n") == 1
    assert len(http_receiver.received) == 3  # not retried: 400 is final


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--header", "novalue"], "--header 'novalue': expected K=V"),
        # gRPC's core would log its own multi-line complaint at send time for these.
        (["--header", "a=b\r\nX: y"], "holds control characters"),
        (["--header", "bad key=v"], "'bad key' is not a header name"),
        (["--header", ":authority=x"], "':authority' is not a header name"),
        (["--timeout", "0"], "--timeout must be a positive number"),
        (["--protocol", "http/protobuf", "--endpoint", "127.0.0.1:4318"], "http:// or https://"),
    ],
)
def test_replay_bad_arguments_get_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    _, spans = make_spans(1, "svc")
    path = write_spans_file(tmp_path / "spans.jsonl", spans)
    argv = ["replay", str(path), "--endpoint", "http://127.0.0.1:1", *args]
    code, _, err = cli(capsys, *argv)
    assert code == 2 and fragment in err and err.count("\n") == 1


# import ------------------------------------------------------------------------------------


def _ml_agents_timers_json(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A timers.json written by the real ML-Agents timers, with a parallel worker subtree."""
    mla.reset_timers()

    @mla.timed
    def update_policy() -> None:
        time.sleep(0.002)

    with mla.hierarchical_timer("TrainerController.start_learning"):
        for step in range(3):
            with mla.hierarchical_timer("env_step"):
                time.sleep(0.001)
                with mla.hierarchical_timer("policy.evaluate"):
                    time.sleep(0.001)
            if step == 2:
                update_policy()
            mla.set_gauge("reward", float(step))
    worker = mla.TimerStack()
    with mla.hierarchical_timer("collect", worker), mla.hierarchical_timer("env.reset", worker):
        time.sleep(0.001)
    mla.get_timer_root().merge(worker.get_root(), "worker", is_parallel=True)
    mla.add_metadata("trainer", "ppo")
    tree = mla.get_timer_tree()
    path = tmp_path / "timers.json"
    path.write_text(json.dumps(tree, indent=2))
    return path, tree


def _nodes(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out = {}
    for name, child in tree.get("children", {}).items():
        out[(*path, name)] = child
        out.update(_nodes(child, (*path, name)))
    return out


@pytest.mark.jaeger
def test_import_makes_a_synthetic_trace_that_mirrors_the_tree(
    jaeger: Any, jaeger_service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, tree = _ml_agents_timers_json(tmp_path)
    code, out, err = cli(
        capsys,
        "import",
        str(path),
        "--endpoint",
        grpc_endpoint(jaeger),
        "--service-name",
        jaeger_service,
    )
    assert (code, err) == (0, "")
    trace_id = out.strip().splitlines()[-1].removeprefix("trace id: ")
    nodes = _nodes(tree)
    spans = spans_of(jaeger.wait_for_spans(trace_id, len(nodes) + 1))
    assert len(spans) == len(nodes) + 1

    by_id = {s["spanId"]: s for s in spans}

    def path_of(span: dict[str, Any]) -> tuple[str, ...]:
        names: list[str] = []
        while span.get("parentSpanId"):
            names.insert(0, span["name"])
            span = by_id[span["parentSpanId"]]
        return tuple(names)

    (run,) = [s for s in spans if not s.get("parentSpanId")]
    run_attrs = attributes_of(run)
    assert run_attrs[semconv.KIND] == semconv.KIND_RUN
    assert run_attrs[semconv.SYNTHETIC] is True
    assert run_attrs["otel_rl.gauge.reward.max"] == 2.0
    assert run_attrs["otel_rl.gauge.reward.count"] == 3
    assert run_attrs["otel_rl.metadata.trainer"] == "ppo"
    assert int(run["endTimeUnixNano"]) - int(run["startTimeUnixNano"]) == round(tree["total"] * 1e9)

    by_path = {path_of(s): s for s in spans if s is not run}
    assert set(by_path) == set(nodes)  # nesting right: one span per node, under its parent
    for node_path, node in nodes.items():
        span = by_path[node_path]
        attrs = attributes_of(span)
        assert attrs[semconv.SYNTHETIC] is True
        assert attrs[semconv.COUNT] == node["count"]
        assert attrs["otel_rl.self_seconds"] == pytest.approx(node["self"], abs=1e-9)
        assert attrs.get("otel_rl.is_parallel", False) is node.get("is_parallel", False)
        duration = int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])
        assert duration == round(node["total"] * 1e9)
    assert by_path[("worker", "collect", "env.reset")] is not None
    assert attributes_of(by_path[("worker",)])["otel_rl.is_parallel"] is True

    # Children are laid out one after another from their parent's start.
    for parent_path in [(), *nodes]:
        parent = run if parent_path == () else by_path[parent_path]
        cursor = int(parent["startTimeUnixNano"])
        children = [p for p in nodes if p[:-1] == parent_path]
        for child_path in children:  # in timers.json order
            child = by_path[child_path]
            assert int(child["startTimeUnixNano"]) == cursor
            cursor = int(child["endTimeUnixNano"])


def test_import_output_file_is_read_back_by_the_tree_builder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file
    from otel_rl._internal.treebuild import build_tree

    path, tree = _ml_agents_timers_json(tmp_path)
    output = tmp_path / "spans.jsonl"
    code, out, _ = cli(capsys, "import", str(path), "--output", str(output))
    assert code == 0
    assert f"wrote {len(_nodes(tree)) + 1} spans to {output}" in out
    rebuilt = build_tree(read_otlp_json_file(output))
    original = Tree.from_dict(tree)
    for node_path, node in _nodes(tree).items():
        again = rebuilt.find(node_path)
        assert again is not None, node_path
        assert again.count == node["count"]
        assert again.total == pytest.approx(node["total"], abs=1e-9)
        assert again.is_parallel is node.get("is_parallel", False), node_path
    assert rebuilt.root.total == pytest.approx(original.root.total, abs=1e-9)
    assert rebuilt.gauges["reward"].max == 2.0
    assert rebuilt.metadata["trainer"] == "ppo"


@pytest.mark.jaeger
def test_import_output_can_be_replayed_later(
    jaeger: Any, jaeger_service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, tree = _ml_agents_timers_json(tmp_path)
    output = tmp_path / "spans.jsonl"
    code, out, _ = cli(
        capsys, "import", str(path), "--output", str(output), "--service-name", jaeger_service
    )
    assert code == 0
    trace_id = out.strip().splitlines()[-1].removeprefix("trace id: ")
    assert jaeger.get_trace(trace_id) is None  # --output alone sends nothing
    code, out, _ = cli(
        capsys,
        "replay",
        str(output),
        "--endpoint",
        jaeger.otlp_http_endpoint,
        "--protocol",
        "http/protobuf",
    )
    assert code == 0
    assert (
        len(spans_of(jaeger.wait_for_spans(trace_id, len(_nodes(tree)) + 1)))
        == len(_nodes(tree)) + 1
    )


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "timers.json: invalid JSON"),
        ('{"name": "root", "total": "slow", "count": 1}', "'total' must be a number"),
        ("[1, 2]", "root: expected a JSON object"),
    ],
)
def test_import_invalid_timers_json_gets_the_tree_models_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, fragment: str
) -> None:
    path = tmp_path / "timers.json"
    path.write_text(content)
    code, out, err = cli(capsys, "import", str(path), "--output", str(tmp_path / "o.jsonl"))
    assert code == 4 and out == ""
    assert err.startswith("otel-rl import: ") and err.count("\n") == 1
    assert fragment in err
    assert not (tmp_path / "o.jsonl").exists()


def test_import_needs_somewhere_to_put_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _ml_agents_timers_json(tmp_path)
    code, _, err = cli(capsys, "import", str(path))
    assert code == 2 and "give --endpoint" in err
    code, _, err = cli(capsys, "import", str(tmp_path / "missing.json"), "--output", "x")
    assert code == 4 and "no such file" in err and err.count("\n") == 1


def test_import_to_an_unreachable_endpoint_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _ml_agents_timers_json(tmp_path)
    port = free_port()
    code, _out, err = cli(
        capsys,
        "import",
        str(path),
        "--endpoint",
        f"127.0.0.1:{port}",
        "--insecure",
        "--timeout",
        "1",
    )
    assert code == 5
    assert err.startswith("otel-rl import: could not send") and err.count("\n") == 1


@pytest.mark.jaeger
def test_the_installed_command_line_runs_replay(
    jaeger: Any, jaeger_service: str, tmp_path: Path
) -> None:
    trace_id, spans = make_spans(2, jaeger_service)
    path = write_spans_file(tmp_path / "spans.jsonl", spans)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_rl",
            "replay",
            str(path),
            "--endpoint",
            jaeger.otlp_grpc_endpoint,
            "--insecure",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "sent 2 spans in 1 requests" in result.stdout
    assert len(spans_of(jaeger.wait_for_spans(trace_id, 2))) == 2
