"""The one way otel_rl writes a file: whole or not at all.

The text goes to a temporary file beside the target, which is then renamed over it: nobody (a
browser, a CI step, `otel-rl report` reading a live run's timers.json) ever opens half a file,
and a write that fails leaves no output and does not disturb an older one. Used by the runtime
(timers.json) and by every command that writes a file.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable

__all__ = ["write_bytes", "write_chunks", "write_text"]

_names = itertools.count()


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically; raises OSError (nothing written) on failure.

    The file gets the mode a plain ``open(path, "w")`` would (0o666 less the umask).
    """
    write_bytes(path, text.encode("utf-8", "backslashreplace"))


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically (see `write_text`)."""
    write_chunks(path, (data,))


def write_chunks(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write the `chunks` to `path` as they come, atomically: an output of any size in
    bounded memory, renamed into place only once the last chunk is written (an exception
    from the iterable leaves nothing and is re-raised)."""
    target = os.fspath(path)
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{next(_names)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
