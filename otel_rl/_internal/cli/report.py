"""``otel-rl report FILE``: print the tree view (and the cross-worker view), write HTML.

FILE is a ``timers.json`` (ML-Agents' schema, as otel_rl writes it) or an OTLP-JSON spans file
(the Collector's file-exporter format, plain or gzip); the content decides, not the name. From
spans the tree is rebuilt, and the HTML report also gets a timeline of them. A tree that covers
only part of the run (missing parents, sampled iterations) is reported with a banner and exit
status 3 unless ``--allow-partial``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from otel_rl._internal.errors import EXIT_PARTIAL, UserError
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree

__all__ = ["load_input", "read_timers_document", "register", "run"]

#: Keys that make a JSON document spans (OTLP, Jaeger api_v3, Tempo), not a timers.json.
_SPAN_KEYS = ("resourceSpans", "resource_spans", "result", "batches", "trace")


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``report``'s arguments to its subparser."""
    parser.add_argument("input", metavar="FILE", help="a timers.json or an OTLP-JSON spans file")
    parser.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report")
    parser.add_argument("--title", help="the HTML report's title (default: the input's name)")
    parser.add_argument(
        "--workers",
        action="store_true",
        help="print the cross-worker view (printed anyway when the tree has workers)",
    )
    parser.add_argument(
        "--per-process",
        action="store_true",
        help="one tree per process: the main process, then each worker",
    )
    parser.add_argument(
        "--ascii", action="store_true", help="draw the tree with ASCII instead of box characters"
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="exit 0 even when the spans cover only part of the run",
    )


def _looks_like_timers(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and ("total" in doc or "name" in doc)
        and not any(key in doc for key in _SPAN_KEYS)
    )


def load_input(path: str | Path) -> tuple[Tree, list[SpanData] | None]:
    """The tree in `path` and, for a spans file, the spans it was rebuilt from.

    A timers.json is a JSON object with ``total``/``name``; anything else is read as spans.
    Unreadable or malformed input raises `UserError` naming the file (see
    `otel_rl._internal.readers.boundary` for what is refused).
    """
    from otel_rl._internal.readers.boundary import (
        decode_text,
        describe_path,
        parse_json,
        read_input,
    )

    streamed = _from_aggregates(path)
    if streamed is not None:
        return streamed
    source = describe_path(path)
    text = decode_text(read_input(path, "a timers.json or spans file"), source)
    if not text.strip():
        raise UserError(f"{source}: empty file")
    if text.lstrip()[:1] not in ("{", "["):
        raise UserError(f"{source}: not a timers.json or an OTLP-JSON spans file (not JSON)")
    # Imported here: reading a timers.json needs neither the span readers nor the builder.
    from otel_rl._internal.readers.otlp_json import parse_spans_text, spans_from_document
    from otel_rl._internal.readers.semantics import check_span_set
    from otel_rl._internal.treebuild import build_tree

    doc: Any = None
    if "\n" not in text.strip():
        doc = parse_json(text, source)  # one line: one document either way; errors say why
    else:
        try:
            doc = parse_json(text, source)
        except UserError:
            doc = None  # JSON lines (a spans file), or broken: the spans reader says which
    if _looks_like_timers(doc):
        return read_timers_document(doc, source), None
    spans = parse_spans_text(text, source) if doc is None else spans_from_document(doc, source)
    if not spans:
        raise UserError(f"{source}: no spans in the file")
    check_span_set(spans, source)
    return build_tree(spans), spans


def _from_aggregates(path: str | Path) -> tuple[Tree, list[SpanData]] | None:
    """For a spans file with aggregate spans: the exact tree from them and the whole-run
    timeline's longest spans, both streamed (memory does not grow with the file); else None."""
    from otel_rl._internal.readers.boundary import describe_path
    from otel_rl._internal.readers.stream import is_spans_lines, scan_aggregates

    if not is_spans_lines(path):
        return None
    collected = scan_aggregates(path)
    if not collected:
        return None
    from otel_rl._internal.readers.stream import tree_from_collected as tree_from_aggregates
    from otel_rl._internal.readers.timeline import timeline_spans
    from otel_rl.renderers.html import MAX_TIMELINE_SPANS

    # Every line was checked in full by scan_aggregates: the timeline's spans are chosen
    # without converting the others (a torn last line it let through is skipped here too).
    return tree_from_aggregates(collected, describe_path(path)), timeline_spans(
        path, MAX_TIMELINE_SPANS
    )


def read_timers_document(doc: Any, source: str) -> Tree:
    """The `Tree` in a parsed timers.json; schema errors and out-of-range values name `source`."""
    from otel_rl._internal.readers.semantics import check_tree

    try:
        return check_tree(Tree.from_dict(doc))
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Print the report for ``args.input``; write ``args.html`` if given.

    0, or 3 when the tree covers only part of the run (unless ``--allow-partial``).
    """
    from otel_rl._internal.cli._output import check_output_path, write_output
    from otel_rl._internal.cli.tree import mark_torn, partial_line
    from otel_rl._internal.readers.otlp_json import torn_last_lines_skipped
    from otel_rl.renderers import crossworker, treeview

    if args.html is not None:
        check_output_path(args.html, "--html")
    with torn_last_lines_skipped(args.allow_partial) as torn:
        tree, spans = load_input(args.input)
    mark_torn(tree, torn)
    # Render everything first: a failure must not leave a half-written HTML file behind.
    page = None
    if args.html is not None:
        from otel_rl.renderers import html

        page = html.render(
            tree, spans, title=args.title or f"otel-rl report: {Path(args.input).name}"
        )
    out = [treeview.render(tree, per_process=args.per_process, ascii_only=args.ascii)]
    if tree.workers or args.workers:
        out.append(crossworker.render(tree, ascii_only=args.ascii))
    if page is not None:
        write_output(args.html, page, "--html")
    sys.stdout.write("\n".join(out))
    sys.stdout.flush()
    if tree.complete:
        if page is not None:
            print(f"wrote {args.html}", file=sys.stderr)
        return 0
    line = partial_line(tree.notes, args.allow_partial, "the report")
    print(f"otel-rl report: {line}", file=sys.stderr)
    return 0 if args.allow_partial and not torn else EXIT_PARTIAL
