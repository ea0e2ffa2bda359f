"""Errors that carry a message meant for a person, not a traceback, and the CLI's exit codes.

Every ``otel-rl`` command exits with one of these codes (README, "Exit codes"):

====  =================================================================================
0     done
1     ``otel-rl diff`` only: a block got slower beyond the thresholds (the CI gate)
2     usage: an unknown command or option, a bad option value
3     partial: the result was written but covers only part of the input (a tree built
      from a partial span set, a replay that stopped part-way)
4     bad input: a file or a server's answer that cannot be read or is not valid (missing,
      a directory or FIFO, malformed, over a size/depth/number limit)
5     unavailable: a backend that cannot be reached, an output that cannot be written, a
      run that failed
130   interrupted (Ctrl-C)
====  =================================================================================
"""

from __future__ import annotations

import reprlib

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_BAD_INPUT = 4
EXIT_UNAVAILABLE = 5
EXIT_INTERRUPTED = 130

#: The longest error line a command prints (longer messages are cut with an ellipsis).
MAX_MESSAGE_CHARS = 200


class UserError(Exception):
    """Bad user input (a file, a server's answer); the base of every error meant for a person.

    The CLI prints ``otel-rl <command>: <message>`` on one line and exits with `exit_code`.
    """

    exit_code = EXIT_BAD_INPUT


class UsageError(UserError):
    """A bad command line: an unknown command, a missing or invalid option."""

    exit_code = EXIT_USAGE


class IncompleteResultError(UserError):
    """The input was read only in part; the result would be presented as complete."""

    exit_code = EXIT_PARTIAL


class UnavailableError(UserError):
    """Something outside the input failed: an unreachable backend, an unwritable output."""

    exit_code = EXIT_UNAVAILABLE


def one_line(text: object) -> str:
    """`text` (an exception, a server's message) with its white space folded onto one line."""
    return " ".join(str(text).split())


def shorten(text: str, width: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to at most `width` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def shown(value: object, width: int = 40) -> str:
    """`value` quoted for an error message, cut to about `width` characters (input can be huge)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # str() refuses more than 4,300 digits; the count is all a reader needs anyway.
        return f"a number of {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, str):
        return shorten(repr(value[: width + 2]), width)
    # reprlib stops at a few levels and items: a value from a file can be nested 10,000 deep.
    return shorten(one_line(_REPR.repr(value)), width)


def _make_repr() -> reprlib.Repr:
    limits = reprlib.Repr()
    limits.maxlevel = 3
    limits.maxstring = limits.maxother = limits.maxlong = 40
    limits.maxlist = limits.maxdict = limits.maxtuple = 4
    return limits


_REPR = _make_repr()
