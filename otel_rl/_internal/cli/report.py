"""``otel-rl report FILE``: print the tree view (and the cross-worker view), write HTML.

FILE is a ``timers.json`` (ML-Agents' schema, as otel_rl writes it) or an OTLP-JSON spans file
(the Collector's file-exporter format, plain or gzip); the content decides, not the name. From
spans the tree is rebuilt, and the HTML report also gets a timeline of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from otel_rl._internal.errors import UserError, one_line
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree

__all__ = ["load_input", "register", "run"]

_GZIP_MAGIC = b"\x1f\x8b"
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


def _looks_like_timers(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and ("total" in doc or "name" in doc)
        and not any(key in doc for key in _SPAN_KEYS)
    )


def load_input(path: str | Path) -> tuple[Tree, list[SpanData] | None]:
    """The tree in `path` and, for a spans file, the spans it was rebuilt from.

    A timers.json is a JSON object with ``total``/``name``; anything else is read as spans.
    Unreadable or malformed input raises `UserError` naming the file.
    """
    from otel_rl._internal.readers._common import read_user_file

    path = Path(path)
    raw = read_user_file(path, "a timers.json or spans file")
    # Imported here: reading a timers.json needs neither the span readers nor the builder.
    from otel_rl._internal.readers.otlp_json import parse_spans_text, read_otlp_json_file
    from otel_rl._internal.treebuild import build_tree

    if raw.startswith(_GZIP_MAGIC):
        spans = read_otlp_json_file(path)
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        if not text.strip():
            raise UserError(f"{path}: empty file")
        if text.lstrip()[:1] not in ("{", "["):
            raise UserError(f"{path}: not a timers.json or an OTLP-JSON spans file (not JSON)")
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None  # JSON lines (a spans file), or broken: the spans reader says which
        if _looks_like_timers(doc):
            try:
                return Tree.from_dict(doc), None
            except UserError as exc:
                raise UserError(f"{path}: {exc}") from None
        spans = parse_spans_text(text, str(path))
    if not spans:
        raise UserError(f"{path}: no spans in the file")
    return build_tree(spans), spans


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path} ({one_line(exc)})") from None


def run(args: argparse.Namespace) -> int:
    """Print the report for ``args.input``; write ``args.html`` if given."""
    from otel_rl.renderers import crossworker, treeview

    tree, spans = load_input(args.input)
    # Render everything first: a failure must not leave a half-written HTML file behind.
    page = None
    if args.html:
        from otel_rl.renderers import html

        page = html.render(
            tree, spans, title=args.title or f"otel-rl report: {Path(args.input).name}"
        )
    if page is not None:
        _write(Path(args.html), page)
    out = [treeview.render(tree, per_process=args.per_process, ascii_only=args.ascii)]
    if tree.workers or args.workers:
        out.append(crossworker.render(tree, ascii_only=args.ascii))
    sys.stdout.write("\n".join(out))
    if page is not None:
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
