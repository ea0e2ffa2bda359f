"""Raw OTLP trace transport: send an already-serialised ``ExportTraceServiceRequest``.

The export pipeline encodes spans itself, so this layer only moves bytes: over gRPC as a
generic unary call with identity (de)serialisers — nothing is parsed on the way out — or as an
HTTP POST of ``application/x-protobuf``. Failures become `ExportError` with a ``retryable``
verdict taken from the OTLP specification; the caller decides whether and when to retry.

Endpoint rules follow the OTel exporter specification:

- gRPC: ``host:port``, ``http://host:port`` (plaintext) or ``https://host:port`` (TLS). The
  ``insecure`` flag only matters when there is no scheme; its default is TLS.
- HTTP: a URL with ``http://`` or ``https://``. The generic endpoint
  (``OTEL_EXPORTER_OTLP_ENDPOINT``) gets ``v1/traces`` appended; the traces-specific one
  (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``traces_endpoint_is_full=True``) is used as is.

The channel or connection is created on the first `OtlpTransport.send`, so a transport can be
built before a fork and used in the child after `OtlpTransport.reset_after_fork`.

Example::

    transport = OtlpTransport("http://127.0.0.1:4317", protocol="grpc", compression="gzip")
    transport.send(encode_spans(spans))
    transport.close()
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import logging
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = ["GRPC_MAX_MESSAGE_BYTES", "ExportError", "OtlpTransport"]

_log = logging.getLogger("otel_rl")

Protocol = Literal["grpc", "http/protobuf"]

#: gRPC servers (the Collector, Jaeger, Tempo) refuse messages over 4 MiB unless configured
#: with a larger ``max_recv_msg_size_mib``. grpc-go compares the *decompressed* size, so gzip
#: does not lift the limit: keep requests smaller (`otlp.requests.split_request`).
GRPC_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

_GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
#: The gRPC method and HTTP path of each signal otel_rl sends.
_GRPC_METHODS = {"traces": _GRPC_METHOD,
                 "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"}
Signal = Literal["traces", "metrics"]
_USER_AGENT = "otel-rl-otlp"
#: HTTP statuses the OTLP specification calls retryable.
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


class ExportError(Exception):
    """A request was not delivered. ``retryable`` says whether sending it again may succeed.

    ``retry_after_s`` is the server's requested delay, when it gave one; ``too_large`` is set
    when the receiver refused the message for its size (split it instead of retrying).
    """

    def __init__(
        self,
        retryable: bool,
        message: str,
        *,
        retry_after_s: float | None = None,
        too_large: bool = False,
        kind: str = "rejected",
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.message = message
        self.retry_after_s = retry_after_s
        self.too_large = too_large
        #: For the ledger: "unreachable" (no connection), "timed out" (no answer in time) or
        #: "rejected" (the receiver answered with an error).
        self.kind = kind


class OtlpTransport:
    """Sends serialised OTLP trace export requests to one endpoint over gRPC or HTTP.

    Thread-safe: concurrent `send` calls are serialised. ``rejected_spans`` counts spans the
    receiver reported as rejected in partial-success responses.
    """

    def __init__(
        self,
        endpoint: str,
        protocol: Protocol = "grpc",
        headers: Mapping[str, str] | None = None,
        compression: Literal["gzip"] | None = None,
        timeout_s: float = 10.0,
        insecure: bool | None = None,
        certificate_file: str | None = None,
        client_key_file: str | None = None,
        client_certificate_file: str | None = None,
        traces_endpoint_is_full: bool = False,
        signal: Signal = "traces",
    ) -> None:
        if protocol not in ("grpc", "http/protobuf"):
            raise ValueError(f"protocol must be 'grpc' or 'http/protobuf', not {protocol!r}")
        if compression not in (None, "gzip"):
            raise ValueError(f"compression must be 'gzip' or None, not {compression!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if (client_key_file is None) != (client_certificate_file is None):
            raise ValueError("client_key_file and client_certificate_file go together")
        self.protocol: Protocol = protocol
        self.headers = dict(headers or {})
        self.compression = compression
        self.timeout_s = float(timeout_s)
        self.rejected_spans = 0
        #: A request was written whole and its answer has not come yet (the ledger calls
        #: spans whose request is cut off then "unconfirmed", not lost).
        self.awaiting = False
        self.signal: Signal = signal
        self._tls = _TlsFiles(certificate_file, client_key_file, client_certificate_file)
        self._lock = threading.Lock()
        self._backend: _GrpcBackend | _HttpBackend
        if protocol == "grpc":
            target, secure = _grpc_target(endpoint, insecure)
            self._backend = _GrpcBackend(self, target, secure)
            self.url = f"{'https' if secure else 'http'}://{target}"
        else:
            self._backend = _HttpBackend(self, endpoint, traces_endpoint_is_full)
            self.url = self._backend.url

    def send(self, request: bytes) -> None:
        """Deliver one serialised ``ExportTraceServiceRequest``; raise `ExportError` if not."""
        with self._lock:
            response = self._backend.send(request)
        if response and self.signal == "traces":
            self._note_partial_success(response)

    def sent_unanswered(self) -> bool:
        """From another thread: a request has left whole and its answer has not come (what
        a deadline cuts off now is "unconfirmed"). HTTP: written whole; gRPC: a call under
        way on a ready connection."""
        if self.awaiting:
            return True
        backend = self._backend
        return isinstance(backend, _GrpcBackend) and backend.sent_unanswered()

    def close(self) -> None:
        """Close the channel or connection; a later `send` opens a new one."""
        with self._lock:
            self._backend.close()

    def abort(self) -> None:
        """From another thread: break the connection a `send` may be blocked on (it then
        fails at once). Takes no lock: the blocked `send` holds it."""
        try:
            self._backend.abort()
        except Exception:
            pass

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's channel or connection without touching it."""
        self._lock = threading.Lock()
        self._backend.forget()

    def __repr__(self) -> str:
        return f"OtlpTransport({self.url!r}, protocol={self.protocol!r})"

    def _note_partial_success(self, response: bytes) -> None:
        try:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTraceServiceResponse,
            )
        except ImportError:  # the `otlp` extra is not installed: delivered is all we know
            return

        parsed = ExportTraceServiceResponse()
        try:
            parsed.ParseFromString(response)
        except Exception:  # a 200 with an odd body still means "delivered"
            return
        rejected = parsed.partial_success.rejected_spans
        if rejected:
            self.rejected_spans += rejected
            _log.warning(
                "otel_rl: %s rejected %d span(s): %s",
                self.url,
                rejected,
                parsed.partial_success.error_message or "no reason given",
            )


