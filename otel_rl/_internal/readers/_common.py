"""What the HTTP readers share: trace-id checks, one GET with a timeout, notes on results."""

from __future__ import annotations

import http.client
import math
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from otel_rl._internal.errors import (
    UnavailableError,
    UsageError,
    UserError,
    one_line,
    shorten,
    shown,
)
from otel_rl._internal.readers.boundary import (
    DEFAULT_LIMITS,
    decode_text,
    describe_path,
    parse_json,
    read_input,
)
from otel_rl._internal.spandata import SpanData

#: What one GET may take before the backend counts as unreachable (seconds).
DEFAULT_TIMEOUT = 10.0


class SpanList(list[SpanData]):
    """A list of spans plus `notes` on why it may be incomplete (e.g. Tempo cut the trace).

    `build_tree` reads the notes and marks the tree incomplete.
    """

    def __init__(self, spans: list[SpanData] | None = None, notes: list[str] | None = None):
        super().__init__(spans or [])
        self.notes: list[str] = list(notes or [])


def normalize_trace_id(trace_id: str) -> str:
    """A trace id as 32 lowercase hex characters; Tempo's form without leading zeros is padded."""
    text = trace_id.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not text or len(text) > 32 or any(c not in "0123456789abcdef" for c in text):
        raise UsageError(f"bad trace ID {shown(trace_id)} (expected up to 32 hex characters)")
    text = text.rjust(32, "0")
    if text == "0" * 32:
        raise UsageError("bad trace ID: all zeros")
    return text


def check_base_url(url: str, option: str) -> str:
    """`url` (a backend's base URL given as `option`) without a trailing slash, if it is an
    http(s) URL with a host; otherwise a one-line `UsageError`."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018  # raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise UsageError(f"{option} {shown(url)}: not a valid URL ({one_line(exc)})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option} {shown(url)}: expected an http(s) URL, e.g. http://host:16686")
    if any(not char.isprintable() or char.isspace() for char in url.strip()):
        raise UsageError(f"{option} {shown(url)}: a URL cannot hold spaces or control characters")
    return url.strip().rstrip("/")


def check_timeout(timeout: float) -> float:
    """`timeout` if it is a positive, finite number of seconds; otherwise a `UsageError`."""
    if not (math.isfinite(timeout) and 0 < timeout <= 24 * 3600):
        raise UsageError(f"--timeout must be a positive number of seconds, not {timeout:g}")
    return timeout


def http_get_json(url: str, backend: str, base_url: str, timeout: float) -> tuple[int, Any]:
    """GET `url`; return (HTTP status, parsed JSON or None).

    The whole answer must arrive within `timeout` seconds (a server that trickles bytes does
    not keep the command waiting). Unreachable, too slow, cut short or not HTTP ->
    `UnavailableError`; a 200 answer that is not JSON (or over the limits) -> `UserError`.
    """
    limit = DEFAULT_LIMITS.max_document_bytes
    check_timeout(timeout)
    where = f"cannot reach {backend} at {base_url}"
    outcome: dict[str, Any] = {}
    worker = threading.Thread(
        target=_exchange, args=(url, timeout, limit, outcome), name="otel-rl-get", daemon=True
    )
    worker.start()
    worker.join(timeout + 1.0)
    if worker.is_alive():
        response = outcome.get("response")
        if response is not None:
            try:
                response.close()  # the worker's next read fails; it ends on its own
            except Exception:  # closing a half-read answer from another thread
                pass
        raise UnavailableError(f"{where}: no complete answer within {timeout:g} s")
    error = outcome.get("error")
    if isinstance(error, urllib.error.URLError):
        raise UnavailableError(f"{where}: {_reason(error.reason)}")
    if isinstance(error, TimeoutError):
        raise UnavailableError(f"{where}: no answer within {timeout:g} s")
    if isinstance(error, http.client.HTTPException):  # not HTTP, or cut short
        raise UnavailableError(f"{where}: broken HTTP answer ({_reason(error)})")
    if isinstance(error, (OSError, ValueError)):  # bad URL, connection reset mid-answer
        raise UnavailableError(f"{where}: {_reason(error)}")
    if error is not None:
        raise error
    status, body = outcome["status"], outcome["body"]
    source = f"{backend} answer from {url}"
    if len(body) > limit:
        raise UserError(f"{source}: larger than the {limit // 2**20} MiB an answer may have")
    if not body.strip():
        return status, None
    try:
        return status, parse_json(decode_text(body, source), source)
    except UserError:
        if status != 200:
            return status, None
        raise


def _exchange(url: str, timeout: float, limit: int, outcome: dict[str, Any]) -> None:
    """One GET (run in a worker thread): sets ``status`` and ``body`` in `outcome`, or
    ``error``. The body is read a chunk at a time, so closing ``response`` stops it."""
    try:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            response = urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            try:
                outcome["status"], outcome["body"] = exc.code, exc.read(64 * 1024)
            except (OSError, http.client.HTTPException):
                outcome["status"], outcome["body"] = exc.code, b""
            return
        outcome["response"] = response
        with response:
            chunks: list[bytes] = []
            size = 0
            while size <= limit:
                chunk = response.read1(min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            expected = response.headers.get("Content-Length", "")
            if expected.isdigit() and size < int(expected) and size <= limit:
                raise http.client.IncompleteRead(b"", int(expected) - size)
            outcome["status"], outcome["body"] = response.status, b"".join(chunks)
    except BaseException as exc:  # handed to the calling thread
        outcome["error"] = exc


def error_message(payload: Any) -> str:
    """The message in a backend's JSON error answer, or ""."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return one_line(error.get("message", ""))
        if isinstance(error, str):
            return one_line(error)
        if isinstance(payload.get("message"), str):
            return one_line(payload["message"])
    return ""


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, http.client.IncompleteRead):
        more = reason.expected
        return f"cut short, {more} more bytes were announced" if more else "cut short"
    text = shorten(one_line(getattr(reason, "strerror", None) or reason), 80)
    return f"{type(reason).__name__}: {text}" if isinstance(reason, http.client.HTTPException) \
        else text or type(reason).__name__


def read_user_file(path: str | Path, what: str) -> bytes:
    """The bytes of a file the user named (gunzipped if it is gzip), or a one-line `UserError`
    saying why not; `what` names what the file should have been ("a spans file"). See
    `boundary.read_input`."""
    return read_input(path, what)


__all__ = [
    "DEFAULT_TIMEOUT",
    "SpanList",
    "check_base_url",
    "check_timeout",
    "describe_path",
    "error_message",
    "http_get_json",
    "normalize_trace_id",
    "read_user_file",
]
