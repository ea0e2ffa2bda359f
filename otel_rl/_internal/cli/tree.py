"""``otel-rl tree``: rebuild ``timers.json`` from spans (a file, Jaeger or Tempo).

    otel-rl tree spans.jsonl -o timers.json
    otel-rl tree --jaeger http://localhost:16686 --trace-id 4bf92f3577b34da6a3ce929d0e0e4736
    otel-rl tree --tempo http://localhost:3200 --trace-id 4bf92f3577b34da6a3ce929d0e0e4736
    otel-rl tree --jaeger http://localhost:16686 --run-id 20260101-120000-ab12cd

With ``--run-id`` the run's traces are found by the ids every process derived from the run id:
the tree comes from the aggregate spans of every process (exact, whatever the span policy).

A tree built from a partial span set (missing parents, sampled iterations, a cut trace) is
still written, marked ``"complete": false`` with its notes; one line on stderr says so and the
exit status is 3 unless ``--allow-partial``. Bad input is one line and exit status 4.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from otel_rl._internal.errors import EXIT_PARTIAL, UsageError, UserError, shorten
from otel_rl._internal.spandata import SpanData


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
    parser.add_argument("--run-id", metavar="RUN", help="fetch every trace of this run")
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
    from otel_rl._internal.readers._common import check_timeout
    from otel_rl._internal.readers.boundary import decode_text, read_stream
    from otel_rl._internal.readers.otlp_json import parse_spans_text

    sources = [s for s in (args.spans_file, args.jaeger, args.tempo) if s]
    if len(sources) != 1:
        raise UsageError("give exactly one of SPANS_FILE, --jaeger URL or --tempo URL")
    check_timeout(args.timeout)
    if args.spans_file:
        if args.trace_id or getattr(args, "run_id", None):
            raise UsageError("--trace-id and --run-id go with --jaeger or --tempo, not a spans file")
        if args.spans_file == "-":
            if sys.stdin is None:
                raise UserError("<stdin>: standard input is closed")
            stdin = getattr(sys.stdin, "buffer", None)
            text = (
                decode_text(read_stream(stdin, "<stdin>"), "<stdin>")
                if stdin is not None
                else sys.stdin.read()
            )
            return parse_spans_text(text, "<stdin>"), "stdin"
        return readers.read_spans_file(args.spans_file), args.spans_file
    run_id = getattr(args, "run_id", None)
    if bool(args.trace_id) == bool(run_id):
        raise UsageError("give one of --trace-id or --run-id with --jaeger or --tempo")
    if run_id:
        from otel_rl._internal.readers.run import fetch_run

        fetch = readers.fetch_jaeger if args.jaeger else readers.fetch_tempo
        url = args.jaeger or args.tempo
        return fetch_run(fetch, url, run_id, args.timeout), url
    if args.jaeger:
        return readers.fetch_jaeger(args.jaeger, args.trace_id, args.timeout), args.jaeger
    return readers.fetch_tempo(args.tempo, args.trace_id, args.timeout), args.tempo


def partial_line(notes: list[str], allow_partial: bool, what: str) -> str:
    """The one stderr line for a partial result: the first reason, and what to do about it."""
    first = notes[0] if notes else "built from a partial set of spans"
    more = f" (+{len(notes) - 1} more in the notes)" if len(notes) > 1 else ""
    if allow_partial:
        return f"warning: {what} covers only part of the run: {shorten(first, 90)}{more}"
    return (
        f"{what} covers only part of the run: {shorten(first, 80)}{more}; "
        "pass --allow-partial to accept it"
    )


def _from_aggregates_in_file(args: argparse.Namespace) -> Any:
    """The tree from a spans file's aggregate spans, streamed (memory does not grow with the
    number of spans); None when the input is not a file or has no aggregates."""
    if not args.spans_file or args.spans_file == "-" or args.jaeger or args.tempo:
        return None
    if args.trace_id or getattr(args, "run_id", None):
        return None  # _load says why that is wrong
    from otel_rl._internal.readers.boundary import describe_path
    from otel_rl._internal.readers.stream import scan_aggregates, tree_from_collected

    collected = scan_aggregates(args.spans_file)
    if not collected:
        return None
    return tree_from_collected(collected, describe_path(args.spans_file))


def run(args: argparse.Namespace) -> int:
    """Rebuild the tree and write it; 0, or 3 for a partial tree without --allow-partial."""
    from otel_rl._internal.cli._output import check_output_path, write_output
    from otel_rl._internal.readers.otlp_json import torn_last_lines_skipped
    from otel_rl._internal.readers.semantics import check_span_set
    from otel_rl._internal.treebuild import build_tree

    if args.output is not None:
        check_output_path(args.output, "--output")
    with torn_last_lines_skipped(args.allow_partial) as torn:
        tree = _from_aggregates_in_file(args)
        if tree is None:
            spans, source = _load(args)
            if not spans:
                raise UserError(f"no spans in {source}")
            check_span_set(spans, source)
            tree = build_tree(spans)
    mark_torn(tree, torn)
    text = tree.to_json(indent=2) + "\n"
    if args.output is not None:
        write_output(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if tree.complete:
        return 0
    what = 'the tree (written with "complete": false)'
    print(f"otel-rl tree: {partial_line(tree.notes, args.allow_partial, what)}", file=sys.stderr)
    return 0 if args.allow_partial and not torn else EXIT_PARTIAL


def mark_torn(tree: Any, torn: list[str]) -> None:
    """A tree read from a file whose torn last line was skipped is partial, whatever else:
    the command then exits 3 even with --allow-partial (the input itself was damaged)."""
    if torn:
        tree.complete = False
        tree.notes = list(dict.fromkeys([*torn, *tree.notes]))
