"""OtlpTransport against real servers: a grpcio server and an http.server on 127.0.0.1, TLS
with openssl-made certificates, and the real Jaeger v2 (marked ``jaeger``)."""

from __future__ import annotations

import gzip
import http.server
import logging
import multiprocessing
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_rl._internal.otlp.spans import encode_spans
from otel_rl._internal.otlp.transport import ExportError, OtlpTransport
from tests.fixtures.jaeger import free_port, spans_of
from tests.spans import make_spans

# Helpers -----------------------------------------------------------------------------------


def partial_success(rejected: int, message: str) -> bytes:
    response = ExportTraceServiceResponse()
    response.partial_success.rejected_spans = rejected
    response.partial_success.error_message = message
    return response.SerializeToString()


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpReceiver:
    """An OTLP/HTTP server: records requests and answers from a script (default: 200, empty)."""

    server: http.server.ThreadingHTTPServer
    received: list[Received] = field(default_factory=list)
    replies: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    close_after_reply: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def _handler(receiver_ref: list[HttpReceiver]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a real collector

        def do_POST(self) -> None:
            receiver = receiver_ref[0]
            body = self.rfile.read(int(self.headers["Content-Length"]))
            receiver.received.append(
                Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            status, headers, reply = receiver.replies.pop(0) if receiver.replies else (200, {}, b"")
            self.send_response(status)
            for key, value in {"Content-Type": "application/x-protobuf", **headers}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            # Close without announcing it: the client's kept-alive connection goes stale.
            self.close_connection = receiver.close_after_reply

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    ref: list[HttpReceiver] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(ref))
    server.daemon_threads = True
    ref.append(HttpReceiver(server))
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield ref[0]
    server.shutdown()
    server.server_close()


@dataclass
class GrpcReceiver:
    port: int
    received: list[tuple[bytes, dict[str, str]]]
    behave: list[Callable[[Any], bytes]]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_grpc_receiver(
    options: list[tuple[str, Any]] | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, GrpcReceiver]:
    receiver = GrpcReceiver(0, [], [])

    def export(request: bytes, context: Any) -> bytes:
        receiver.received.append((request, dict(context.invocation_metadata())))
        if receiver.behave:
            return receiver.behave.pop(0)(context)
        return b""

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},  # bytes in, bytes out
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler], options=options or [])
    if credentials is None:
        receiver.port = server.add_insecure_port("127.0.0.1:0")
    else:
        receiver.port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, receiver


@pytest.fixture
def grpc_receiver() -> Iterator[GrpcReceiver]:
    server, receiver = start_grpc_receiver()
    yield receiver
    server.stop(0)


# HTTP --------------------------------------------------------------------------------------


def test_http_posts_protobuf_to_v1_traces_with_headers(http_receiver: HttpReceiver) -> None:
    _, spans = make_spans(3, "svc")
    request = encode_spans(spans)
    transport = OtlpTransport(
        http_receiver.url, protocol="http/protobuf", headers={"Authorization": "Bearer t0k"}
    )
    transport.send(request)
    got = http_receiver.received[0]
    assert got.path == "/v1/traces"
    assert got.headers["content-type"] == "application/x-protobuf"
    assert got.headers["authorization"] == "Bearer t0k"
    assert "content-encoding" not in got.headers
    assert got.body == request


@pytest.mark.parametrize(
    ("suffix", "full", "path"),
    [
        ("/otlp", False, "/otlp/v1/traces"),
        ("/otlp/", False, "/otlp/v1/traces"),
        ("", False, "/v1/traces"),
        ("/custom/traces", True, "/custom/traces"),
        ("/v1/traces?tenant=a", True, "/v1/traces?tenant=a"),
    ],
)
def test_http_path_follows_generic_vs_traces_endpoint_rule(
    http_receiver: HttpReceiver, suffix: str, full: bool, path: str
) -> None:
    transport = OtlpTransport(
        http_receiver.url + suffix, protocol="http/protobuf", traces_endpoint_is_full=full
    )
    transport.send(b"")
    assert http_receiver.received[0].path == path
    assert transport.url == http_receiver.url + path


