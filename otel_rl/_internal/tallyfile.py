"""A relaying worker's record count in a shared file, so its parent can count exactly what a
SIGKILL (or the OOM killer) took with it.

The worker maps a small file (``/dev/shm`` where there is one) and points `recorder.tally` at
it: the hot path stores each block's span id there (see `recorder.tally`), the kernel's page
cache keeps what was stored when the process dies without a word, and the parent reads the file
(`count`) when the worker's relay connection closes before its final report, then removes it.
A worker that ends normally has its parent remove it on its final report. The file starts
at `recorder.TALLY_SLOTS` slots and grows (`_grow`) when a process has more stacks (threads).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import MutableSequence
from typing import cast

from otel_rl._internal import recorder
from otel_rl._internal.config import run_file_name

__all__ = ["count", "folder", "prefix", "remove", "remove_run", "share", "sharing"]

_SIZE = 8 * recorder.TALLY_SLOTS
#: This process's mappings (kept open for the process's life: a thread may still store through
#: an older, smaller one; all map the same file, so its stores land in the grown one too).
_mappings: list[object] = []
#: The shared file this process counts in, its pid, and the tally in use.


class _Shared:
    """The shared file this process counts in, its pid, and the tally in use."""

    path: str | None = None
    owner = 0
    slots: MutableSequence[int] | None = None


_shared = _Shared()


def folder() -> str:
    """/dev/shm where it is writable (memory), else the temp dir (on disk: the page cache
    still keeps a killed process's stores); `share` fails if neither takes the file."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    try:
        return tempfile.gettempdir()
    except OSError:  # no usable temp dir either: making the file fails, and says so
        return "/dev/shm"


def prefix(run_id: str) -> str:
    """The start of every shared-file name of run `run_id`."""
    return f"otel-rl-{run_file_name(run_id)}-"


def _map(path: str, size: int, create: bool) -> MutableSequence[int]:
    import ctypes  # only in a process that counts in a shared file

    flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    slots = (ctypes.c_uint64 * (size // 8)).from_buffer(mapping)
    _mappings.extend((mapping, slots))
    return cast(MutableSequence[int], slots)


def share(run_id: str) -> str | None:
    """Count in a shared file from now on; its path (None: it could not be made, and the
    parent falls back to the worker's last report)."""

    path = os.path.join(folder(), f"{prefix(run_id)}{os.getpid()}.tally")
    try:
        # (as large as the tally in use: a process counting again after it grew)
        slots = _map(path, max(_SIZE, 8 * len(recorder.tally)), create=True)
    except (OSError, ValueError):
        return None
    _shared.path, _shared.owner, _shared.slots = path, os.getpid(), slots
    recorder.use_tally(slots, _grow)
    return path


def sharing() -> bool:
    """This process counts in a shared file now."""
    slots = _shared.slots
    return slots is not None and _shared.owner == os.getpid() and recorder.tally is slots


def _grow(slot: int) -> MutableSequence[int] | None:
    """More stacks than slots (over 4,094 threads): the same file, mapped twice as large;
    every stack keeps a slot of its own, so the count stays exact at any thread count."""
    path, slots = _shared.path, _shared.slots
    if path is None or slots is None or _shared.owner != os.getpid() or recorder.tally is not slots:
        return None  # a forked child, or counting elsewhere now
    size = 8 * len(slots)
    while size <= 8 * slot:
        size *= 2
    try:
        slots = _shared.slots = _map(path, size, create=False)
    except (OSError, ValueError):
        return None
    return slots


def count(path: str) -> int | None:
    """What the worker that shared `path` had recorded (None: no such file, or not one)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _SIZE or len(data) % 8:
        return None
    return recorder.tallied_in(memoryview(data).cast("Q"))


def run_files(run_id: str, *suffixes: str) -> list[str]:
    """The paths of run `run_id`'s files (tallies ``.tally``, the main ledger ``.ledger``)
    ending in one of `suffixes`."""
    where, start = folder(), prefix(run_id)
    try:
        return [os.path.join(where, name) for name in os.listdir(where)
                if name.startswith(start) and name.endswith(suffixes)]
    except OSError:
        return []


def pid_of(path: str, run_id: str) -> int | None:
    """The process id a file of `run_files` belongs to (None: not one of them)."""
    pid = os.path.splitext(os.path.basename(path))[0][len(prefix(run_id)):]
    return int(pid) if pid.isdigit() else None


def remove_run(run_id: str) -> None:
    """Every tally file of run `run_id` (the main process, at its end: workers that died
    before their first report, or exited without a word, leave theirs)."""
    for path in run_files(run_id, ".tally", ".ledger"):
        remove(path)


def remove(path: str) -> None:
    """Only a tally (or main ledger) file (the path comes from a worker's report)."""
    if os.path.basename(path).startswith("otel-rl-") and path.endswith((".tally", ".ledger")):
        try:
            os.unlink(path)
        except OSError:
            pass


_folder, _prefix = folder, prefix  # (the names the tests used)
