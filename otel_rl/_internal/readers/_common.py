"""What the HTTP readers share: trace-id checks, one GET with a timeout, notes on results."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from otel_rl._internal.errors import UserError, one_line
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
        raise UserError(f"bad trace ID {trace_id!r} (expected up to 32 hex characters)")
    text = text.rjust(32, "0")
    if text == "0" * 32:
        raise UserError("bad trace ID: all zeros")
    return text


def http_get_json(url: str, backend: str, base_url: str, timeout: float) -> tuple[int, Any]:
    """GET `url`; return (HTTP status, parsed JSON or None). Unreachable -> `UserError`."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except urllib.error.URLError as exc:
        raise UserError(f"cannot reach {backend} at {base_url}: {_reason(exc.reason)}") from None
    except TimeoutError:
        raise UserError(
            f"cannot reach {backend} at {base_url}: no answer within {timeout:g} s"
        ) from None
    except (OSError, ValueError) as exc:  # bad URL, connection reset mid-answer
        raise UserError(f"cannot reach {backend} at {base_url}: {_reason(exc)}") from None
    try:
        return status, json.loads(body) if body.strip() else None
    except ValueError:
        if status != 200:
            return status, None
        raise UserError(f"{backend} at {base_url} answered with invalid JSON ({url})") from None


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
    """The bytes of a file the user named, or a one-line `UserError` saying why not;
    `what` names what the file should have been ("a spans file")."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not {what}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({one_line(exc)})") from None