def test_http_gzip_body_decompresses_to_the_request(http_receiver: HttpReceiver) -> None:
    _, spans = make_spans(50, "svc")
    request = encode_spans(spans)
    OtlpTransport(http_receiver.url, protocol="http/protobuf", compression="gzip").send(request)
    got = http_receiver.received[0]
    assert got.headers["content-encoding"] == "gzip"
    assert len(got.body) < len(request)
    assert gzip.decompress(got.body) == request


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (502, True), (503, True), (504, True), (400, False), (401, False),
     (404, False), (413, False), (500, False)],
)  # fmt: skip
def test_http_error_statuses_are_retryable_only_where_otlp_says(
    http_receiver: HttpReceiver, status: int, retryable: bool
) -> None:
    http_receiver.replies.append((status, {}, b""))
    with pytest.raises(ExportError) as info:
        OtlpTransport(http_receiver.url, protocol="http/protobuf").send(b"")
    assert info.value.retryable is retryable
    assert f"HTTP {status}" in info.value.message
    assert info.value.too_large is (status == 413)


def test_http_retry_after_and_status_message_are_reported(http_receiver: HttpReceiver) -> None:
    body = status_pb2.Status(code=8, message="ingestion rate limit exceeded").SerializeToString()
    http_receiver.replies.append((429, {"Retry-After": "7"}, body))
    with pytest.raises(ExportError) as info:
        OtlpTransport(http_receiver.url, protocol="http/protobuf").send(b"")
    assert info.value.retryable
    assert info.value.retry_after_s == 7.0
    assert "ingestion rate limit exceeded" in info.value.message
    assert "\n" not in info.value.message


def test_http_partial_success_logs_rejected_spans(
    http_receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    http_receiver.replies.append((200, {}, partial_success(3, "spans too old")))
    transport = OtlpTransport(http_receiver.url, protocol="http/protobuf")
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        transport.send(b"")
    assert transport.rejected_spans == 3
    assert "rejected 3 span(s): spans too old" in caplog.text


def test_http_resends_once_when_the_server_dropped_a_kept_alive_connection(
    http_receiver: HttpReceiver,
) -> None:
    http_receiver.close_after_reply = True
    transport = OtlpTransport(http_receiver.url, protocol="http/protobuf")
    for body in (b"\x0a\x00", b"\x0a\x01", b"\x0a\x02"):
        transport.send(body)
    assert [r.body for r in http_receiver.received] == [b"\x0a\x00", b"\x0a\x01", b"\x0a\x02"]


def test_http_connection_is_reused_and_recreated_after_close(http_receiver: HttpReceiver) -> None:
    transport = OtlpTransport(http_receiver.url, protocol="http/protobuf")
    transport.send(b"1")
    transport.send(b"2")
    transport.close()
    transport.send(b"3")
    assert [r.body for r in http_receiver.received] == [b"1", b"2", b"3"]


# gRPC --------------------------------------------------------------------------------------


def test_grpc_sends_the_bytes_unchanged_with_headers_as_metadata(
    grpc_receiver: GrpcReceiver,
) -> None:
    _, spans = make_spans(4, "svc")
    request = encode_spans(spans)
    transport = OtlpTransport(
        f"http://{grpc_receiver.target}", headers={"X-Scope-OrgID": "tenant-1"}
    )
    transport.send(request)
    body, metadata = grpc_receiver.received[0]
    assert body == request
    assert metadata["x-scope-orgid"] == "tenant-1"  # gRPC metadata keys are lowercase
    assert metadata["user-agent"].startswith("otel-rl-otlp")


def test_grpc_gzip_is_really_applied() -> None:
    # A server with gzip disabled refuses a gzip message: proof the client compressed it.
    server, receiver = start_grpc_receiver([("grpc.compression_enabled_algorithms_bitset", 1)])
    try:
        OtlpTransport(receiver.target, insecure=True).send(b"\x0a\x00")
        with pytest.raises(ExportError) as info:
            OtlpTransport(receiver.target, insecure=True, compression="gzip").send(b"\x0a\x00")
        assert "gzip" in info.value.message
        assert info.value.retryable is False
    finally:
        server.stop(0)


def _abort(code: grpc.StatusCode, details: str = "no") -> Callable[[Any], bytes]:
    def behave(context: Any) -> bytes:
        context.abort(code, details)
        raise AssertionError("unreachable")

    return behave


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.CANCELLED, True),
        (grpc.StatusCode.ABORTED, True),
        (grpc.StatusCode.DATA_LOSS, True),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.PERMISSION_DENIED, False),
        (grpc.StatusCode.UNAUTHENTICATED, False),
        (grpc.StatusCode.UNIMPLEMENTED, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False),  # retryable only with RetryInfo
    ],
)
def test_grpc_status_codes_are_retryable_only_where_otlp_says(
    grpc_receiver: GrpcReceiver, code: grpc.StatusCode, retryable: bool
) -> None:
    grpc_receiver.behave.append(_abort(code, "because"))
    with pytest.raises(ExportError) as info:
        OtlpTransport(grpc_receiver.target, insecure=True).send(b"")
    assert info.value.retryable is retryable
    assert f"gRPC {code.name}: because" in info.value.message


