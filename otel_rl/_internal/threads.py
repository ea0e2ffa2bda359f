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
    """Start a daemon thread named `name` running `target` with termination signals blocked."""

    def run() -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION_SIGNALS)
        except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
            pass
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
