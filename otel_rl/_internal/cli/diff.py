"""``otel-rl diff A B``: compare two runs node by node; exit 1 when something got slower.

A and B are timers.json files (or spans files, rebuilt into trees the way ``report`` does).
The exit code makes the command a CI gate: 1 when any node's total or self time grew by more
than ``--threshold`` percent *and* by more than ``--min-seconds`` (so microsecond blocks'
jitter does not fail a build), 0 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import math
import sys

from otel_rl._internal.errors import UserError

__all__ = ["register", "run"]

DEFAULT_THRESHOLD = 10.0
DEFAULT_MIN_SECONDS = 0.01


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``diff``'s arguments to its subparser."""
    parser.add_argument("before", metavar="A", help="the baseline timers.json")
    parser.add_argument("after", metavar="B", help="the timers.json to compare with A")
    parser.add_argument(
        "--threshold",
        metavar="PCT",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"percent growth that counts as a regression (default {DEFAULT_THRESHOLD:g})",
    )
    parser.add_argument(
        "--min-seconds",
        metavar="S",
        type=float,
        default=DEFAULT_MIN_SECONDS,
        help="ignore growth smaller than this many seconds, as noise "
        f"(default {DEFAULT_MIN_SECONDS:g})",
    )
    parser.add_argument("--limit", metavar="N", type=int, help="show only the N most changed nodes")


def run(args: argparse.Namespace) -> int:
    """Print the comparison; 1 if a node regressed beyond the thresholds, else 0."""
    from otel_rl._internal.cli.report import load_input
    from otel_rl.renderers.diff import compare, regressions, render

    if not math.isfinite(args.threshold) or args.threshold < 0:
        raise UserError(f"--threshold must be a non-negative number, got {args.threshold:g}")
    if not math.isfinite(args.min_seconds) or args.min_seconds < 0:
        raise UserError(f"--min-seconds must be a non-negative number, got {args.min_seconds:g}")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be at least 1, got {args.limit}")
    before, _ = load_input(args.before)
    after, _ = load_input(args.after)
    for label, tree in ((args.before, before), (args.after, after)):
        if not tree.complete:
            reasons = "; ".join(tree.notes) or "built from a partial set of spans"
            print(f"otel-rl diff: warning: {label} is incomplete ({reasons})", file=sys.stderr)
    diffs = compare(before, after)
    sys.stdout.write(
        render(diffs, threshold=args.threshold, min_seconds=args.min_seconds, limit=args.limit)
    )
    slower = regressions(diffs, threshold=args.threshold, min_seconds=args.min_seconds)
    return 1 if slower else 0
