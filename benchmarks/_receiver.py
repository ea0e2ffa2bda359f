"""A small OTLP trace receiver for the benchmarks, run in its own process.

The receiver parses every request as a real ``ExportTraceServiceRequest`` and counts the spans
in it. It runs in a separate process on purpose: the benchmarks measure the CPU time of the
process that records spans (``time.process_time()`` counts every thread of a process), and the
receiver's parsing must not be billed to it.

It listens on 127.0.0.1 only: OTLP/HTTP (``POST /v1/traces``; ``/v1/metrics`` is accepted
and not counted) and OTLP/gRPC (the generic
``TraceService/Export`` method). ``GET /count`` answers ``{"spans": n, "requests": m}``.

    with ReceiverProcess() as receiver:
        export_to(receiver.http_endpoint)
        receiver.wait_for(expected)

Only the standard library is imported at module level, so importing this module (as spawn
workers do when they import the benchmark script) costs nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans = 0
        self.requests = 0

    def add(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest.FromString(body)
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.spans += n
            self.requests += 1

    def as_dict(self) -> dict[str, int]:
        with self.lock:
            return {"spans": self.spans, "requests": self.requests}


def _serve() -> None:
    """The receiver process: print the endpoints as one JSON line, serve until stdin closes."""
    import gzip
    import http.server
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    counter = _Counter()
    ok: bytes = ExportTraceServiceResponse().SerializeToString()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real collectors do

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/metrics":  # OTLP metrics: accepted, not parsed
                self._reply(200, b"", "application/x-protobuf")
                return
            if self.path != "/v1/traces":
                self._reply(404, b"", "text/plain")
                return
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            try:
                counter.add(body)
            except Exception:  # a request that does not parse is a 400, as in a collector
                self._reply(400, b"", "text/plain")
                return
            self._reply(200, ok, "application/x-protobuf")

        def do_GET(self) -> None:
            if self.path != "/count":
                self._reply(404, b"", "text/plain")
                return
            self._reply(200, json.dumps(counter.as_dict()).encode(), "application/json")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def export(request: bytes, context: Any) -> bytes:
        counter.add(request)
        return ok

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    server.add_generic_rpc_handlers((handler,))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"http": httpd.server_address[1], "grpc": grpc_port}), flush=True)
    sys.stdin.read()  # the parent closes our stdin (or dies): time to go
    server.stop(0)
    httpd.shutdown()
    httpd.server_close()


class ReceiverProcess:
    """Starts the receiver in a child process; a context manager that stops it on exit."""

    def __init__(self, start_timeout: float = 30.0) -> None:
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
        line = _readline(self._proc, start_timeout)
        try:
            ports = json.loads(line)
        except ValueError:
            self.close()
            raise RuntimeError(f"the OTLP receiver did not start (said {line!r})") from None
        self.http_port: int = ports["http"]
        self.grpc_port: int = ports["grpc"]
        self.http_endpoint = f"http://127.0.0.1:{self.http_port}"
        self.grpc_endpoint = f"http://127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def counts(self) -> dict[str, int]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            conn.request("GET", "/count")
            return json.loads(conn.getresponse().read())  # type: ignore[no-any-return]
        finally:
            conn.close()

    def spans(self) -> int:
        """Spans received so far."""
        return self.counts()["spans"]

    def wait_for(self, n: int, timeout: float = 30.0, settle: float = 0.3) -> int:
        """Wait until at least `n` spans arrived (or `timeout`); then wait until the count has
        been still for `settle` seconds, so extra (unexpected) spans are seen too."""
        deadline = time.monotonic() + timeout
        count = self.spans()
        while count < n and time.monotonic() < deadline:
            time.sleep(0.02)
            count = self.spans()
        still_since = time.monotonic()
        while time.monotonic() - still_since < settle and time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.spans()
            if now != count:
                count, still_since = now, time.monotonic()
        return count

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's first stdout line, or "" if it does not come within `timeout`."""
    result: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0].strip() if result else ""


if __name__ == "__main__":
    _serve()
