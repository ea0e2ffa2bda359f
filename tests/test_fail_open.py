"""Telemetry failures never reach the training code, never hang exit, and what they cost is
counted and reported once. Bad settings: ValueError for arguments, warning + default for env."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import config
from otel_rl.timers import get_timer_tree, hierarchical_timer
from tests.signals import default_signals


def train(steps: int = 200) -> None:
    for _ in range(steps):
        with hierarchical_timer("advance"):
            with hierarchical_timer("update"):
                pass


def dropped_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "otel_rl" and "were not exported" in r.getMessage()]


@pytest.fixture
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()  # nothing listens here now
    return port


@pytest.fixture
def blackhole() -> Iterator[int]:
    """Accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(server.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(server.getsockname()[1])
    stop.set()
    t.join()
    for c in conns:
        c.close()
    server.close()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_unreachable_collector_costs_spans_not_the_run(protocol: str, closed_port: int,
                                                       tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    otel_rl.configure(endpoint=f"http://127.0.0.1:{closed_port}", protocol=protocol,
                      spans="all", output_dir=str(tmp_path), flush_interval=0.1)
    train()
    started = time.monotonic()
    otel_rl.shutdown(timeout=2.0)
    assert time.monotonic() - started < 4.0
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["advance"]["count"] == 200  # the tree is exact regardless
    # 400 blocks, the run span and the aggregate span
    assert int(tree["metadata"]["otel_rl_dropped_spans"]) == 402
    warnings = dropped_warnings(caplog)
    assert len(warnings) == 1 and "402" in warnings[0]
    # The file sink still got everything.
    lines = (tmp_path / "spans.otlp.jsonl").read_text().splitlines()
    assert sum(len(ss["spans"]) for line in lines for rs in json.loads(line)["resourceSpans"]
               for ss in rs["scopeSpans"]) == 402


def test_collector_that_never_answers_does_not_hang_exit(blackhole: int, tmp_path: Path) -> None:
    otel_rl.configure(endpoint=f"http://127.0.0.1:{blackhole}", spans="all",
                      output_dir=str(tmp_path), timeout=30)
    train(50)
    started = time.monotonic()
    otel_rl.shutdown(timeout=1.5)
    assert time.monotonic() - started < 3.5
    assert (tmp_path / "timers.json").exists()


def test_process_exit_is_bounded_with_collector_down(closed_port: int, tmp_path: Path) -> None:
    script = (
        "import otel_rl\nfrom otel_rl.timers import hierarchical_timer as h\n"
        f"otel_rl.configure(endpoint='http://127.0.0.1:{closed_port}', spans='all', "
        "shutdown_timeout=1.5)\n"
        "for _ in range(100):\n    with h('x'):\n        pass\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0
    assert time.monotonic() - started < 20
    assert proc.stderr.count("were not exported") == 1  # reported once, at exit


class RaisingExporter:
    def export(self, spans: Any) -> Any:
        raise RuntimeError("exporter bug")

    def shutdown(self) -> None:
        raise RuntimeError("shutdown bug")

    def force_flush(self, timeout_millis: int = 0) -> bool:
        raise RuntimeError("flush bug")


def test_exporter_that_raises_never_reaches_training(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    otel_rl.configure(spans="all", output_dir=str(tmp_path), exporters=[RaisingExporter()],
                      flush_interval=0.05)
    train(100)
    time.sleep(0.2)
    train(100)
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["advance"]["count"] == 200
    raised = [r for r in caplog.records if "exporter bug" in r.getMessage()]
    assert len(raised) == 1


def test_full_buffer_drops_are_counted_and_the_tree_stays_exact(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    otel_rl.configure(spans="all", output_dir=str(tmp_path), max_buffer=100, flush_interval=3600)
    train(500)
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["advance"]["count"] == 500
    assert tree["children"]["advance"]["children"]["update"]["count"] == 500
    assert int(tree["metadata"]["otel_rl_dropped_spans"]) == 900
    warnings = dropped_warnings(caplog)
    assert len(warnings) == 1 and "900 of 1002 lost (buffer full 900)" in warnings[0]


def test_unwritable_output_dir_is_reported_not_raised(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    otel_rl.configure(spans="all", output_dir=str(blocker / "run"))
    train(10)
    otel_rl.shutdown()
    assert any("cannot write" in r.getMessage() for r in caplog.records)
    assert get_timer_tree()["children"]["advance"]["count"] == 10


def test_sdk_disabled_means_no_spans_and_no_files(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, otlp_receiver: Any) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.chdir(tmp_path)
    otel_rl.configure(endpoint=otlp_receiver.http_endpoint, output_dir=str(tmp_path / "out"))
    train(20)
    otel_rl.shutdown()
    assert get_timer_tree()["children"]["advance"]["count"] == 20  # timers still work
    assert otlp_receiver.spans() == []
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "otel-rl-runs").exists()


def test_shutdown_is_idempotent_and_configure_twice_reconfigures(tmp_path: Path) -> None:
    otel_rl.configure(spans="all", output_dir=str(tmp_path / "one"))
    train(3)
    otel_rl.configure(spans="all", output_dir=str(tmp_path / "two"))
    train(2)
    otel_rl.shutdown()
    otel_rl.shutdown()
    assert (tmp_path / "one" / "timers.json").exists()
    assert (tmp_path / "two" / "timers.json").exists()


@pytest.mark.parametrize("arguments", [
    {"spans": "sometimes"}, {"protocol": "carrier-pigeon"}, {"span_budget": 0},
    {"span_budget": -5}, {"timeout": "ten"}, {"disabled": "yes"},
    {"exporters": [object()]}, {"compression": "brotli"}, {"service_name": ""},
])
def test_invalid_arguments_raise_value_error(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        otel_rl.configure(**arguments)


@pytest.mark.parametrize(("variable", "value", "setting", "default"), [
    ("OTEL_RL_SPANS", "sometimes", "spans", "auto"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten", "timeout", 10.0),
    ("OTEL_RL_SPAN_BUDGET", "-3", "span_budget", 10_000),
    ("OTEL_SDK_DISABLED", "perhaps", "disabled", False),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp", "protocol", "http/protobuf"),
    ("OTEL_RESOURCE_ATTRIBUTES", "novalue", "resource_attributes", {}),
])
def test_malformed_environment_warns_and_uses_default(variable: str, value: str, setting: str,
                                                      default: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    config._warned.discard(variable)
    settings = config.resolve({}, {variable: value})
    assert getattr(settings, setting) == default
    assert any(variable in r.getMessage() for r in caplog.records)


def test_precedence_argument_then_otel_rl_then_otel_then_default() -> None:
    env = {"OTEL_SERVICE_NAME": "from-otel", "OTEL_RL_SERVICE_NAME": "from-otel-rl",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/v1/traces",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_RESOURCE_ATTRIBUTES": "team=rl,service.name=x"}
    s = config.resolve({}, env)
    assert s.service_name == "from-otel-rl"
    assert s.endpoint == "http://traces:4318/v1/traces" and s.traces_endpoint_is_full
    assert s.timeout == 2.5
    assert s.resource_attributes == {"team": "rl", "service.name": "x"}
    assert config.resolve({"service_name": "arg"}, env).service_name == "arg"
    assert config.resolve({}, {"OTEL_SERVICE_NAME": "from-otel"}).service_name == "from-otel"
    assert config.resolve({}, {"OTEL_RESOURCE_ATTRIBUTES": "service.name=res"}).service_name == "res"
    generic = config.resolve({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318"})
    assert generic.endpoint == "http://generic:4318" and not generic.traces_endpoint_is_full
    assert config.resolve({}, {}).spans == "auto"


def test_headers_and_resource_attributes_reach_the_wire(otlp_receiver: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret%20value")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
    otel_rl.configure(endpoint=otlp_receiver.http_endpoint, spans="all", compression="gzip",
                      output_dir=str(tmp_path))
    train(3)
    otel_rl.shutdown()
    spans = otlp_receiver.wait_for(8)
    assert len(spans) == 8  # 6 blocks, the run span, the aggregate span
    assert spans[0].resource["deployment.environment"] == "ci"
    assert otlp_receiver.headers[0]["x-api-key"] == "secret value"
    assert otlp_receiver.headers[0].get("content-encoding") == "gzip"


KILLED = """
import os, signal, sys, time
import otel_rl
from otel_rl.timers import hierarchical_timer
otel_rl.configure(output_dir=sys.argv[1], spans="all", timers_interval=0.2, flush_interval=0.1)
if len(sys.argv) > 3:
    signal.signal(signal.SIGTERM, lambda *a: (print("own handler"), sys.exit(7)))
for _ in range(50):
    with hierarchical_timer("advance"):
        pass
time.sleep(0.6)
os.kill(os.getpid(), getattr(signal, sys.argv[2]))
time.sleep(5)
"""


def test_sigterm_flushes_and_writes_timers_json_then_dies_of_sigterm(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), "SIGTERM"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -15, proc.stderr
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["advance"]["count"] == 50
    lines = (tmp_path / "spans.otlp.jsonl").read_text().splitlines()
    names = {s["name"] for line in lines for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]}
    # the run span was written: a clean shutdown
    assert names == {"advance", "run", "otel_rl aggregate"}


def test_a_programs_own_sigterm_handler_is_left_alone(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), "SIGTERM", "own"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7 and "own handler" in proc.stdout
    assert json.loads((tmp_path / "timers.json").read_text())["children"]["advance"]["count"] == 50


def test_sigkilled_run_keeps_a_recent_timers_json(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), "SIGKILL"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9
    tree = json.loads((tmp_path / "timers.json").read_text())  # written during the run
    assert tree["children"]["advance"]["count"] == 50


def test_ctrl_c_still_exits_as_killed_by_sigint(tmp_path: Path) -> None:
    # Shutdown at exit writes timers.json and reports drops; the exit status stays Python's.
    script = (
        "import os, signal, threading, time, otel_rl\n"
        "from otel_rl.timers import hierarchical_timer as h\n"
        f"otel_rl.configure(output_dir={str(tmp_path)!r}, spans='all', max_buffer=2)\n"
        "for _ in range(5):\n    with h('x'):\n        pass\n"
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, preexec_fn=default_signals)
    assert proc.returncode == -2, proc.stderr
    assert "KeyboardInterrupt" in proc.stderr and "were not exported" in proc.stderr
    assert json.loads((tmp_path / "timers.json").read_text())["children"]["x"]["count"] == 5


def test_requests_over_the_receivers_size_limit_are_split_not_dropped(tmp_path: Path) -> None:
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    received: list[int] = []

    def export(request: bytes, context: Any) -> bytes:
        received.append(sum(len(ss.spans) for rs in ExportTraceServiceRequest.FromString(request)
                            .resource_spans for ss in rs.scope_spans))
        return ExportTraceServiceResponse().SerializeToString()

    server = grpc.server(futures.ThreadPoolExecutor(2),
                         options=[("grpc.max_receive_message_length", 32 * 1024)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        otel_rl.configure(endpoint=f"http://127.0.0.1:{port}", protocol="grpc", spans="all",
                          output_dir=str(tmp_path), batch_size=2048, flush_interval=3600)
        train(1000)  # ~2000 spans: one 2048-span request would be ~200 KiB
        otel_rl.shutdown(timeout=20)
    finally:
        server.stop(0)
    assert sum(received) == 2002 and len(received) > 1  # blocks, run span, aggregate
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert "otel_rl_dropped_spans" not in tree["metadata"]


def test_the_servers_retry_after_is_honoured(tmp_path: Path) -> None:
    import http.server

    attempts: list[float] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            attempts.append(time.monotonic())
            busy = len(attempts) == 1
            self.send_response(503 if busy else 200)
            if busy:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        otel_rl.configure(endpoint=f"http://127.0.0.1:{httpd.server_address[1]}", spans="all",
                          output_dir=str(tmp_path), flush_interval=3600)
        train(5)
        otel_rl.shutdown(timeout=10)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert len(attempts) == 2
    assert attempts[1] - attempts[0] >= 0.9  # waited as asked (the own backoff is 0.5 s)
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert "otel_rl_dropped_spans" not in tree["metadata"]
