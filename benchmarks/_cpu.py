"""The CPU of a whole process tree: every process a command starts, however it ends.

``RUSAGE_CHILDREN`` counts a process only once its parent has waited for it, and its parent's
parent for that one, up to the bench. A daemon whose parent ignores ``SIGCHLD`` (reaped by the
kernel, its usage added nowhere), a process handed to init, or one still running when the
command returns, are missing. Ray's raylet is such a parent: a local Ray run's workers, two
tasks of 2 CPU seconds each, showed 3.4 s in ``RUSAGE_CHILDREN`` and 9.3 s in a cgroup.

So the command runs in a cgroup of its own (the CPU controller's accounting, v1 ``cpuacct`` or
v2 ``cpu.stat``, which charges every process while it is in the group, exited or not, and
which children inherit); after the command's own process ends, the run's left-over processes
are waited for (killed after a timeout) before the group's total is read. Where no cgroup can
be made (not root, no writable hierarchy), ``RUSAGE_CHILDREN`` it is, and `TreeCpu.method`
says so.
"""

from __future__ import annotations

import itertools
import os
import resource
import signal
import subprocess
import time
from typing import Any

#: Seconds the run's left-over processes get to end after its main process did.
LEFTOVER_TIMEOUT = 60.0
_names = itertools.count()


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of the cgroup hierarchies."""
    found = []
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                    found.append((fields[1], fields[2], set(fields[3].split(","))))
    except OSError:
        pass
    return found


def _group_root() -> tuple[str, str] | None:
    """(folder a new group is made in, the file its CPU total is read from), or None."""
    mounts = _mounts()
    for point, kind, options in mounts:
        if kind == "cgroup" and "cpuacct" in options:
            return point, "cpuacct.usage"
    for point, kind, _ in mounts:
        if kind == "cgroup2" and os.path.exists(os.path.join(point, "cpu.stat")):
            return point, "cpu.stat"
    return None


def _usage_s(path: str) -> float:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith("cpuacct.usage"):
        return int(text) / 1e9
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError(f"{path}: no usage_usec")


def _members(group: str) -> list[int]:
    with open(os.path.join(group, "cgroup.procs"), encoding="utf-8") as f:
        return [int(pid) for pid in f.read().split()]


class TreeCpu:
    """Runs commands and measures each one's whole process tree (see the module)."""

    def __init__(self) -> None:
        self.root: tuple[str, str] | None = None
        found = _group_root()
        if found is not None:
            probe = os.path.join(found[0], f"otel-rl-bench-{os.getpid()}-probe")
            try:
                os.mkdir(probe)
                os.rmdir(probe)
                self.root = found
            except OSError:
                pass
        self.method = ("cgroup: every process of the run" if self.root is not None else
                       "RUSAGE_CHILDREN: processes nobody waited for are missing")

    def run(self, argv: list[str], **kwargs: Any
            ) -> tuple[subprocess.CompletedProcess[str], float, float]:
        """``subprocess.run(argv, **kwargs)``; with the CPU seconds of every process it started
        and the wall seconds until its own process ended."""
        if self.root is None:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            done = subprocess.run(argv, **kwargs)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return done, ((after.ru_utime - before.ru_utime)
                          + (after.ru_stime - before.ru_stime)), wall
        folder, usage = self.root
        group = os.path.join(folder, f"otel-rl-bench-{os.getpid()}-{next(_names)}")
        os.mkdir(group)
        procs = os.path.join(group, "cgroup.procs")

        def join_group() -> None:  # in the child, before it runs the command
            with open(procs, "w", encoding="ascii") as f:
                f.write(str(os.getpid()))

        try:
            start = time.perf_counter()
            done = subprocess.run(argv, preexec_fn=join_group, **kwargs)
            wall = time.perf_counter() - start
            self._wait_empty(group)
            return done, _usage_s(os.path.join(group, usage)), wall
        finally:
            self._wait_empty(group, timeout=0.0)
            os.rmdir(group)

    @staticmethod
    def _wait_empty(group: str, timeout: float = LEFTOVER_TIMEOUT) -> None:
        """Wait until no process is left in `group`; past `timeout`, kill what is."""
        deadline = time.monotonic() + timeout
        while members := _members(group):
            if time.monotonic() >= deadline:
                for pid in members:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)
