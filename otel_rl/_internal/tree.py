"""The one tree model, which is also the ``timers.json`` format.

A `Tree` is what ML-Agents' ``get_timer_tree()`` returns, as objects: a root `TreeNode` with
named children (total seconds, count, ``is_parallel``), gauges and metadata, plus two otel_rl
extensions — the worker subtrees (for the cross-worker report) and whether the tree is
complete. `Tree.to_dict` writes ML-Agents' schema with ML-Agents' key order, so a file written
here is read by anything that reads ML-Agents' ``timers.json``; `Tree.from_dict` reads both.

Example::

    tree = Tree()
    tree.root.child("advance").add(0.5)
    tree.to_dict()
    # {'name': 'root', 'total': 0.0, 'count': 0, 'self': 0.0,
    #  'children': {'advance': {'total': 0.5, 'count': 1, 'self': 0.5}}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from otel_rl._internal.errors import UserError, one_line
from otel_rl._internal.node import Gauge, TreeNode
from otel_rl._internal.shapes import TimersDict, WorkerDict

__all__ = ["Gauge", "Tree", "TreeNode", "WorkerInfo"]


@dataclass(slots=True)
class WorkerInfo:
    """One worker process's own subtree, for the cross-worker report.

    `path` names the blocks from the root (exclusive) to the block that started the worker;
    the worker's blocks are the children of `node`, whose own total is 0.
    """

    role: str
    index: int
    pid: int
    path: list[str]
    node: TreeNode

    def to_dict(self) -> WorkerDict:
        return {
            "role": self.role,
            "index": self.index,
            "pid": self.pid,
            "path": list(self.path),
            "tree": self.node.to_dict(),
        }


@dataclass
class Tree:
    """A whole run's timer tree, gauges and metadata; see the module docstring."""

    root: TreeNode = field(default_factory=lambda: TreeNode("root"))
    gauges: dict[str, Gauge] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    workers: list[WorkerInfo] = field(default_factory=list)
    #: False when built from a partial or sampled span set; `notes` say why.
    complete: bool = True
    notes: list[str] = field(default_factory=list)

    def has_gpu(self) -> bool:
        """Whether any block has GPU time (the reports show GPU columns only then)."""
        nodes = [self.root, *(w.node for w in self.workers)]
        return any(n.gpu_count for node in nodes for n in (node, *(c for _, c in node.walk())))

    def find(self, path: Sequence[str]) -> TreeNode | None:
        """The node at `path` (names from the root, exclusive), or None. ``()`` is the root."""
        node = self.root
        for name in path:
            found = node.children.get(name)
            if found is None:
                return None
            node = found
        return node

    def node_at(self, path: Sequence[str]) -> TreeNode:
        """The node at `path`, created (empty) along the way where missing."""
        node = self.root
        for name in path:
            node = node.child(name)
        return node

    def merge(
        self, other: Tree | TreeNode, path: Sequence[str] = (), is_parallel: bool = True
    ) -> None:
        """Merge `other` into the node at `path` with ML-Agents' ``TimerNode.merge`` semantics.

        For a `Tree`, its gauges (its values taken as the later ones), missing metadata keys,
        workers and incompleteness notes are merged too.
        """
        if isinstance(other, TreeNode):
            self.node_at(path).merge(other, is_parallel=is_parallel)
            return
        self.node_at(path).merge(other.root, is_parallel=is_parallel)
        for name, gauge in other.gauges.items():
            mine = self.gauges.get(name)
            if mine is None:
                self.gauges[name] = gauge.copy()
            else:
                mine.merge(gauge)
        for key, value in other.metadata.items():
            self.metadata.setdefault(key, value)
        prefix = list(path)
        for worker in other.workers:
            self.workers.append(
                WorkerInfo(
                    worker.role, worker.index, worker.pid, prefix + worker.path, worker.node.copy()
                )
            )
        if not other.complete:
            self.complete = False
        self.notes.extend(note for note in other.notes if note not in self.notes)

    # -- timers.json ---------------------------------------------------------------------

    def to_dict(self) -> TimersDict:
        """ML-Agents' ``get_timer_tree()`` dict, in its key order, plus otel_rl's extensions.

        ``workers`` is added when there are workers; ``complete``/``notes`` only when the tree
        is incomplete, so a complete tree is exactly ML-Agents' schema.
        """
        res: TimersDict = {"name": self.root.name}
        if self.gauges:
            res["gauges"] = {name: gauge.to_dict() for name, gauge in self.gauges.items()}
        if self.metadata:
            res["metadata"] = dict(self.metadata)
        res.update(cast(TimersDict, self.root.to_dict()))  # a node's keys are a document's
        if self.workers:
            res["workers"] = [worker.to_dict() for worker in self.workers]
        if not self.complete:
            res["complete"] = False
            res["notes"] = list(self.notes)
        return res

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict` as strict JSON text (the ``timers.json`` file's content)."""
        from otel_rl._internal.jsonout import dumps

        return dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: object) -> Tree:
        """Read a ``get_timer_tree()``-style dict.

        Raises `UserError` with a one-line reason naming the offending path (e.g.
        ``root.children.advance: 'count' must be an integer``). Unknown keys are ignored and
        optional ones default, so files from newer versions still read.
        """
        if not isinstance(data, dict):
            raise UserError(f"root: expected a JSON object, got {_type_name(data)}")
        name = data.get("name", "root")
        if not isinstance(name, str):
            raise UserError("root: 'name' must be a string")
        tree = cls(root=_node_from_dict(data, name, "root"))
        tree.gauges = _gauges_from_dict(data.get("gauges", {}))
        tree.metadata = _metadata_from_dict(data.get("metadata", {}))
        tree.workers = _workers_from_dict(data.get("workers", []))
        complete = data.get("complete", True)
        if not isinstance(complete, bool):
            raise UserError("root: 'complete' must be true or false")
        notes = data.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise UserError("root: 'notes' must be a list of strings")
        tree.complete = complete
        tree.notes = list(notes)
        return tree

    @classmethod
    def from_json(cls, text: str | bytes) -> Tree:
        """Read ``timers.json`` text; malformed JSON or schema is a `UserError`.

        The text goes through the input boundary's strict, deep-safe JSON parser
        (`strictjson`).
        """
        from otel_rl._internal.strictjson import decode_text, parse_json

        if isinstance(text, bytes):
            text = decode_text(text, "not a timers.json")
        try:
            data = parse_json(text, "timers.json")
        except UserError as exc:
            reason = str(exc).partition(": ")[2]
            raise UserError(f"not a timers.json: {one_line(reason)}") from None
        return cls.from_dict(data)


# -- reading helpers ---------------------------------------------------------------------


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but `true` is not a duration.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Where a node is in a document: (the parent's location, "children" key) or a plain string.
_Where = tuple[Any, str] | str


def _where_text(where: _Where) -> str:
    """A node's location for a message: ``root.children.a.children.b``, elided when deep."""
    names: list[str] = []
    while isinstance(where, tuple):
        where, name = where
        names.append(name)
    names.reverse()
    if len(names) > 6:
        names = [*names[:2], f"…({len(names) - 4:,} levels)…", *names[-2:]]
    shown = [n if len(n) <= 30 else n[:29] + "…" for n in names]
    return where + "".join(f".children.{n}" for n in shown)


def _node_from_dict(data: Any, name: str, where: str) -> TreeNode:
    """The node (and everything below it) that `data` describes, read with an explicit
    stack: a timers.json can nest thousands of levels."""
    top, children_data = _node_fields(data, name, where)
    todo: list[tuple[TreeNode, dict[str, Any], _Where]] = [(top, children_data, where)]
    while todo:
        node, children_data, location = todo.pop()
        for child_name, child_data in children_data.items():
            child_where = (location, child_name)
            child, grandchildren = _node_fields(child_data, child_name, child_where)
            node.children[child_name] = child
            todo.append((child, grandchildren, child_where))
    return top


def _node_fields(data: Any, name: str, location: _Where) -> tuple[TreeNode, dict[str, Any]]:
    """One node's own fields (children not yet read), and its children's data."""
    where = _where_text(location)
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected an object, got {_type_name(data)}")
    total: Any = data.get("total")
    if not _is_number(total):
        raise UserError(f"{where}: 'total' must be a number")
    if not math.isfinite(total) or total < 0:
        raise UserError(f"{where}: 'total' must be a finite, non-negative number")
    count: Any = data.get("count")
    if not _is_int(count):
        raise UserError(f"{where}: 'count' must be an integer")
    if count < 0:
        raise UserError(f"{where}: 'count' must not be negative")
    is_parallel = data.get("is_parallel", False)
    if not isinstance(is_parallel, bool):
        raise UserError(f"{where}: 'is_parallel' must be true or false")
    children_data = data.get("children", {})
    if not isinstance(children_data, dict):
        raise UserError(f"{where}.children: expected an object, got {_type_name(children_data)}")
    gpu_total: Any = data.get("gpu_total", 0.0)
    gpu_count: Any = data.get("gpu_count", 1 if "gpu_total" in data else 0)
    if not _is_number(gpu_total) or not math.isfinite(gpu_total) or gpu_total < 0:
        raise UserError(f"{where}: 'gpu_total' must be a finite, non-negative number")
    if not _is_int(gpu_count) or gpu_count < 0:
        raise UserError(f"{where}: 'gpu_count' must be a non-negative integer")
    # "self" is derived; it is recomputed, not trusted.
    node = TreeNode(name, float(total), count, is_parallel, None, float(gpu_total), gpu_count)
    return node, children_data


def _gauges_from_dict(data: Any) -> dict[str, Gauge]:
    if not isinstance(data, dict):
        raise UserError(f"root.gauges: expected an object, got {_type_name(data)}")
    gauges: dict[str, Gauge] = {}
    for name, gauge in data.items():
        where = f"root.gauges.{name}"
        if not isinstance(gauge, dict):
            raise UserError(f"{where}: expected an object, got {_type_name(gauge)}")
        value: Any = gauge.get("value")
        if not _is_number(value):
            raise UserError(f"{where}: 'value' must be a number")
        low: Any = gauge.get("min", value)
        high: Any = gauge.get("max", value)
        count: Any = gauge.get("count", 1)
        if not _is_number(low) or not _is_number(high):
            raise UserError(f"{where}: 'min' and 'max' must be numbers")
        if not _is_int(count):
            raise UserError(f"{where}: 'count' must be an integer")
        gauges[name] = Gauge(value, low, high, count)
    return gauges


def _metadata_from_dict(data: Any) -> dict[str, str]:
    if not isinstance(data, dict):
        raise UserError(f"root.metadata: expected an object, got {_type_name(data)}")
    for key, value in data.items():
        if isinstance(value, (dict, list)):
            raise UserError(f"root.metadata.{key}: expected a string, got {_type_name(value)}")
    # ML-Agents writes strings; scalars from other writers are kept as their text.
    return {
        key: value if isinstance(value, str) else json.dumps(value) for key, value in data.items()
    }


def _workers_from_dict(data: Any) -> list[WorkerInfo]:
    if not isinstance(data, list):
        raise UserError(f"root.workers: expected a list, got {_type_name(data)}")
    workers = []
    for i, item in enumerate(data):
        where = f"root.workers[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"{where}: expected an object, got {_type_name(item)}")
        role = item.get("role", "")
        index = item.get("index", 0)
        pid = item.get("pid", 0)
        path = item.get("path", [])
        if not isinstance(role, str):
            raise UserError(f"{where}: 'role' must be a string")
        if not _is_int(index) or not _is_int(pid):
            raise UserError(f"{where}: 'index' and 'pid' must be integers")
        if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
            raise UserError(f"{where}: 'path' must be a list of strings")
        node = _node_from_dict(item.get("tree"), role or "worker", f"{where}.tree")
        workers.append(WorkerInfo(role, index, pid, list(path), node))
    return workers
