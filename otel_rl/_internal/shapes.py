"""The data shapes that cross otel_rl's module seams, as types (a leaf: imports nothing).

- *Attributes*: what a span or resource attribute may hold (OTel's AnyValue subset we write).
- The whole-run tree's wire format (`NodeDict`, `GaugeDict`, `Contribution`, `Snapshot`): what
  a process describes of its own blocks, sent from workers to the parent over the relay and
  kept in aggregate spans. It is JSON: what comes back from ``json.loads`` is trusted to have
  this shape only because otel_rl itself wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing import NotRequired  # 3.11+; annotations here are strings, so 3.10 never needs it

    from otel_rl._internal.node import TreeNode

Scalar = str | bool | int | float
AttributeValue = Scalar | Sequence[Scalar]
Attributes = Mapping[str, AttributeValue]


class NodeDict(TypedDict, total=False):
    """One node of timers.json (ML-Agents' schema, plus otel_rl's GPU keys)."""

    total: float
    count: int
    is_parallel: bool
    self: float
    children: dict[str, NodeDict]
    gpu_total: float
    gpu_count: int


class GaugeDict(TypedDict, total=False):
    """A gauge: latest value, range, number of updates, and when it was last set (`ts`)."""

    value: float
    min: float
    max: float
    count: int
    ts: float


class WorkerDict(TypedDict):
    """One worker process's own subtree in timers.json's ``workers`` (otel_rl's extension)."""

    role: str
    index: int
    pid: int
    path: list[str]
    tree: NodeDict


class TimersDict(NodeDict, total=False):
    """A whole timers.json: ML-Agents' ``get_timer_tree()`` document, plus otel_rl's
    ``workers`` and, on a tree rebuilt from a partial span set, ``complete``/``notes``."""

    name: str
    gauges: dict[str, GaugeDict]
    metadata: dict[str, str]
    workers: list[WorkerDict]
    complete: bool
    notes: list[str]


class ComponentDict(TypedDict, total=False):
    name: str
    role: str
    index: int


class Contribution(TypedDict, total=False):
    """What one stack recorded, and where it goes in the whole-run tree. In the process that
    made it, `tree` is the stack's snapshot node itself (no dict on the way to the process's
    own timers.json); written out (relay, aggregate spans) it is the node's dict
    (`node.json_default`)."""

    path: list[str]
    parallel: bool
    tree: NodeDict | TreeNode
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


#: An open block, for continuation spans: (pid, span id, parent span id, name, start ns, tid).
OpenBlockInfo = tuple[int, int, int, str, int, int]
