"""The whole-run tree: every thread's and worker process's blocks, under the block that
started them, as ML-Agents' timers.json schema (plus a ``workers`` list for per-worker views).

A process describes what it recorded as *contributions*: (path of the starting block,
parallel flag, subtree). Workers send theirs to the parent as snapshots (cumulative, so the
latest one replaces the previous, and a worker killed mid-run loses only its last interval).

Pure: it reads no process state (this process's own stacks become contributions in
`contribute`), so the read side (`aggregates`, rebuilding the tree from a trace's aggregate
spans) builds the same tree without importing the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from otel_rl._internal.node import Gauge
from otel_rl._internal.shapes import Contribution, GaugeDict, MainWorker, Snapshot, TimersDict

if TYPE_CHECKING:
    # Imported where used: only the main process's shutdown builds a Tree, and the tree model
    # (dataclasses) would cost every worker milliseconds of start-up.
    from otel_rl._internal.tree import Tree, TreeNode, WorkerInfo


def merge_gauge(into: dict[str, GaugeDict], name: str, gauge: GaugeDict) -> None:
    """Fold `gauge` into `into[name]` by the one rule (`node.Gauge.merge`)."""
    mine = into.get(name)
    if mine is None:
        into[name] = gauge.copy()
        return
    merged = Gauge.from_dict(mine)
    merged.merge(Gauge.from_dict(gauge))
    into[name] = merged.to_dict(ts=True)


def _flatten(snapshot: Snapshot) -> Iterable[Snapshot]:
    yield snapshot
    for child in snapshot.get("children") or ():
        yield from _flatten(child)


def _place(tree: Tree, contribution: Contribution,
           places: dict[tuple[int, int], tuple[str, ...]]) -> TreeNode:
    """Merge a contribution's blocks under the block that started them, or where the program
    merged that thread's tree itself (`placement`); returns its subtree. The contribution's
    path is updated to where it went."""
    from otel_rl._internal.tree import Tree, TreeNode

    part = contribution["tree"]
    # This process's own snapshot is a node already; a worker's arrived as JSON.
    node = part if isinstance(part, TreeNode) else Tree.from_dict(part).root
    parallel = contribution["parallel"]
    place = places.get((int(contribution.get("pid") or 0), int(contribution.get("tid") or 0)))
    if place is not None:
        contribution["path"], parallel = list(place), True
    at = tree.node_at(contribution["path"])
    for name, child in node.children.items():
        at.child(name).merge(child, is_parallel=parallel)
    return node


def _worker(contribution: Contribution, node: TreeNode, role: str, index: int,
            pid: int) -> WorkerInfo:
    """The cross-worker entry of a contribution: a component's blocks (below the component
    node, named by the Timing's role), else the whole process's."""
    from otel_rl._internal.tree import TreeNode, WorkerInfo

    component = contribution.get("component")
    path = list(contribution["path"])
    if component:
        inner = node.children.get(str(component.get("name")))
        if inner is not None:
            node = TreeNode(str(component.get("role") or role))
            node.children = inner.children
            return WorkerInfo(node.name, int(component.get("index") or 0), pid,
                              [*path, str(component.get("name"))], node)
    return WorkerInfo(role, index, pid, path, node)


def build(*, local: list[Contribution], snapshots: Iterable[Snapshot], root_total: float,
          gauges: dict[str, GaugeDict], metadata: dict[str, str],
          places: list[list[object]] | None = None,
          main: MainWorker | None = None, notes: list[str] | None = None) -> TimersDict:
    """The timers.json dict of the whole run (the tree model's `Tree.to_dict`)."""
    from otel_rl._internal import places as placements
    from otel_rl._internal.tree import Tree

    all_gauges = {name: g.copy() for name, g in gauges.items()}
    tree = Tree()
    snaps = [snap for top in snapshots for snap in _flatten(top)]
    where = placements.decode([places or [], *(snap.get("placements") or [] for snap in snaps)])
    for contribution in local:
        node = _place(tree, contribution, where)
        pid = int(contribution.get("pid") or 0)
        if contribution.get("component"):  # a thread of this process running a component
            tree.workers.append(_worker(contribution, node, "worker", 0, pid))
        elif main and (pid, contribution.get("tid")) == (main["pid"], main["tid"]):
            tree.workers.append(_worker(contribution, node, main["role"], main["index"], pid))
    for snap in snaps:
        for contribution in snap.get("contributions") or ():
            node = _place(tree, contribution, where)
            tree.workers.append(_worker(contribution, node, snap.get("role") or "worker",
                                        int(snap.get("index") or 0), int(snap.get("pid") or 0)))
        for name, gauge in (snap.get("gauges") or {}).items():
            merge_gauge(all_gauges, name, gauge)
    died = [str(snap["died"]) for snap in snaps if snap.get("died")]
    if died:  # a worker that died: its last blocks are missing (see `ledger_hooks`)
        tree.complete = False
        tree.notes = died
    tree.root.total, tree.root.count = root_total, 1
    tree.gauges = {name: Gauge.from_dict(g) for name, g in all_gauges.items()}
    tree.metadata = dict(metadata)
    if notes:
        tree.complete = False
        tree.notes = [*tree.notes, *notes]
    return tree.to_dict()
