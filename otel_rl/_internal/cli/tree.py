"""``otel-rl tree``: rebuild ``timers.json`` from spans (a file, Jaeger or Tempo).

    otel-rl tree spans.jsonl -o timers.json
    otel-rl tree --jaeger http://localhost:16686 --trace-id 4bf92f3577b34da6a3ce929d0e0e4736
    otel-rl tree --tempo http://localhost:3200 --trace-id 4bf92f3577b34da6a3ce929d0e0e4736

A tree built from a partial span set (missing parents, sampled iterations, a cut trace) is
still written, marked ``"complete": false`` with its notes; the notes go to stderr and the exit
status is 3 unless ``--allow-partial``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from otel_rl._internal.errors import UserError
from otel_rl._internal.spandata import SpanData

#: Exit status for a tree written from a partial span set (see IncompleteResultError).
EXIT_PARTIAL = 3


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``otel-rl tree``'s arguments to `parser`."""
    parser.add_argument(
        "spans_file",
        nargs="?",
        metavar="SPANS_FILE",
        help="OTLP/JSON spans file (Collector file exporter, otel_rl's spans file, or a saved "
        "Jaeger/Tempo answer; may be gzip); '-' reads stdin",
    )
    parser.add_argument("--jaeger", metavar="URL", help="Jaeger query URL, e.g. http://host:16686")
    parser.add_argument("--tempo", metavar="URL", help="Tempo URL, e.g. http://host:3200")
    parser.add_argument("--trace-id", metavar="ID", help="the trace to fetch (hex)")
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="HTTP timeout (default: 10)"
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="write timers.json here (default: stdout)"
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="exit 0 even when the spans cover only part of the run",
    )


def _load(args: argparse.Namespace) -> tuple[list[SpanData], str]:
    from otel_rl._internal import readers
    from otel_rl._internal.readers.otlp_json import parse_spans_text

    sources = [s for s in (args.spans_file, args.jaeger, args.tempo) if s]
    if len(sources) != 1:
        raise UserError("give exactly one of SPANS_FILE, --jaeger URL or --tempo URL")
    if args.timeout <= 0:
        raise UserError("--timeout must be positive")
    if args.spans_file:
        if args.trace_id:
            raise UserError("--trace-id goes with --jaeger or --tempo, not a spans file")
        if args.spans_file == "-":
            return parse_spans_text(sys.stdin.read(), "<stdin>"), "stdin"
        return readers.read_spans_file(args.spans_file), args.spans_file
    if not args.trace_id:
        raise UserError("--trace-id is required with --jaeger or --tempo")
    if args.jaeger:
        return readers.fetch_jaeger(args.jaeger, args.trace_id, args.timeout), args.jaeger
    return readers.fetch_tempo(args.tempo, args.trace_id, args.timeout), args.tempo


def _write(path: str, text: str) -> None:
    target = Path(path)
    # Write beside the target and rename, so a reader never sees half a timers.json.
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    """Rebuild the tree and write it; 0, or 3 for a partial tree without --allow-partial."""
    from otel_rl._internal.treebuild import build_tree

    spans, source = _load(args)
    if not spans:
        raise UserError(f"no spans in {source}")
    tree = build_tree(spans)
    text = tree.to_json(indent=2) + "\n"
    if args.output:
        _write(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if tree.complete:
        return 0
    for note in tree.notes:
        print(f"otel-rl tree: incomplete: {note}", file=sys.stderr)
    if args.allow_partial:
        return 0
    print(
        'otel-rl tree: the tree covers only part of the run (written with "complete": false); '
        "pass --allow-partial to accept it",
        file=sys.stderr,
    )
    return EXIT_PARTIAL