def test_grpc_resource_exhausted_with_retry_info_is_retryable_after_the_delay(
    grpc_receiver: GrpcReceiver,
) -> None:
    def behave(context: Any) -> bytes:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.seconds = 2
        info.retry_delay.nanos = 500_000_000
        status = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        status.message = "slow down"
        status.details.add().Pack(info)
        context.set_trailing_metadata([("grpc-status-details-bin", status.SerializeToString())])
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
        raise AssertionError("unreachable")

    grpc_receiver.behave.append(behave)
    with pytest.raises(ExportError) as info:
        OtlpTransport(grpc_receiver.target, insecure=True).send(b"")
    assert info.value.retryable
    assert info.value.retry_after_s == pytest.approx(2.5)


def test_grpc_partial_success_logs_rejected_spans(
    grpc_receiver: GrpcReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    grpc_receiver.behave.append(lambda context: partial_success(5, "bad attributes"))
    transport = OtlpTransport(grpc_receiver.target, insecure=True)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        transport.send(b"")
        transport.send(b"")  # a plain success adds nothing
    assert transport.rejected_spans == 5
    assert "rejected 5 span(s): bad attributes" in caplog.text


def test_grpc_channel_is_recreated_after_close(grpc_receiver: GrpcReceiver) -> None:
    transport = OtlpTransport(grpc_receiver.target, insecure=True)
    transport.send(b"\x0a\x00")
    transport.close()
    transport.send(b"\x0a\x01")
    assert [body for body, _ in grpc_receiver.received] == [b"\x0a\x00", b"\x0a\x01"]


def _send_in_child(transport: OtlpTransport, body: bytes) -> None:
    transport.reset_after_fork()
    transport.send(body)
    transport.close()


def test_transports_made_before_fork_work_in_the_child_after_reset(
    grpc_receiver: GrpcReceiver, http_receiver: HttpReceiver
) -> None:
    grpc_transport = OtlpTransport(grpc_receiver.target, insecure=True)
    http_transport = OtlpTransport(http_receiver.url, protocol="http/protobuf")
    grpc_transport.send(b"\x0a\x00")  # the parent's channel/connection exist at fork time
    http_transport.send(b"parent")
    context = multiprocessing.get_context("fork")
    for transport, body in ((grpc_transport, b"\x0a\x01"), (http_transport, b"child")):
        child = context.Process(target=_send_in_child, args=(transport, body))
        child.start()
        child.join(30)
        assert child.exitcode == 0
    grpc_transport.send(b"\x0a\x02")  # and the parent's still work
    http_transport.send(b"parent again")
    assert [body for body, _ in grpc_receiver.received] == [b"\x0a\x00", b"\x0a\x01", b"\x0a\x02"]
    assert [r.body for r in http_receiver.received] == [b"parent", b"child", b"parent again"]


# Failing endpoints -------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_unreachable_endpoint_raises_retryable_error_quickly(protocol: str) -> None:
    port = free_port()  # nothing listens there
    transport = OtlpTransport(f"http://127.0.0.1:{port}", protocol=protocol, timeout_s=5)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(ExportError) as info:
        transport.send(b"")
    assert time.monotonic() - started < 2.0
    assert info.value.retryable
    assert "refused" in info.value.message.lower()
    assert str(port) in info.value.message


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_silent_endpoint_times_out_within_the_timeout(protocol: str) -> None:
    # Listens (the TCP handshake completes) but never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        transport = OtlpTransport(
            f"http://127.0.0.1:{port}",
            protocol=protocol,  # type: ignore[arg-type]
            timeout_s=0.5,
        )
        started = time.monotonic()
        with pytest.raises(ExportError) as info:
            transport.send(b"")
        elapsed = time.monotonic() - started
    assert 0.4 < elapsed < 3.0
    assert info.value.retryable


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"endpoint": "x:1", "protocol": "udp"}, "protocol"),
        ({"endpoint": "x:1", "compression": "zstd"}, "compression"),
        ({"endpoint": "x:1", "timeout_s": 0}, "timeout"),
        ({"endpoint": "ftp://x:1"}, "scheme"),
        ({"endpoint": "127.0.0.1:4318", "protocol": "http/protobuf"}, "http://"),
        ({"endpoint": "x:1", "client_key_file": "k.pem"}, "together"),
    ],
)
def test_invalid_settings_raise_value_error(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        OtlpTransport(**kwargs)


def test_grpc_endpoint_scheme_decides_tls() -> None:
    assert OtlpTransport("http://h:1").url == "http://h:1"
    assert OtlpTransport("https://h:1", insecure=True).url == "https://h:1"  # scheme wins
    assert OtlpTransport("h:1").url == "https://h:1"  # the specification's default: TLS
    assert OtlpTransport("h:1", insecure=True).url == "http://h:1"


# TLS ---------------------------------------------------------------------------------------


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    lax_ca: Path
    lax_server_cert: Path
    lax_server_key: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    # A CA as RFC 5280 wants it, which Python 3.13's strict verification (VERIFY_X509_STRICT)
    # insists on: basicConstraints critical, keyUsage keyCertSign, key identifiers. A bare
    # `openssl req -x509` (OpenSSL 3) makes no keyUsage: see `lax_ca` below.
    (d / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\n[dn]\n[ca]\n"
        "basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid:always\n"
    )
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=otel-rl test CA", "-config", "ca.cnf", "-extensions", "ca")  # fmt: skip
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "lax-ca.key", "-out",
        "lax-ca.pem", "-days", "2", "-subj", "/CN=otel-rl lax test CA")  # fmt: skip
    (d / "leaf.ext").write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nauthorityKeyIdentifier = keyid\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
    )
    for ca, name in (("ca", "server"), ("ca", "client"), ("lax-ca", "lax-server")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "leaf.ext")  # fmt: skip
    return Certs(
        d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
        d / "lax-ca.pem", d / "lax-server.pem", d / "lax-server.key",
    )


