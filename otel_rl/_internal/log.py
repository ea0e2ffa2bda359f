"""Warnings from otel_rl, with `logging` imported only when something is said.

Worker processes import otel_rl at start-up; keeping `logging` out of that path saves ~5 ms
per worker.
"""

from __future__ import annotations


def warning(message: str, *args: object) -> None:
    import logging

    logging.getLogger("otel_rl").warning(message, *args)


def info(message: str, *args: object) -> None:
    import logging

    logging.getLogger("otel_rl").info(message, *args)
