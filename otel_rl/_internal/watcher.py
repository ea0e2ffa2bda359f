"""``count_if_killed``: a small process that outlives the main process and counts what it had
not exported if it is killed without warning (issue 16).

``otel-rl run``'s launcher outlives the program and reads the killed main process's tally
and mirrored ledger (`mainledger`). A program that calls ``configure()`` itself has no such
survivor; with ``count_if_killed`` the main process starts one: ``python -m
otel_rl._internal.watcher PID START RUN_ID [FOLDER]``, in a session of its own (a signal to
the program's process group does not reach it), with no otel_rl settings of its own. It
waits for the process to end (a pidfd where Linux has one, else a poll every 0.2 s), then
runs `mainledger.after_main`: after a normal shutdown the files are gone and it says
nothing; otherwise one line on its stderr (the program's) and in the run's timers.json.

The exit status of a process that is not one's child cannot be read, so the line says the
process "ended without its shutdown" (killed by a signal, the OOM killer, ``os._exit``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

__all__ = ["main", "start"]

#: The pid a watcher was started for (one per process, across reconfigurations).
_started: list[int] = []


def _start_time(pid: int) -> str | None:
    """Process `pid`'s start time (clock ticks since boot): tells it from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def start(run_id: str, output_dir: str | None) -> bool:
    """In the main process: start its watcher (once); False if it could not be started."""
    pid = os.getpid()
    if pid in _started:
        return True
    started = _start_time(pid)
    if started is None:
        return False  # (no /proc: the watcher could not tell this process from a reused pid)
    # The folder otel_rl is imported from, first: the watcher runs this same copy.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_RL_", "TRACEPARENT", "TRACESTATE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        subprocess.Popen(
            [sys.executable, "-m", "otel_rl._internal.watcher", str(pid), started, run_id,
             output_dir or ""],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, close_fds=True,
            start_new_session=True)
    except (OSError, ValueError, subprocess.SubprocessError):
        return False
    _started.append(pid)
    return True


def _wait(pid: int, started: str) -> None:
    """Until process `pid` (started at `started`) has ended."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        pass  # (no pidfd: Linux before 5.3, or not Linux)
    if _start_time(pid) != started:  # already gone, its pid used again
        if fd is not None:
            os.close(fd)
        return
    if fd is not None:
        import select

        try:
            select.select([fd], [], [])  # readable once it has ended
        finally:
            os.close(fd)
        return
    from otel_rl._internal.mainledger import alive

    while alive(pid) and _start_time(pid) == started:
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[0].isdigit():
        print("usage: python -m otel_rl._internal.watcher PID START RUN_ID [FOLDER]",
              file=sys.stderr)
        return 2
    pid, started, run_id = int(argv[0]), argv[1], argv[2]
    folder = argv[3] if len(argv) > 3 and argv[3] else None
    _wait(pid, started)
    from otel_rl._internal import mainledger

    note = mainledger.after_main(pid, run_id, 0, folder)
    if note:
        print(f"otel-rl: {note}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
