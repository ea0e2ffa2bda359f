"""`otel-rl` command line. Each subcommand lives in its own module with a `register` function.

Importing this package imports no subcommand: `otel-rl tree` never pays for the demo's numpy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from otel_rl._internal.errors import UserError

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
}

#: Top-level modules that come with the `otlp` extra (protobuf, opentelemetry-proto, grpcio).
_OTLP_EXTRA_MODULES = frozenset({"google", "grpc", "opentelemetry"})


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="otel-rl", description="OpenTelemetry-native profiling for RL training."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers = {}
    for name, (_module, help_text) in SUBCOMMANDS.items():
        parsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    return parser, parsers


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, parsers = build_parser()
    # Only the chosen subcommand's module is imported.
    name = next((a for a in argv if not a.startswith("-")), None)
    if name not in SUBCOMMANDS:
        parser.print_help(sys.stderr if name else sys.stdout)
        return 2 if name else 0
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _OTLP_EXTRA_MODULES:
            raise
        print(f"otel-rl {name}: needs the OTLP extra ({exc.name} is not installed): "
              "pip install 'otel-rl[otlp]'", file=sys.stderr)
        return 2
    module.register(parsers[name])
    args = parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"otel-rl {name}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"otel-rl {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