def test_grpc_tls_with_ca_and_client_certificate(certs: Certs) -> None:
    credentials = grpc.ssl_server_credentials(
        [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes(),
        require_client_auth=True,
    )
    server, receiver = start_grpc_receiver(credentials=credentials)
    try:
        OtlpTransport(
            f"https://{receiver.target}",
            certificate_file=str(certs.ca),
            client_certificate_file=str(certs.client_cert),
            client_key_file=str(certs.client_key),
        ).send(b"\x0a\x00")
        assert receiver.received[0][0] == b"\x0a\x00"
        with pytest.raises(ExportError):  # no client certificate: refused
            OtlpTransport(
                f"https://{receiver.target}", certificate_file=str(certs.ca), timeout_s=3
            ).send(b"\x0a\x00")
        with pytest.raises(ExportError):  # plaintext to a TLS server
            OtlpTransport(f"http://{receiver.target}", timeout_s=3).send(b"\x0a\x00")
    finally:
        server.stop(0)


def test_http_tls_verifies_the_server_against_the_ca(
    certs: Certs, http_receiver: HttpReceiver
) -> None:
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    http_receiver.server.socket = context.wrap_socket(http_receiver.server.socket, server_side=True)
    url = http_receiver.url.replace("http://", "https://")
    OtlpTransport(url, protocol="http/protobuf", certificate_file=str(certs.ca)).send(b"tls")
    assert http_receiver.received[-1].body == b"tls"
    with pytest.raises(ExportError) as info:  # the system CAs do not know this server
        OtlpTransport(url, protocol="http/protobuf", timeout_s=3).send(b"x")
    assert not info.value.retryable
    assert "TLS" in info.value.message


def test_a_private_ca_refused_only_by_strict_checks_is_named_in_the_error(
    certs: Certs, http_receiver: HttpReceiver
) -> None:
    """A CA without keyUsage (bare `openssl req -x509`): Python 3.13+ refuses it, and the
    one-line error says which check and that it is the strict one; older Pythons take it."""
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.lax_server_cert, certs.lax_server_key)
    http_receiver.server.socket = context.wrap_socket(http_receiver.server.socket, server_side=True)
    url = http_receiver.url.replace("http://", "https://")
    transport = OtlpTransport(url, protocol="http/protobuf", certificate_file=str(certs.lax_ca))
    if not ssl.create_default_context().verify_flags & ssl.VERIFY_X509_STRICT:
        transport.send(b"lax")  # Python <= 3.12: not checked strictly
        assert http_receiver.received[-1].body == b"lax"
        return
    with pytest.raises(ExportError) as info:
        transport.send(b"lax")
    assert not info.value.retryable
    assert info.value.message == (
        f"{url}/v1/traces: TLS error: certificate verify failed: CA cert does not include key"
        " usage extension (refused by strict X.509 checks, the default since Python 3.13:"
        " see README, TLS)"
    )