class _TlsFiles:
    __slots__ = ("ca", "cert", "key")

    def __init__(self, ca: str | None, key: str | None, cert: str | None) -> None:
        self.ca, self.key, self.cert = ca, key, cert

    def read(self, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise ExportError(False, f"cannot read {path}: {exc.strerror or exc}") from None


def _grpc_target(endpoint: str, insecure: bool | None) -> tuple[str, bool]:
    """``(host:port, use TLS)`` for a gRPC endpoint, by the specification's scheme rules."""
    if "://" in endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"gRPC endpoint scheme must be http or https: {endpoint!r}")
        if not parts.hostname:
            raise ValueError(f"gRPC endpoint has no host: {endpoint!r}")
        return parts.netloc, parts.scheme == "https"
    if not endpoint or "/" in endpoint:
        raise ValueError(f"gRPC endpoint must be host:port or a URL: {endpoint!r}")
    return endpoint, not insecure


class _GrpcBackend:
    def __init__(self, owner: OtlpTransport, target: str, secure: bool) -> None:
        self._owner = owner
        self._target = target
        self._secure = secure
        self._channel: Any = None
        self._call: Any = None
        self._metadata = tuple((key.lower(), value) for key, value in owner.headers.items())
        #: A call is under way (see `sent_unanswered`).
        self._in_call = False

    def _connect(self) -> Any:
        try:
            import grpc
        except ImportError:
            raise ExportError(
                False, "OTLP over gRPC needs grpcio: pip install 'otel-rl[otlp]'"
            ) from None

        # A channel of its own connections: the global subchannel pool would hand a forked
        # child the parent's connection ("Wrong file descriptor generation").
        options = [("grpc.primary_user_agent", _USER_AGENT), ("grpc.use_local_subchannel_pool", 1)]
        if self._secure:
            tls = self._owner._tls
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.read(tls.ca),
                private_key=tls.read(tls.key),
                certificate_chain=tls.read(tls.cert),
            )
            self._channel = grpc.secure_channel(self._target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(self._target, options=options)
        # No serialisers: bytes go out and come back as they are.
        self._call = self._channel.unary_unary(_GRPC_METHODS[self._owner.signal])
        return self._call

    def send(self, request: bytes) -> bytes:
        import grpc

        call = self._call or self._connect()
        compression = grpc.Compression.Gzip if self._owner.compression else None
        self._in_call = True
        try:
            response: bytes = call(
                request,
                timeout=self._owner.timeout_s,
                metadata=self._metadata,
                compression=compression,
            )
        except grpc.RpcError as err:
            error = _grpc_error(err, self._owner.url, len(request))
            if error.kind == "timed out" and self.ready():
                # The deadline passed on a ready connection: the request left at once and
                # the collector may have it ("unconfirmed"). One still waiting for a
                # connection never left: lost ("timed out").
                error.kind = "unconfirmed"
                error.message = (f"{self._owner.url}: sent, no answer within "
                                 f"{self._owner.timeout_s:g} s")
            raise error from None
        finally:
            self._in_call = False
        return response

    def ready(self) -> bool:
        """The channel is connected now (its core state, read without a watcher thread)."""
        channel = self._channel
        try:
            return channel is not None and channel._channel.check_connectivity_state(False) == 2
        except Exception:  # another grpcio's internals: nothing known, nothing claimed
            return False

    def sent_unanswered(self) -> bool:
        """From another thread: a call is under way on a ready connection (it left)."""
        return self._in_call and self.ready()

    def close(self) -> None:
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            channel.close()

    def forget(self) -> None:
        self._channel = self._call = None

    def abort(self) -> None:
        channel = self._channel
        if channel is not None:
            channel.close()  # cancels the calls in flight


def _grpc_error(err: Any, url: str, size: int) -> ExportError:
    import grpc

    code = err.code()
    details = (err.details() or "").splitlines()[0] if err.details() else ""
    retry_after = _grpc_retry_delay(err)
    too_large = code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details
    # OTLP/gRPC: these codes are transient; RESOURCE_EXHAUSTED only when the server says when
    # to come back (RetryInfo).
    retryable = code in (
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    ) or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after is not None)
    kind = ("unreachable" if code == grpc.StatusCode.UNAVAILABLE
            else "timed out" if code == grpc.StatusCode.DEADLINE_EXCEEDED else "rejected")
    message = f"{url}: gRPC {code.name}: {details or 'no details'}"
    if url.startswith("https://") and "handshake" in details.lower():
        message += " (TLS was used; for a plaintext collector use an http:// endpoint or insecure)"
    if too_large:
        message += f" (request is {size} bytes; raise the receiver's max_recv_msg_size_mib or send smaller batches)"
    return ExportError(retryable, message, retry_after_s=retry_after, too_large=too_large,
                       kind=kind)


