"""``otel-rl replay``: send a saved OTLP-JSON spans file to a collector or backend.

The file is read through once before anything is sent, so a malformed line sends nothing; it is
then read again and sent a line (one request) at a time, so memory does not grow with it. If
the endpoint fails part-way, the command says how much arrived and exits non-zero — replaying
again would duplicate what did.
"""

from __future__ import annotations

import argparse
import math
import time
import urllib.parse
from collections.abc import Iterable

from otel_rl._internal.config import check_header
from otel_rl._internal.errors import (
    IncompleteResultError,
    UnavailableError,
    UsageError,
    UserError,
    one_line,
    shown,
)
from otel_rl._internal.otlp.delivery import GRPC_SPLIT_BYTES, Delivery, SerializedRequest
from otel_rl._internal.otlp.requests import read_request_lines
from otel_rl._internal.otlp.transport import ExportError, OtlpTransport
from otel_rl._internal.readers.boundary import describe_path

#: Attempts per request for errors the OTLP specification calls transient, with waits of
#: 0.5 s then 1 s between them (unless the server asks for another).
_ATTEMPTS = 3
_BACKOFF_S = 0.25
_MAX_RETRY_AFTER_S = 10.0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="OTLP-JSON spans file (one request a line)")
    add_endpoint_arguments(parser, required=True)


def add_endpoint_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    """The OTLP destination options shared by ``replay`` and ``import``."""
    parser.add_argument(
        "--endpoint",
        required=required,
        metavar="URL",
        help="OTLP endpoint: host:port or http(s)://host:port for gRPC; "
        "http(s)://host:port for HTTP (/v1/traces is appended)",
    )
    parser.add_argument(
        "--protocol",
        choices=("grpc", "http/protobuf"),
        default="grpc",
        help="OTLP transport (default: grpc)",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="K=V",
        help="request header / gRPC metadata; repeatable",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC for an endpoint given without a scheme (default: TLS)",
    )
    parser.add_argument("--compression", choices=("gzip", "none"), default="none")
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="seconds per request (default 10)"
    )


def make_transport(args: argparse.Namespace) -> OtlpTransport:
    """An `OtlpTransport` from the endpoint arguments; a bad value is a `UserError`."""
    headers = {}
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--header {shown(item)}: expected K=V")
        try:
            check_header(key.strip(), value.strip())
        except ValueError as exc:
            raise UsageError(f"--header {shown(item)}: {exc}") from None
        headers[key.strip()] = value.strip()
    _check_endpoint(args.endpoint)
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= 24 * 3600):
        raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    try:
        return OtlpTransport(
            args.endpoint,
            protocol=args.protocol,
            headers=headers,
            compression="gzip" if args.compression == "gzip" else None,
            timeout_s=args.timeout,
            insecure=True if args.insecure else None,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_endpoint(endpoint: str) -> None:
    """Refuse what no transport could connect to, before anything is read or sent."""
    text = endpoint.strip()
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise UsageError(f"--endpoint {shown(endpoint)}: not a host:port or a URL")
    try:
        if "://" in text:
            port = urllib.parse.urlsplit(text).port
        else:
            host, _, port_text = text.rpartition(":")
            if not host or not port_text.isdigit():
                raise ValueError("expected host:port")
            port = int(port_text)
    except ValueError as exc:
        raise UsageError(f"--endpoint {shown(endpoint)}: {one_line(exc)}") from None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--endpoint {shown(endpoint)}: port {port} is out of range")


def send_all(transport: OtlpTransport, requests: Iterable[tuple[bytes, int]], what: str,
             total_spans: int | None = None) -> None:
    """Send ``(request, span count)`` pairs in order through the shared `Delivery` (retrying
    transient failures a few times, splitting what is too large); then close. `requests` may
    be a stream when `total_spans` is given.

    A request is tried for at most twice the transport's timeout in all (a collector that
    never answers costs 2 x ``--timeout``, not three full timeouts and the waits between).

    Raises `UnavailableError` if nothing arrived and `IncompleteResultError` if only part did.
    """
    if total_spans is None:
        requests = list(requests)
        total_spans = sum(count for _request, count in requests)
    sent_spans = 0
    retried: list[ExportError] = []
    budget = 2 * transport.timeout_s
    delivery = Delivery(lambda: transport, max_attempts=_ATTEMPTS, backoff_s=_BACKOFF_S,
                        max_retry_after_s=_MAX_RETRY_AFTER_S, max_bytes=GRPC_SPLIT_BYTES,
                        on_retry=retried.append)
    try:
        for request, count in requests:
            retried.clear()
            deadline = time.monotonic() + budget
            outcome = delivery.send(SerializedRequest(request, count), deadline=deadline)
            sent_spans += outcome.sent
            if outcome.ok:
                continue
            error = outcome.error
            if isinstance(error, ExportError):
                message = error.message
            elif retried:  # the deadline passed while retrying: say what kept failing
                message = f"{retried[-1].message} (gave up after {budget:g} s)"
            else:
                message = one_line(error) or type(error).__name__
            if sent_spans == 0:
                raise UnavailableError(f"could not send {what}: {message}")
            raise IncompleteResultError(
                f"partly sent: only {sent_spans} of {total_spans} spans reached "
                f"{transport.url} before: {message}"
            )
    finally:
        delivery.close()


def run(args: argparse.Namespace) -> int:
    transport = make_transport(args)
    # Read the whole file first: a bad line must not leave half a file sent. Only counts are
    # kept; the second pass streams the requests.
    total = n_requests = 0
    for _lineno, _request, count in read_request_lines(args.file):
        total += count
        n_requests += 1
    if total == 0:
        raise UserError(f"{describe_path(args.file)}: no spans to send")
    requests = ((request, count) for _lineno, request, count in read_request_lines(args.file))
    send_all(transport, requests, args.file, total)
    print(
        f"sent {total} spans in {n_requests} requests from {args.file} "
        f"to {transport.url} ({args.protocol})"
    )
    return 0
