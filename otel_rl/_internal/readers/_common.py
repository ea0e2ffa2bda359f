"""What the HTTP readers share: trace-id checks, one GET with a timeout, notes on results."""

from __future__ import annotations

import math
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from otel_rl._internal.errors import UnavailableError, UsageError, UserError, one_line, shown
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

    Unreachable -> `UnavailableError`; a 200 answer that is not JSON (or over the limits) ->
    `UserError`.
    """
    limit = DEFAULT_LIMITS.max_document_bytes
    try:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=check_timeout(timeout)) as response:
            status, body = response.status, response.read(limit + 1)
    except urllib.error.HTTPError as exc:
        try:
            status, body = exc.code, exc.read(64 * 1024)
        except OSError:
            status, body = exc.code, b""
    except urllib.error.URLError as exc:
        raise UnavailableError(
            f"cannot reach {backend} at {base_url}: {_reason(exc.reason)}"
        ) from None
    except TimeoutError:
        raise UnavailableError(
            f"cannot reach {backend} at {base_url}: no answer within {timeout:g} s"
        ) from None
    except (OSError, ValueError) as exc:  # bad URL, connection reset mid-answer
        raise UnavailableError(f"cannot reach {backend} at {base_url}: {_reason(exc)}") from None
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
    text = one_line(getattr(reason, "strerror", None) or reason)
    return text or type(reason).__name__


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
