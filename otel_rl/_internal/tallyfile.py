"""A relaying worker's record count in a shared file, so its parent can count exactly what a
SIGKILL (or the OOM killer) took with it.

The worker maps a small file (``/dev/shm`` where there is one) and points `recorder.tally` at
it: the hot path stores each block's span id there (see `recorder.tally`), the kernel's page
cache keeps what was stored when the process dies without a word, and the parent reads the file
(`count`) when the worker's relay connection closes before its final report, then removes it.
A worker that ends normally has its parent remove it on its final report.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import MutableSequence
from typing import cast

from otel_rl._internal import recorder

__all__ = ["count", "remove", "remove_run", "share"]

_SIZE = 8 * recorder.TALLY_SLOTS
#: This process's mapping (kept open for the process's life).
_mapping: mmap.mmap | None = None


def _folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _prefix(run_id: str) -> str:
    return "otel-rl-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id) + "-"


def share(run_id: str) -> str | None:
    """Count in a shared file from now on; its path (None: it could not be made, and the
    parent falls back to the worker's last report)."""
    global _mapping
    import ctypes  # only in a relaying worker

    path = os.path.join(_folder(), f"{_prefix(run_id)}{os.getpid()}.tally")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            mapping = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    _mapping = mapping
    slots = (ctypes.c_uint64 * recorder.TALLY_SLOTS).from_buffer(mapping)
    recorder.use_tally(cast(MutableSequence[int], slots))
    return path


def count(path: str) -> int | None:
    """What the worker that shared `path` had recorded (None: no such file, or not one)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SIZE + 1)
    except OSError:
        return None
    if len(data) != _SIZE:
        return None
    return recorder.tallied_in(memoryview(data).cast("Q"))


def remove_run(run_id: str) -> None:
    """Every tally file of run `run_id` (the main process, at its end: workers that died
    before their first report, or exited without a word, leave theirs)."""
    prefix = _prefix(run_id)
    try:
        names = [name for name in os.listdir(_folder())
                 if name.startswith(prefix) and name.endswith(".tally")]
    except OSError:
        return
    for name in names:
        remove(os.path.join(_folder(), name))


def remove(path: str) -> None:
    """Only a tally file (the path comes from a worker's report)."""
    if os.path.basename(path).startswith("otel-rl-") and path.endswith(".tally"):
        try:
            os.unlink(path)
        except OSError:
            pass
