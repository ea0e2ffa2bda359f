"""Loopback OTLP/HTTP collectors that misbehave on purpose, started and stopped by the tests.

Requests are parsed with the real opentelemetry-proto classes; `accepted` counts the spans of
the requests answered 200 (what the client can know was delivered).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Collector:
    """`mode`: "ok" | "slow" (answer after `delay` s, keeping the connection alive) |
    "status" (answer `status`, with `retry_after` when given) | "trickle" (a 200 sent one
    byte every `delay` s) | "never" (read the request, never answer)."""

    def __init__(self, mode: str = "ok", delay: float = 0.0, status: int = 503,
                 retry_after: int | None = None, fast_first: int = 0) -> None:
        self.mode = mode
        #: Requests answered at once before the misbehaviour starts (on the same kept-alive
        #: connection).
        self.fast_first = fast_first
        self.delay = delay
        self.status = status
        self.retry_after = retry_after
        self.accepted = 0
        #: Spans of every request read whole, answered or not (what the collector has).
        self.received = 0
        #: Of those, spans of timed blocks (not the run, process or aggregate spans).
        self.blocks = 0
        #: Spans the time windows (``spans="auto"``) made up: continuations, window spans.
        self.made_up = 0
        self.requests = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket, buf: bytearray) -> bytes | None:
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value.strip())
        body = bytearray(rest)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            body += chunk
        buf[:] = body[length:]
        return bytes(body[:length])

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        conn.settimeout(60)
        try:
            while not self._stop.is_set():
                body = self._read_request(conn, buf)
                if body is None:
                    return
                parsed = [s for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                          for ss in rs.scope_spans for s in ss.spans]
                spans = len(parsed)
                timed = sum(1 for s in parsed  # (a window's continuations are not blocks)
                            if not any(a.key in ("otel_rl.kind", "otel_rl.continuation")
                                       for a in s.attributes))
                made_up = sum(1 for s in parsed if any(
                    a.key == "otel_rl.continuation" or (a.key == "otel_rl.kind"
                                                        and a.value.string_value == "window")
                    for a in s.attributes))
                with self.lock:
                    self.requests += 1
                    self.received += spans
                    self.blocks += timed
                    self.made_up += made_up
                    fast = self.requests <= self.fast_first
                if fast:
                    payload = ExportTraceServiceResponse().SerializeToString()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
                                 + payload)
                    with self.lock:
                        self.accepted += spans
                    continue
                if self.mode == "never":
                    self._stop.wait(3600)
                    return
                if self.mode == "status":
                    extra = (f"Retry-After: {self.retry_after}\r\n"
                             if self.retry_after is not None else "")
                    conn.sendall(f"HTTP/1.1 {self.status} Busy\r\nContent-Length: 0\r\n"
                                 f"{extra}\r\n".encode())
                    continue
                if self.mode == "slow" and self._stop.wait(self.delay):
                    return
                payload = ExportTraceServiceResponse().SerializeToString()
                answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                          b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
                          + payload)
                if self.mode == "trickle":
                    for i in range(len(answer)):
                        if self._stop.wait(self.delay):
                            return
                        conn.sendall(answer[i:i + 1])
                else:
                    conn.sendall(answer)
                with self.lock:
                    self.accepted += spans
        except OSError:
            return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass


@contextmanager
def collector(mode: str = "ok", **kwargs: object) -> Iterator[Collector]:
    c = Collector(mode, **kwargs)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        c.close()


def dead_endpoint() -> str:
    """An endpoint nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def wait_until(check: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


class GrpcCollector:
    """A real OTLP/gRPC trace receiver (grpcio server on loopback) answering each request
    after `delay` s; `received` counts the spans of every request it read, `accepted` those it
    answered OK."""

    def __init__(self, delay: float = 0.0) -> None:
        from concurrent import futures

        import grpc

        self.delay = delay
        self.received = 0
        self.accepted = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()

        def export(request: bytes, context: object) -> bytes:
            spans = sum(len(ss.spans) for rs in
                        ExportTraceServiceRequest.FromString(request).resource_spans
                        for ss in rs.scope_spans)
            with self.lock:
                self.received += spans
            if self.delay and self._stop.wait(self.delay):
                return b""
            with self.lock:
                self.accepted += spans
            return ExportTraceServiceResponse().SerializeToString()  # type: ignore[no-any-return]

        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export)})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self._stop.set()  # handlers still waiting return at once
        self._server.stop(0).wait(10)


@contextmanager
def grpc_collector(delay: float = 0.0) -> Iterator[GrpcCollector]:
    c = GrpcCollector(delay)
    try:
        yield c
    finally:
        c.close()