# Real Jaeger -------------------------------------------------------------------------------


@pytest.mark.jaeger
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_jaeger_stores_what_the_transport_sends(
    jaeger: Any, jaeger_service: str, protocol: str, compression: str | None
) -> None:
    endpoint = (
        f"http://{jaeger.otlp_grpc_endpoint}" if protocol == "grpc" else jaeger.otlp_http_endpoint
    )
    trace_id, spans = make_spans(5, jaeger_service)
    transport = OtlpTransport(endpoint, protocol=protocol, compression=compression)  # type: ignore[arg-type]
    transport.send(encode_spans(spans))
    transport.close()
    stored = spans_of(jaeger.wait_for_spans(trace_id, 5))
    assert sorted(s["name"] for s in stored) == sorted(s.name for s in spans)
    assert {s["spanId"] for s in stored} == {s.span_id for s in spans}
    assert all(s["_resource"]["service.name"] == jaeger_service for s in stored)


@pytest.mark.jaeger
def test_jaeger_grpc_refuses_over_4_mib_even_gzipped_but_http_takes_it(
    jaeger: Any, jaeger_service: str
) -> None:
    trace_id, spans = make_spans(5, jaeger_service, pad=1024 * 1024)  # ~5 MiB, compresses to KiB
    request = encode_spans(spans)
    assert len(request) > 4 * 1024 * 1024
    for compression in (None, "gzip"):
        with pytest.raises(ExportError) as info:
            OtlpTransport(
                f"http://{jaeger.otlp_grpc_endpoint}",
                compression=compression,  # type: ignore[arg-type]
            ).send(request)
        assert info.value.too_large and not info.value.retryable
        assert "RESOURCE_EXHAUSTED" in info.value.message
    OtlpTransport(jaeger.otlp_http_endpoint, protocol="http/protobuf", compression="gzip").send(
        request
    )
    assert len(spans_of(jaeger.wait_for_spans(trace_id, 5))) == 5


@pytest.mark.jaeger
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_jaeger_rejects_garbage_as_not_retryable(jaeger: Any, protocol: str) -> None:
    endpoint = (
        f"http://{jaeger.otlp_grpc_endpoint}" if protocol == "grpc" else jaeger.otlp_http_endpoint
    )
    with pytest.raises(ExportError) as info:
        OtlpTransport(endpoint, protocol=protocol).send(b"\xff\xff\xff")  # type: ignore[arg-type]
    assert not info.value.retryable


def test_encode_spans_groups_spans_by_resource() -> None:
    _, a = make_spans(2, "a")
    _, b = make_spans(1, "b")
    request = ExportTraceServiceRequest.FromString(encode_spans([a[0], b[0], a[1]]))
    services = [
        next(kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name")
        for rs in request.resource_spans
    ]
    assert services == ["a", "b"]
    assert [len(rs.scope_spans[0].spans) for rs in request.resource_spans] == [2, 1]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_missing_certificate_file_is_a_final_export_error(tmp_path: Path, protocol: str) -> None:
    missing = str(tmp_path / "no-such-ca.pem")
    transport = OtlpTransport(
        "https://127.0.0.1:1",
        protocol=protocol,  # type: ignore[arg-type]
        certificate_file=missing,
    )
    with pytest.raises(ExportError) as info:
        transport.send(b"")
    assert not info.value.retryable
    assert "no-such-ca.pem" in info.value.message