def _grpc_retry_delay(err: Any) -> float | None:
    try:
        from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        trailers = err.trailing_metadata() or ()
        for key, value in trailers:
            if key == "grpc-status-details-bin":
                status = status_pb2.Status.FromString(value)
                for detail in status.details:
                    if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                        info = error_details_pb2.RetryInfo()
                        detail.Unpack(info)
                        delay = info.retry_delay
                        return float(delay.seconds + delay.nanos / 1e9)
    except Exception:  # malformed details: no delay, not a failure of its own
        return None
    return None


class _StaleConnection(Exception):
    """The server closed the connection before answering."""


class _HttpBackend:
    def __init__(self, owner: OtlpTransport, endpoint: str, full: bool) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"OTLP/HTTP endpoint must be an http:// or https:// URL: {endpoint!r}")
        path = parts.path
        if not full:
            path = path.rstrip("/") + f"/v1/{owner.signal}"
        path = path or "/"
        if parts.query:
            path += "?" + parts.query
        self._owner = owner
        self._secure = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = path
        self.url = f"{parts.scheme}://{parts.netloc}{path}"
        self._conn: http.client.HTTPConnection | None = None
        #: `abort` broke the connection of the send under way: no fresh try of it.
        self._aborted = False
        self._headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": _USER_AGENT,
            **owner.headers,
        }
        if owner.compression:
            self._headers["Content-Encoding"] = "gzip"

    def _connect(self) -> http.client.HTTPConnection:
        timeout = self._owner.timeout_s
        if self._secure:
            tls = self._owner._tls
            try:
                context = ssl.create_default_context(cafile=tls.ca)
                if tls.cert is not None:
                    context.load_cert_chain(tls.cert, tls.key)
            except (OSError, ssl.SSLError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                files = ", ".join(f for f in (tls.ca, tls.cert, tls.key) if f)
                raise ExportError(False, f"{self.url}: cannot load {files}: {reason}") from None
            self._conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=context
            )
        else:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def send(self, request: bytes) -> bytes:
        body = (
            gzip.compress(request, compresslevel=6, mtime=0) if self._owner.compression else request
        )
        self._aborted = False
        while True:
            fresh = self._conn is None
            try:
                status, reason, headers, data = self._post(body)
                break
            except _StaleConnection:
                self.close()
                if fresh or self._aborted:  # (aborted: not again, the collector may have it)
                    raise ExportError(
                        True, f"{self.url}: connection closed by the server",
                        kind="unreachable") from None
                # Else a kept-alive connection the server has since closed: one fresh try.
        if 200 <= status < 300:
            return data
        raise _http_error(self.url, status, reason, headers, data, len(body))

    def _post(self, body: bytes) -> tuple[int, str, http.client.HTTPMessage, bytes]:
        conn = self._conn or self._connect()
        # The caller's timeout (shortened near shutdown's deadline) on a kept-alive
        # connection too, not only on a fresh one.
        conn.timeout = self._owner.timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(self._owner.timeout_s)
        written = False
        try:
            conn.request("POST", self._path, body=body, headers=self._headers)
            written = self._owner.awaiting = True
            response = conn.getresponse()
            data = response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            raise _StaleConnection from None
        except TimeoutError:
            self.close()
            if written:  # the collector may well have it: neither delivered nor lost
                raise ExportError(
                    True, f"{self.url}: sent, no answer within {self._owner.timeout_s:g} s",
                    kind="unconfirmed") from None
            raise ExportError(
                True, f"{self.url}: timed out after {self._owner.timeout_s:g} s",
                kind="timed out") from None
        except ssl.SSLError as exc:
            self.close()
            raise ExportError(False, f"{self.url}: TLS error: {_tls_reason(exc)}") from None
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            kind = "unreachable" if isinstance(exc, OSError) else "rejected"
            raise ExportError(True, f"{self.url}: {reason or type(exc).__name__}",
                              kind=kind) from None
        finally:
            self._owner.awaiting = False
        if response.will_close:
            self.close()
        return response.status, response.reason, response.headers, data

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def forget(self) -> None:
        # The child's copy of the socket: closing it sends nothing (no TLS close_notify, no
        # shutdown), and leaves no open socket to the garbage collector's ResourceWarning.
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def abort(self) -> None:
        self._aborted = True
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)


