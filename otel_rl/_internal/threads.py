"""otel_rl's background threads, which never take the process's termination signals.

A process-directed signal (``Pool.terminate()``'s SIGTERM, Ctrl-C's SIGINT) goes to any thread
that does not block it. Python runs handlers in the main thread only, so when the kernel picks a
background thread while the main thread sits in a blocking C call (a pool worker waiting on its
task queue's lock), the handler never runs and the process never exits. Blocking those signals
in every thread otel_rl starts leaves the main thread the only one that can take them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

#: Signals otel_rl's threads leave to the main thread.
TERMINATION_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def start_daemon(name: str, target: Callable[[], None]) -> threading.Thread:
    """Start a daemon thread named `name` running `target` with termination signals blocked.

    The signals are blocked in the starting thread around the start, so the new thread is
    born with them blocked (a thread inherits its creator's mask). Blocking them from inside
    the new thread came too late: a SIGTERM sent while the thread was being created (the
    creator blocks every signal in there) stayed pending, and the new thread, unblocking
    first, took it; its handler then waited for a main thread asleep on a queue lock
    (`Pool.terminate()` hung joining such a worker, about one run in twenty under load).
    """
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION_SIGNALS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
        previous = None
    try:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread
