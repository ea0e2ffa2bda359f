"""The input boundary: every byte a command reads from a user's file or a server passes here.

One place decides what input is acceptable, so every reader (timers.json, spans files, Jaeger
and Tempo answers, ``replay``/``import`` inputs) refuses the same things with the same kind of
message — one line naming the file and what is wrong, raised as `UserError` (exit status 4):

- **Files**: only regular files are read. A FIFO, device, socket or directory is refused up
  front (opened non-blocking, then checked with ``fstat``, so a FIFO never blocks).
- **Size**: at most `Limits.max_file_bytes` of (decompressed) input, at most
  `Limits.max_document_bytes` per JSON document or line; gzip is read through a bounded
  window, so a small bomb cannot fill memory.
- **JSON**: strict — no ``NaN``/``Infinity`` (not JSON), integers of at most
  `Limits.max_number_chars` digits (Python refuses more than 4,300 with a traceback), finite
  floats. At most `Limits.max_depth` levels of nesting, whatever the interpreter: nesting
  deeper than the C parser's recursion allows (about 1,000 levels on Python 3.10/3.11, 1,500 on
  3.12, 10,000 on 3.13) is parsed by an iterative parser, and a document the C parser took is
  measured when it could be deeper than the limit, so a valid deep timers.json works and a
  hostile one gets a clear line instead of a `RecursionError`.
- **Text**: UTF-8 (a BOM is allowed). Lone surrogates, which JSON can spell (``"\\ud800"``) but
  nothing can encode, become U+FFFD; other control characters stay and are escaped where shown.

A streaming reader uses the pieces per line: `open_input` + `iter_lines` + `parse_json`.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from otel_rl._internal.errors import UserError, one_line

# The JSON half of the boundary lives beside the tree model (which parses timers.json text
# with it); readers take it from here, with the file half.
from otel_rl._internal.strictjson import (
    DEFAULT_LIMITS,
    JSONInputError,
    Limits,
    clean_text,
    decode_text,
    parse_json,
    parse_json_values,
)
from otel_rl._internal.strictjson import describe_size as _size

__all__ = [
    "DEFAULT_LIMITS",
    "JSONInputError",
    "Limits",
    "clean_text",
    "decode_text",
    "describe_path",
    "iter_lines",
    "open_input",
    "parse_json",
    "parse_json_values",
    "read_input",
    "read_stream",
]

_GZIP_MAGIC = b"\x1f\x8b"


#: Largest value of an OTLP ``fixed64`` time (nanoseconds since the epoch).
MAX_TIME_NS = 2**64 - 1


# -- files -------------------------------------------------------------------------------


def describe_path(path: str | Path, width: int = 100) -> str:
    """`path` for a message: printable, and its tail kept when it is long."""
    text = str(path)
    if not text.isprintable():
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_input(path: str | Path, what: str, limits: Limits = DEFAULT_LIMITS) -> IO[bytes]:
    """`path` opened for reading in binary, if it is a regular file within the size limit.

    `what` names what the file should be (``"a spans file"``) for the messages. The file is
    opened non-blocking and checked with ``fstat`` before a byte is read, so a FIFO or a
    device is refused instead of waited on.
    """
    shown = describe_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{shown}: no such file") from None
    except PermissionError:
        raise UserError(f"{shown}: permission denied") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc)
        raise UserError(f"{shown}: cannot open ({reason})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{shown}: is {_kind_of(info.st_mode)}, not {what}")
        if info.st_size > limits.max_file_bytes:
            raise UserError(
                f"{shown}: {_size(info.st_size)} is more than the {_size(limits.max_file_bytes)} "
                "a file may have"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | Path, what: str, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The whole content of `path`, gunzipped if it is gzip, within `limits`."""
    with open_input(path, what, limits) as handle:
        try:
            raw = handle.read(limits.max_file_bytes + 1)
        except OSError as exc:
            raise UserError(f"{describe_path(path)}: cannot read ({one_line(exc)})") from None
    return gunzip_if_needed(raw, describe_path(path), limits)


def read_stream(stream: IO[bytes], source: str, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """All of `stream` (stdin), gunzipped if needed, within `limits`."""
    try:
        raw = stream.read(limits.max_file_bytes + 1)
    except OSError as exc:
        raise UserError(f"{source}: cannot read ({one_line(exc)})") from None
    return gunzip_if_needed(raw, source, limits)


def gunzip_if_needed(raw: bytes, source: str, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """`raw`, decompressed when it starts with gzip's magic number; bounded by `limits`."""
    if len(raw) > limits.max_file_bytes:
        raise UserError(f"{source}: more than the {_size(limits.max_file_bytes)} a file may have")
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unzipped:
            data = unzipped.read(limits.max_file_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{source}: broken gzip file ({one_line(exc)})") from None
    if len(data) > limits.max_file_bytes:
        raise UserError(
            f"{source}: decompresses to more than the {_size(limits.max_file_bytes)} "
            "a file may have"
        )
    return data


def iter_lines(
    stream: IO[bytes], source: str, limits: Limits = DEFAULT_LIMITS
) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` for each line of `stream` that is not blank, newline kept; a
    line longer than `Limits.max_document_bytes` is refused. Only ``\\n`` ends a line (JSON
    text may hold U+2028 and other characters that `str.splitlines` would split on). Blank
    lines carry nothing and are dropped here, cheaply: a file of 30 million empty lines took
    the streamed readers over 30 s when each was handed on."""
    total = 0
    number = 0
    while True:
        try:
            line = stream.readline(limits.max_document_bytes + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"{source} line {number + 1}: cannot read ({one_line(exc)})") from None
        if not line:
            return
        number += 1
        if len(line) > limits.max_document_bytes and not line.endswith(b"\n"):
            raise UserError(
                f"{source} line {number}: longer than the {_size(limits.max_document_bytes)} "
                "a line may have"
            )
        total += len(line)
        if total > limits.max_file_bytes:
            raise UserError(f"{source}: more than the {_size(limits.max_file_bytes)} a file may have")
        if line.isspace():
            continue
        yield number, line
