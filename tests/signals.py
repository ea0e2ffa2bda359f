"""Child processes that take signals as a terminal's would, however pytest was launched.

A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored across
fork and exec (Python then installs no KeyboardInterrupt handler). Tests that send SIGINT to a
child start it through `default_signals` so that they do not depend on how they were launched.
"""

from __future__ import annotations

import signal


def default_signals() -> None:
    """`preexec_fn` for subprocess: SIGINT back to its default disposition in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
