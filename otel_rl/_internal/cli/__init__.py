"""`otel-rl` command line. Each subcommand lives in its own module with a `register` function.

Importing this package imports no subcommand: `otel-rl tree` never pays for the demo's numpy.

Every failure ends as one line on stderr, ``otel-rl <command>: <what is wrong>`` (at most
`MAX_MESSAGE_CHARS` characters), and an exit code from `otel_rl._internal.errors` — never a
traceback. An error nobody planned for (a bug) is reported the same way, with exit code 70;
``OTEL_RL_DEBUG=1`` shows its traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from otel_rl._internal.errors import (
    EXIT_INTERRUPTED,
    MAX_MESSAGE_CHARS,
    UnavailableError,
    UsageError,
    UserError,
    one_line,
    shorten,
    shown,
)

#: Exit code for an error nobody planned for (BSD's EX_SOFTWARE): a bug to report.
EXIT_INTERNAL = 70

#: name -> (module, one-line help). Each module defines `register(parser)` adding its arguments
#: and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("otel_rl._internal.cli.demo", "run a small RL training that exercises everything"),
    "run": ("otel_rl._internal.cli.run", "run a Python program with its timers served by otel_rl"),
    "report": ("otel_rl._internal.cli.report", "print or write reports from timers.json or spans"),
    "tree": ("otel_rl._internal.cli.tree", "rebuild timers.json from spans (file, Jaeger, Tempo)"),
    "import": ("otel_rl._internal.cli.import_", "turn an ML-Agents timers.json into a trace"),
    "replay": ("otel_rl._internal.cli.replay", "send a saved spans file to a collector"),
    "diff": ("otel_rl._internal.cli.diff", "compare two timers.json files"),
    "export": ("otel_rl._internal.cli.export", "write spans as a Chrome trace (Perfetto)"),
}

#: Top-level modules that come with the `otlp` extra (protobuf, opentelemetry-proto, grpcio).
_OTLP_EXTRA_MODULES = frozenset({"google", "grpc", "opentelemetry"})

_EPILOG = (
    "exit codes: 0 done, 1 diff found a regression, 2 usage error, 3 partial result written, "
    "4 bad input, 5 unavailable (backend, output), 70 internal error, 130 interrupted"
)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error raised as one `UsageError` line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser: argparse.ArgumentParser = _Parser(
        prog="otel-rl",
        description="OpenTelemetry-native profiling for RL training.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="store_true",
                        help="print the version and which hot path times blocks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, (_module, help_text) in SUBCOMMANDS.items():
        parsers[name] = sub.add_parser(
            name, help=help_text, description=help_text, epilog=_EPILOG
        )
    return parser, parsers


def _say(label: str, message: str) -> None:
    line = shorten(f"{label}: {one_line(message)}", MAX_MESSAGE_CHARS)
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # stderr is gone: the exit code still says it


def _tolerant_output() -> None:
    # A timer name the terminal's encoding cannot show is escaped, not a UnicodeEncodeError.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (OSError, ValueError):
                pass


class _GuardedStdout:
    """``sys.stdout`` while a command runs: a stdout that cannot take the output (closed, a full
    disk, ``> /dev/full``, a read-only descriptor) is one `UnavailableError` line (exit 5), not
    an internal error. A reader that went away (EPIPE) stays `BrokenPipeError`: not an error."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _failed(self, exc: BaseException | None) -> NoReturn:
        if self._stream is not None:
            _silence_stdout(self._stream)  # what is still buffered must not fail again at exit
        reason = "it is closed" if exc is None else one_line(getattr(exc, "strerror", None) or exc)
        raise UnavailableError(f"cannot write to standard output ({reason})") from None

    def write(self, text: str) -> int:
        if self._stream is None:
            self._failed(None)
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            self._failed(exc)

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            self._failed(None)
        return getattr(self._stream, name)


def _version() -> str:
    """``otel-rl <version> (hot path: ...; Sample Factory Timing: ...)``: which of the two hot
    paths this install runs, and which Timing (`otel_rl.timing`, compiled or pure)."""
    from importlib import metadata

    from otel_rl._internal import accel  # not the recorder: the CLI reads, it does not time

    try:
        version = metadata.version("otel-rl")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    timing = accel.wanted() and accel.compiled("_timingacc") is not None
    return (f"otel-rl {version} (hot path: {accel.describe(accel.chosen())}; Sample Factory "
            f"Timing: {accel.describe(timing, '_timingacc', 'Timing')})")


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_output()
    stdout = sys.stdout
    sys.stdout = _GuardedStdout(stdout)  # type: ignore[assignment]
    try:
        return _main(argv)
    finally:
        if isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = stdout


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, parsers = build_parser()
    # Only the chosen subcommand's module is imported.
    name = next((a for a in argv if not a.startswith("-")), None)
    label = f"otel-rl {name}" if name in SUBCOMMANDS else "otel-rl"
    try:
        if name is None:
            if argv == ["--version"]:
                print(_version())
                return 0
            if not argv or any(a in ("-h", "--help") for a in argv):
                parser.print_help(sys.stdout)
                return 0
            raise UsageError(f"expected a command ({', '.join(SUBCOMMANDS)}); see 'otel-rl --help'")
        if name not in SUBCOMMANDS:
            raise UsageError(
                f"unknown command {shown(name)} (commands: {', '.join(SUBCOMMANDS)})"
            )
        try:
            module = importlib.import_module(SUBCOMMANDS[name][0])
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in _OTLP_EXTRA_MODULES:
                raise
            raise UsageError(
                f"needs the OTLP extra ({exc.name} is not installed): pip install 'otel-rl[otlp]'"
            ) from None
        module.register(parsers[name])
        args = parser.parse_args(argv)
        return int(module.run(args) or 0)
    except UserError as exc:
        _say(label, str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _say(label, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`otel-rl report x | head`): that is not an error.
        _silence_stdout(sys.stdout)
        return 0
    except SystemExit as exc:  # --help, or a subcommand that exits itself
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # a bug: still one line, never a traceback
        if os.environ.get("OTEL_RL_DEBUG"):
            raise
        _say(
            label,
            f"internal error ({type(exc).__name__}: {one_line(exc)[:80]}); please report it "
            "(OTEL_RL_DEBUG=1 shows the traceback)",
        )
        return EXIT_INTERNAL


def _silence_stdout(stream: Any) -> None:
    """Point `stream`'s descriptor at /dev/null: what is still buffered for it then goes
    nowhere at exit instead of failing a second time."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
