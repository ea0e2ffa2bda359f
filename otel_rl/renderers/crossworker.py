"""The cross-worker view: one merged report per worker role instead of N near-identical ones.

Sixteen rollout workers produce sixteen trees that differ only in their numbers. This view
lines them up node by node (by path below the block that started them) and shows, per node,
the minimum, mean and maximum total and count over the workers that ran it, how many of them
did, and which one was slowest — the straggler that the others wait for. When any block was
timed on the GPU too, the mean and maximum GPU time over the workers that measured it.

Example::

    for role in summarize(tree):
        print(role.role, [(s.path, s.slowest.index) for s in role.nodes])
    print(render(tree))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from otel_rl._internal.tree import Tree, TreeNode, WorkerInfo
from otel_rl.renderers.treeview import clean_text, format_count, format_seconds

__all__ = ["NodeStats", "RoleSummary", "render", "summarize"]

_MAX_NAME_WIDTH = 60


@dataclass(slots=True)
class NodeStats:
    """One node path's numbers across the workers of a role that ran it."""

    path: tuple[str, ...]  # below the block that started the workers; () = all their blocks
    totals: list[float]  # one per worker that ran the node, in `workers` order
    counts: list[int]
    workers: list[WorkerInfo]
    is_parallel: bool = False
    gpu_totals: list[float] = field(default_factory=list)  # workers that measured GPU time

    @property
    def mean_gpu(self) -> float | None:
        return sum(self.gpu_totals) / len(self.gpu_totals) if self.gpu_totals else None

    @property
    def max_gpu(self) -> float | None:
        return max(self.gpu_totals) if self.gpu_totals else None

    @property
    def min_total(self) -> float:
        return min(self.totals)

    @property
    def mean_total(self) -> float:
        return sum(self.totals) / len(self.totals)

    @property
    def max_total(self) -> float:
        return max(self.totals)

    @property
    def min_count(self) -> int:
        return min(self.counts)

    @property
    def mean_count(self) -> float:
        return sum(self.counts) / len(self.counts)

    @property
    def max_count(self) -> int:
        return max(self.counts)

    @property
    def slowest(self) -> WorkerInfo:
        """The worker with the largest total at this node (the first one on a tie)."""
        return self.workers[self.totals.index(self.max_total)]


@dataclass(slots=True)
class RoleSummary:
    """All workers of one role, merged: one `NodeStats` per node path, depth first."""

    role: str
    workers: list[WorkerInfo]
    start_paths: list[tuple[str, ...]]  # where the workers hang in the main tree
    nodes: list[NodeStats] = field(default_factory=list)


def _union(nodes: list[TreeNode]) -> TreeNode:
    """A node whose children are the union of all `nodes`' children, first-seen order."""
    union = TreeNode("")
    for node in nodes:
        union.merge(node, is_parallel=False)
    return union


def _walk(node: TreeNode) -> Iterator[tuple[str, ...]]:
    for path, _child in node.walk():
        yield path


def _find(node: TreeNode, path: tuple[str, ...]) -> TreeNode | None:
    found: TreeNode | None = node
    for name in path:
        if found is None:
            return None
        found = found.children.get(name)
    return found


def summarize(tree: Tree) -> list[RoleSummary]:
    """The workers of `tree` grouped by role (first-seen order), merged node by node."""
    by_role: dict[str, list[WorkerInfo]] = {}
    for worker in tree.workers:
        by_role.setdefault(worker.role, []).append(worker)
    summaries = []
    for role, workers in by_role.items():
        workers = sorted(workers, key=lambda w: (w.index, w.pid))
        start_paths = list(dict.fromkeys(tuple(w.path) for w in workers))
        summary = RoleSummary(role, workers, start_paths)
        # The "all blocks" row: each worker's own time is the sum of its top-level blocks.
        summary.nodes.append(
            NodeStats(
                (),
                [sum(c.total for c in w.node.children.values()) for w in workers],
                [sum(c.count for c in w.node.children.values()) for w in workers],
                list(workers),
                gpu_totals=[
                    sum(c.gpu_total for c in w.node.children.values())
                    for w in workers
                    if any(c.gpu_count for c in w.node.children.values())
                ],
            )
        )
        union = _union([w.node for w in workers])
        for path in _walk(union):
            stats = NodeStats(path, [], [], [])
            for worker in workers:
                node = _find(worker.node, path)
                if node is not None:
                    stats.totals.append(node.total)
                    stats.counts.append(node.count)
                    stats.workers.append(worker)
                    stats.is_parallel |= node.is_parallel
                    if node.gpu_count:
                        stats.gpu_totals.append(node.gpu_total)
            summary.nodes.append(stats)
        summaries.append(summary)
    return summaries


