"""``otel-rl export``: spans in a format other viewers open.

    otel-rl export spans.otlp.jsonl --format chrome -o trace.json

``chrome`` is the Chrome trace-event format (Perfetto, chrome://tracing, speedscope): one
track per process and thread, each block a complete event. The spans file is read one line at
a time through the input boundary and the trace written as it is made, so neither grows in
memory with the number of spans; the output appears whole (renamed into place) or not at all.
"""

from __future__ import annotations

import argparse

from otel_rl._internal.errors import UsageError

FORMATS = ("chrome",)


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``otel-rl export``'s arguments to `parser`."""
    parser.add_argument("spans_file", metavar="SPANS_FILE",
                        help="OTLP/JSON spans file (otel_rl's, the Collector file exporter's, "
                        "or a saved Jaeger/Tempo answer; may be gzip)")
    parser.add_argument("--format", choices=FORMATS, default="chrome",
                        help="output format (default: chrome, the Chrome trace-event format)")
    parser.add_argument("-o", "--output", metavar="FILE", required=True,
                        help="the file to write (e.g. trace.json)")


def run(args: argparse.Namespace) -> int:
    from otel_rl._internal.cli._output import check_output_path, write_output_stream
    from otel_rl._internal.readers.boundary import open_input
    from otel_rl._internal.readers.stream import iter_spans
    from otel_rl.renderers.chrome import render_chunks

    if args.spans_file == "-":
        raise UsageError("export reads a file, not stdin (it is read twice: shape, then spans)")
    check_output_path(args.output, "--output")
    open_input(args.spans_file, "a spans file").close()  # missing/unreadable: before any output
    write_output_stream(args.output, render_chunks(iter_spans(args.spans_file)))
    return 0
