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
from typing import TYPE_CHECKING, TypedDict

from otel_rl._internal.node import Gauge, TreeNode
from otel_rl._internal.shapes import GaugeDict

if TYPE_CHECKING:
    from typing import NotRequired  # 3.11+; annotations here are strings, so 3.10 never needs it

    # Imported where used: only the main process's shutdown builds a Tree, and the tree model
    # (dataclasses) would cost every worker milliseconds of start-up.
    from otel_rl._internal.tree import Tree, WorkerInfo


# --- What the whole-run tree is made from ------------------------------------------------------
class ComponentDict(TypedDict, total=False):
    name: str
    role: str
    index: int


class Contribution(TypedDict, total=False):
    """What one stack recorded, and where it goes in the whole-run tree. `tree` is a node in
    every process: the stack's snapshot node where it was made, the node read back where it
    arrived (`received`); written out (relay, aggregate spans) it is the node's `NodeDict`
    (`node.json_default`), the one wire form."""

    path: list[str]
    parallel: bool
    tree: TreeNode
    pid: int
    tid: int
    component: ComponentDict


class Snapshot(TypedDict, total=False):
    """A worker process's cumulative description of itself (and of its own workers)."""

    pid: int
    role: str
    index: int
    contributions: list[Contribution]
    gauges: dict[str, GaugeDict]
    dropped: int
    placements: list[list[object]]
    #: For the parent's windows (`auto`): blocks open now, as [span id, parent span id, name,
    #: start ns, thread id], and the span ids this process's threads hang under.
    open: list[list[object]]
    bases: list[int]
    #: Training scalars (`metrics.record_scalar`): [category, tag, value, step, time ns].
    scalars: list[list[object]]
    children: list[Snapshot]
    #: For the parent's ledger (`ledger_hooks`): records recorded so far, whether this is the
    #: worker's last snapshot, and (set by the parent) why a worker that died is partial.
    recorded: int
    final: bool
    died: str
    #: The worker's shared record count (`tallyfile`), read by the parent if it is killed.
    tally: str
    #: Records this worker counted lost because one of its own workers died.
    killed: int


class MainWorker(TypedDict):
    """The run's own thread as a ``workers`` entry (a named Sample Factory Timing's role)."""

    role: str
    index: int
    pid: int
    tid: int


class TreeInputs(TypedDict):
    """What the main process makes the whole-run timers.json from (`wholerun.build`'s
    arguments; also the payload of its aggregate spans)."""

    local: list[Contribution]
    snapshots: list[Snapshot]
    root_total: float
    gauges: dict[str, GaugeDict]
    metadata: dict[str, str]
    places: list[list[object]]
    main: MainWorker | None
    #: What the tree lacks (workers that ended without delivering): marks it incomplete.
    notes: NotRequired[list[str]]



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


def received_contributions(contributions: Iterable[Contribution]) -> None:
    """Contributions as read from the wire (JSON): each `tree`, a `NodeDict` there, becomes
    its node, read by `Tree.from_dict` (which checks it: a bad one raises `UserError`). In
    place, once, where the JSON is read: the relay, the Ray driver's mailbox, an aggregate span."""
    from otel_rl._internal.tree import Tree

    for contribution in contributions:
        wire: object = contribution["tree"]
        contribution["tree"] = Tree.from_dict(wire).root


def received(snapshot: Snapshot) -> Snapshot:
    """`snapshot` as read from the wire, its (and its children's) contributions' trees read
    into nodes (`received_contributions`); returns it."""
    for snap in _flatten(snapshot):
        received_contributions(snap.get("contributions") or ())
    return snapshot


def _place(tree: Tree, contribution: Contribution,
           places: dict[tuple[int, int], tuple[str, ...]]) -> TreeNode:
    """Merge a contribution's blocks under the block that started them, or where the program
    merged that thread's tree itself (`placement`); returns its subtree. The contribution's
    path is updated to where it went."""
    node = contribution["tree"]
    parallel = contribution["parallel"]
    place = places.get((int(contribution.get("pid") or 0), int(contribution.get("tid") or 0)))
    if place is not None:
        contribution["path"], parallel = list(place), True
    tree.node_at(contribution["path"]).merge_children(node, parallel)
    return node


def _worker(contribution: Contribution, node: TreeNode, role: str, index: int,
            pid: int) -> WorkerInfo:
    """The cross-worker entry of a contribution: a component's blocks (below the component
    node, named by the Timing's role), else the whole process's."""
    from otel_rl._internal.tree import WorkerInfo

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
          main: MainWorker | None = None, notes: list[str] | None = None) -> Tree:
    """The whole run's tree (timers.json is its `Tree.to_dict`)."""
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
    return tree
