"""``otel-rl diff A B``: compare two runs node by node; exit 1 when something got slower.

A and B are timers.json files (or spans files, rebuilt into trees the way ``report`` does).
The exit code makes the command a CI gate: 1 when any node's total or self time grew by more
than ``--threshold`` percent *and* by more than ``--min-seconds`` (so microsecond blocks'
jitter does not fail a build), 0 otherwise. 1 means exactly that: a bad option is 2, a tree
that covers only part of its run is 3 (its totals are lower bounds, so no verdict; pass
``--allow-partial`` to compare anyway) and an unreadable or invalid file is 4.
"""

from __future__ import annotations

import argparse
import math
import sys

from otel_rl._internal.errors import EXIT_PARTIAL, EXIT_REGRESSION, UsageError

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
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="compare even when a tree covers only part of its run (totals are lower bounds)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the comparison; 1 if a node regressed beyond the thresholds, else 0."""
    from otel_rl._internal.cli.report import load_input
    from otel_rl._internal.cli.tree import partial_line
    from otel_rl._internal.readers.boundary import describe_path
    from otel_rl.renderers.diff import compare, regressions, render

    if not math.isfinite(args.threshold) or args.threshold < 0:
        raise UsageError(f"--threshold must be a non-negative number, got {args.threshold:g}")
    if not math.isfinite(args.min_seconds) or args.min_seconds < 0:
        raise UsageError(f"--min-seconds must be a non-negative number, got {args.min_seconds:g}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    # Both files are read before anything is printed: an unreadable one is exit 4, never 1.
    before, _ = load_input(args.before)
    after, _ = load_input(args.after)
    diffs = compare(before, after)
    sys.stdout.write(
        render(diffs, threshold=args.threshold, min_seconds=args.min_seconds, limit=args.limit)
    )
    sys.stdout.flush()
    partial = [(path, tree) for path, tree in ((args.before, before), (args.after, after))
               if not tree.complete]
    if partial:
        path, tree = partial[0]
        line = partial_line(tree.notes, args.allow_partial, describe_path(path, 40))
        print(f"otel-rl diff: {line}", file=sys.stderr)
        if not args.allow_partial:
            return EXIT_PARTIAL
    slower = regressions(diffs, threshold=args.threshold, min_seconds=args.min_seconds)
    return EXIT_REGRESSION if slower else 0
