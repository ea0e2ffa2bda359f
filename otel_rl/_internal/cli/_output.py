"""Writing a command's output file: whole or not at all.

The text is written by `atomic.write_text` (a temporary file beside the target, renamed over
it), so nobody (a browser, a CI step) ever opens half a report, and a command that fails leaves
no output and does not disturb an older one. Only regular files are replaced: ``-o /dev/null`` or a FIFO is
refused rather than swapped for a file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from otel_rl._internal import atomic
from otel_rl._internal.errors import UnavailableError, UsageError, one_line
from otel_rl._internal.readers.boundary import describe_path

__all__ = ["check_output_path", "write_output", "write_output_stream"]


def check_output_path(path: str | Path, option: str) -> Path:
    """`path` if a file could be written there; checked before the work, so a typo in ``-o``
    fails in a second rather than after the input was read."""
    target = Path(path)
    shown = describe_path(path)
    if not str(path).strip():
        raise UsageError(f"{option} must name a file")
    if str(path).endswith(("/", os.sep)):
        raise UsageError(f"{option} {shown}: names a folder; name a file to write")
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise UnavailableError(f"cannot write {shown} ({one_line(exc.strerror or exc)})") from None
    except ValueError:  # a NUL in the path
        raise UsageError(f"{option} {shown}: not a valid file name") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise UsageError(f"{option} {shown}: is {kind}; name a file to write")
    parent = target.parent
    if not parent.is_dir():
        raise UnavailableError(f"cannot write {shown}: its folder does not exist")
    return target


def write_output(path: str | Path, text: str, option: str = "--output") -> None:
    """Write `text` (UTF-8) to `path` atomically; a one-line error says why it could not be."""
    target = check_output_path(path, option)
    try:
        atomic.write_text(target, text)
    except OSError as exc:
        raise UnavailableError(
            f"cannot write {describe_path(path)} ({one_line(exc.strerror or exc)})"
        ) from None


def write_output_stream(path: str | Path, chunks: Iterable[str], option: str = "--output") -> None:
    """Write text `chunks` (UTF-8) to `path` as they come, atomically (see `write_output`):
    for outputs made while their input is streamed. An error raised while making the chunks
    (bad input) leaves no file and propagates."""
    target = check_output_path(path, option)
    try:
        atomic.write_chunks(target, (c.encode("utf-8", "backslashreplace") for c in chunks))
    except OSError as exc:
        raise UnavailableError(
            f"cannot write {describe_path(path)} ({one_line(exc.strerror or exc)})"
        ) from None
