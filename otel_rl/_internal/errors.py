"""Errors that carry a message meant for a person, not a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad user input (a CLI argument, a file, an unreachable URL the user named).

    The CLI prints ``otel-rl: <message>`` on one line and exits non-zero.
    """

    exit_code = 2


class IncompleteResultError(UserError):
    """The input was read only in part; the result would be presented as complete."""

    exit_code = 3


def one_line(text: object) -> str:
    """`text` (an exception, a server's message) with its white space folded onto one line."""
    return " ".join(str(text).split())