#: OpenSSL's verify errors that only its strict RFC 5280 profile reports (X509_V_FLAG_X509_STRICT,
#: which Python 3.13's default context sets as ``ssl.VERIFY_X509_STRICT``): 79
#: X509_V_ERR_INVALID_CA to 94 X509_V_ERR_EC_KEY_EXPLICIT_PARAMS. Private CAs made with bare
#: ``openssl req -x509`` lack keyUsage (92) and pass on Python <= 3.12 only.
_STRICT_PROFILE_ERRORS = range(79, 95)


def _tls_reason(exc: ssl.SSLError) -> str:
    """What went wrong in a TLS handshake, in one line: for a certificate that does not
    verify, OpenSSL's reason, and whether only the strict checks refused it."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        reason = f"certificate verify failed: {exc.verify_message}"
        if exc.verify_code in _STRICT_PROFILE_ERRORS:
            reason += (" (refused by strict X.509 checks, the default since Python 3.13:"
                       " see README, TLS)")
        return reason
    return str(exc.reason or exc)


def _http_error(
    url: str, status: int, reason: str, headers: http.client.HTTPMessage, data: bytes, size: int
) -> ExportError:
    detail = _http_error_detail(headers, data)
    message = f"{url}: HTTP {status} {reason}".rstrip() + (f": {detail}" if detail else "")
    too_large = status == 413
    if too_large:
        message += f" (request is {size} bytes; send smaller batches)"
    if 300 <= status < 400 and headers.get("Location"):
        message += f" (redirects to {headers['Location']}; use that endpoint)"
    return ExportError(
        status in _RETRYABLE_HTTP,
        message,
        retry_after_s=_retry_after(headers.get("Retry-After")),
        too_large=too_large,
    )


def _http_error_detail(headers: http.client.HTTPMessage, data: bytes) -> str:
    if not data:
        return ""
    if "protobuf" in (headers.get("Content-Type") or ""):
        try:
            from google.rpc import status_pb2  # type: ignore[import-untyped]

            return str(status_pb2.Status.FromString(data).message).strip()
        except Exception:  # not a Status after all: fall back to the text
            pass
    text = data[:300].decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else ""


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