def _labels(nodes: list[NodeStats], ascii_only: bool) -> list[str]:
    """Tree-drawn labels for the node paths (depth-first order, as `summarize` gives them)."""
    branch, last, pipe, blank = (
        ("|- ", "`- ", "|  ", "   ") if ascii_only else ("├─ ", "└─ ", "│  ", "   ")
    )
    last_child: dict[tuple[str, ...], tuple[str, ...]] = {}
    for stats in nodes:
        if stats.path:
            last_child[stats.path[:-1]] = stats.path
    labels = []
    for stats in nodes:
        path = stats.path
        if not path:
            labels.append("(all blocks)")
            continue
        prefix = "".join(
            blank if last_child[path[: d - 1]] == path[:d] else pipe for d in range(1, len(path))
        )
        prefix += last if last_child[path[:-1]] == path else branch
        labels.append(prefix + clean_text(path[-1]))
    return labels


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _worker_name(worker: WorkerInfo) -> str:
    return f"#{worker.index} (pid {worker.pid})"


def render(tree: Tree, *, ascii_only: bool = False) -> str:
    """The cross-worker view of `tree` as text, one section per worker role."""
    summaries = summarize(tree)
    if not summaries:
        return "no worker processes in this tree\n"
    lines: list[str] = []
    if not tree.complete:
        lines.append("INCOMPLETE: built from a partial or sampled set of spans; see the notes.")

    def fmt(seconds: float) -> str:
        return format_seconds(seconds, ascii_only=ascii_only)

    gpu = tree.has_gpu()
    gpu_head = f"  {'gpu mean':>10}  {'gpu max':>10}" if gpu else ""

    def gpu_cells(stats: NodeStats) -> str:
        if not gpu:
            return ""
        mean, top = stats.mean_gpu, stats.max_gpu
        return (f"  {fmt(mean) if mean is not None else '-':>10}"
                f"  {fmt(top) if top is not None else '-':>10}")

    for summary in summaries:
        where = ", ".join(
            " / ".join(clean_text(p) for p in path) or "root" for path in summary.start_paths
        )
        pids = ", ".join(str(w.pid) for w in summary.workers)
        if lines:
            lines.append("")
        lines.append(
            f"== {clean_text(summary.role) or 'worker'}: {len(summary.workers)} workers "
            f"(pids {pids}), started under {where} =="
        )
        labels = _labels(summary.nodes, ascii_only)
        width = min(_MAX_NAME_WIDTH, max(len(label) for label in labels))
        lines.append(
            f"{'block':<{width}}  {'workers':>7}  {'total min':>10}  {'mean':>10}  {'max':>10}"
            f"  {'max/mean':>8}{gpu_head}"
            f"  {'count min':>9}  {'mean':>9}  {'max':>9}  slowest"
        )
        for label, stats in zip(labels, summary.nodes, strict=True):
            spread = f"{stats.max_total / stats.mean_total:.2f}x" if stats.mean_total > 0 else "-"
            lines.append(
                f"{_shorten(label, width):<{width}}"
                f"  {f'{len(stats.totals)}/{len(summary.workers)}':>7}"
                f"  {fmt(stats.min_total):>10}  {fmt(stats.mean_total):>10}"
                f"  {fmt(stats.max_total):>10}  {spread:>8}{gpu_cells(stats)}"
                f"  {format_count(stats.min_count):>9}  {format_count(stats.mean_count):>9}"
                f"  {format_count(stats.max_count):>9}  {_worker_name(stats.slowest)}"
            )
    return "\n".join(lines) + "\n"
