"""Compare two trees node by node: what got slower, what got faster, what appeared or vanished.

Nodes are matched by path (names from the root). The result is sorted by impact — the absolute
change of total time, then of self time — so the first rows are where the time went.

Example::

    diffs = compare(Tree.from_json(a_text), Tree.from_json(b_text))
    print(render(diffs, threshold=10.0))
    slower = regressions(diffs, threshold=10.0, min_seconds=0.01)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from otel_rl._internal.tree import Tree, TreeNode
from otel_rl.renderers.treeview import clean_text, format_count, format_seconds

__all__ = ["NodeDiff", "compare", "regressions", "render"]

_MAX_PATH_WIDTH = 70


@dataclass(frozen=True, slots=True)
class NodeDiff:
    """One node path in both trees; a side where the node is missing has None."""

    path: tuple[str, ...]  # () is the root
    before_total: float | None
    after_total: float | None
    before_self: float | None
    after_self: float | None
    before_count: int | None
    after_count: int | None

    @property
    def status(self) -> str:
        """``"changed"`` (in both), ``"added"`` (only after) or ``"removed"`` (only before)."""
        if self.before_total is None:
            return "added"
        if self.after_total is None:
            return "removed"
        return "changed"

    @property
    def delta_total(self) -> float:
        """After minus before, a missing side counting as 0."""
        return (self.after_total or 0.0) - (self.before_total or 0.0)

    @property
    def delta_self(self) -> float:
        return (self.after_self or 0.0) - (self.before_self or 0.0)

    @property
    def relative_total(self) -> float:
        """Relative change of total (0.25 = 25% slower); ``inf`` for a node that appeared."""
        return _relative(self.before_total or 0.0, self.after_total or 0.0)

    @property
    def relative_self(self) -> float:
        return _relative(self.before_self or 0.0, self.after_self or 0.0)


def _relative(before: float, after: float) -> float:
    if before > 0:
        return (after - before) / before
    return math.inf if after > 0 else 0.0


def _paths(node: TreeNode) -> dict[tuple[str, ...], TreeNode]:
    found: dict[tuple[str, ...], TreeNode] = {(): node}
    found.update(node.walk())
    return found


def compare(a: Tree, b: Tree) -> list[NodeDiff]:
    """Every node path of `a` or `b` (root included), sorted by impact, largest first.

    Ties keep tree order, so nodes with no change read like the tree.
    """
    before, after = _paths(a.root), _paths(b.root)
    order = list(before) + [path for path in after if path not in before]
    diffs = []
    for path in order:
        x, y = before.get(path), after.get(path)
        diffs.append(
            NodeDiff(
                path,
                None if x is None else x.total,
                None if y is None else y.total,
                None if x is None else x.self_time,
                None if y is None else y.self_time,
                None if x is None else x.count,
                None if y is None else y.count,
            )
        )
    # sorted() is stable: equal impact keeps the tree order built above.
    return sorted(diffs, key=lambda d: (-abs(d.delta_total), -abs(d.delta_self)))


def regressions(
    diffs: Sequence[NodeDiff], *, threshold: float, min_seconds: float = 0.0
) -> list[NodeDiff]:
    """Nodes whose total or self time grew by more than `threshold` percent *and* by more than
    `min_seconds` (so tiny blocks' noise is not a regression). A node that appeared counts as
    infinitely grown."""
    limit = threshold / 100.0
    return [
        d
        for d in diffs
        if (d.relative_total > limit and d.delta_total > min_seconds)
        or (d.relative_self > limit and d.delta_self > min_seconds)
    ]


def _signed_seconds(seconds: float) -> str:
    if seconds == 0:
        return "0"
    return ("+" if seconds > 0 else "-") + format_seconds(abs(seconds))


def _signed_percent(rel: float, status: str) -> str:
    if status == "added":
        return "new"
    if status == "removed":
        return "gone"
    if math.isinf(rel):
        return "+inf"
    return f"{100 * rel:+.1f}%"


def _opt_seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def _opt_count(value: int | None) -> str:
    return "-" if value is None else format_count(value)


def _path_label(path: tuple[str, ...]) -> str:
    return " / ".join(clean_text(p) for p in path) if path else "root"


def _shorten_left(text: str, width: int) -> str:
    # Keep the leaf end of a long path: it names the block.
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def render(
    diffs: Sequence[NodeDiff],
    *,
    threshold: float | None = None,
    min_seconds: float = 0.0,
    limit: int | None = None,
) -> str:
    """`diffs` as a table (in the given order), ending with a newline.

    With `threshold` (percent), rows that are `regressions` are marked ``!`` and a summary line
    counts them. `limit` shows only the first rows (and every marked one) and says how many
    were left out.
    """
    if not diffs:
        return "no nodes to compare\n"
    flagged = (
        {d.path for d in regressions(diffs, threshold=threshold, min_seconds=min_seconds)}
        if threshold is not None
        else set()
    )
    # Rows past the limit are left out, except regressions: a gate must show why it failed.
    shown = [d for i, d in enumerate(diffs) if limit is None or i < limit or d.path in flagged]
    width = max([len("block")] + [len(_path_label(d.path)) for d in shown])
    width = min(width, _MAX_PATH_WIDTH)
    lines = [
        f"  {'block':<{width}}  {'before':>11}  {'after':>11}  {'delta':>12}  {'change':>8}"
        f"  {'self delta':>12}  {'self chg':>8}  {'count before':>12}  {'count after':>11}"
    ]
    for d in shown:
        mark = "!" if d.path in flagged else " "
        lines.append(
            f"{mark} {_shorten_left(_path_label(d.path), width):<{width}}"
            f"  {_opt_seconds(d.before_total):>11}  {_opt_seconds(d.after_total):>11}"
            f"  {_signed_seconds(d.delta_total):>12}"
            f"  {_signed_percent(d.relative_total, d.status):>8}"
            f"  {_signed_seconds(d.delta_self):>12}"
            f"  {_signed_percent(d.relative_self, d.status):>8}"
            f"  {_opt_count(d.before_count):>12}  {_opt_count(d.after_count):>11}"
        )
    if len(shown) < len(diffs):
        hidden = len(diffs) - len(shown)
        lines.append(f"  ... and {hidden} more node{'s' if hidden != 1 else ''}")
    if threshold is not None:
        noise = f" and by more than {format_seconds(min_seconds)}" if min_seconds > 0 else ""
        if flagged:
            lines.append(
                f"! {len(flagged)} node(s) grew by more than {threshold:g}%{noise} "
                "(total or self time)"
            )
        else:
            lines.append(f"no node grew by more than {threshold:g}%{noise}")
    return "\n".join(lines) + "\n"
