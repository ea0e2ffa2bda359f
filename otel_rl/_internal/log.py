"""Warnings from otel_rl, with `logging` imported only when something is said.

Worker processes import otel_rl at start-up; keeping `logging` out of that path saves ~5 ms
per worker.
"""

from __future__ import annotations

from typing import Any


def warning(message: str, *args: Any) -> None:
    import logging

    logging.getLogger("otel_rl").warning(message, *args)


def info(message: str, *args: Any) -> None:
    import logging

    logging.getLogger("otel_rl").info(message, *args)
