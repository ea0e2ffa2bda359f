"""The one tree node: a timed block's totals and children.

A leaf module (no dataclasses, nothing heavy): the hot path's `recorder.TimerNode` builds on
it, so worker processes import it at start-up.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from otel_rl._internal import semconv
from otel_rl._internal.shapes import AttributeValue, GaugeDict, NodeDict

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Gauge", "TreeNode", "json_default"]


class TreeNode:
    """One timed block: total seconds over all its runs, how many runs, and its children.

    Children are keyed by name in first-seen order, as ML-Agents keeps them. `gpu_total` is
    the GPU seconds of the `gpu_count` runs whose GPU time was measured (blocks opted in to
    GPU timing; 0 runs otherwise). The recorder's `TimerNode` is this node with ML-Agents'
    API on top, so a live stack's nodes and a tree read from a file are one type.
    """

    __slots__ = ("children", "count", "gpu_count", "gpu_total", "is_parallel", "name", "total")

    def __init__(
        self,
        name: str,
        total: float = 0.0,
        count: int = 0,
        is_parallel: bool = False,
        children: dict[str, Self] | None = None,
        gpu_total: float = 0.0,
        gpu_count: int = 0,
    ) -> None:
        self.name = name
        self.total = total
        self.count = count
        self.is_parallel = is_parallel
        self.children: dict[str, Self] = {} if children is None else children
        self.gpu_total = gpu_total
        self.gpu_count = gpu_count

    @property
    def self_time(self) -> float:
        """Seconds spent in this block outside its children (never negative)."""
        # Summed left to right from 0.0, as ML-Agents does, so floats match bit for bit.
        child_total = 0.0
        for child in self.children.values():
            child_total += child.total
        return max(0.0, self.total - child_total)

    def child(self, name: str) -> Self:
        """The child called `name`, created empty (of this node's type) if it does not exist."""
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = type(self)(name)
        return node

    def add(self, seconds: float, count: int = 1) -> None:
        """Account `count` runs that took `seconds` in total."""
        self.total += seconds
        self.count += count

    def merge(self, other: TreeNode, is_parallel: bool = True) -> None:
        """Add `other`'s totals and counts into this node and, recursively, its children.

        ML-Agents' ``TimerNode.merge``: ``is_parallel`` is OR-ed into this node and every
        node merged below it.
        """
        # An explicit stack, here and in the other whole-subtree methods: trees can be
        # thousands of levels deep (recursive code), deeper than Python's recursion limit.
        todo = [(self, other)]
        while todo:
            mine, theirs = todo.pop()
            mine.total += theirs.total
            mine.count += theirs.count
            mine.gpu_total += theirs.gpu_total
            mine.gpu_count += theirs.gpu_count
            mine.is_parallel |= is_parallel
            todo.extend((mine.child(name), child) for name, child in theirs.children.items())

    def merge_children(self, source: TreeNode, is_parallel: bool = False) -> None:
        """Merge `source`'s children into this node's (not `source`'s own totals): a
        subtree placed under this node. Always `TreeNode.merge`'s plain sum, also on a
        subclass whose `merge` means something else (ML-Agents' `TimerNode.merge` counts
        what it adds as merged in)."""
        for name, child in source.children.items():
            TreeNode.merge(self.child(name), child, is_parallel)

    def subtract_children(self, source: TreeNode) -> None:
        """Take `source`'s children's totals and counts out of this node's, all the way
        down (never below zero); a node left with no runs and no children goes."""
        pairs: list[tuple[TreeNode, TreeNode, TreeNode]] = []  # (parent, node, to take out)
        todo: list[tuple[TreeNode, TreeNode]] = [(self, source)]
        while todo:
            into, src_parent = todo.pop()
            for name, src in src_parent.children.items():
                node = into.children.get(name)
                if node is not None:
                    pairs.append((into, node, src))
                    todo.append((node, src))
        # Deepest first, so a node is removed only once its own children are settled.
        for parent, node, src in reversed(pairs):
            node.total = max(0.0, node.total - src.total)
            node.count = max(0, node.count - src.count)
            node.gpu_total = max(0.0, node.gpu_total - src.gpu_total)
            node.gpu_count = max(0, node.gpu_count - src.gpu_count)
            if node.count == 0 and not node.children:
                del parent.children[node.name]

    def lifted(self, path: Sequence[str]) -> Self:
        """A new root holding this root's blocks with those under `path` moved up to it:
        what was recorded inside the blocks of `path` (open when a child process forked)
        hangs at the root, and so does what was recorded outside them (a plain `os.fork()`
        child returning from them). Takes the `path` blocks out of this tree."""
        result = type(self)("root")
        node: TreeNode = self
        for name in path:
            inner = node.children.pop(name, None)
            result.merge_children(node)
            if inner is None:
                return result
            node = inner
        result.merge_children(node)
        return result

    def walk(self, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], TreeNode]]:
        """Yield ``(path, node)`` for every node below this one, depth first, in order."""
        stack = [(path, iter(self.children.items()))]
        while stack:
            parent_path, children = stack[-1]
            for name, child in children:
                child_path = (*parent_path, name)
                yield child_path, child
                stack.append((child_path, iter(child.children.items())))
                break
            else:
                stack.pop()

    def copy(self) -> TreeNode:
        """A deep copy."""
        top = self._copy_own()
        todo = [(self, top)]
        while todo:
            source, target = todo.pop()
            for name, child in source.children.items():
                copied = target.children[name] = child._copy_own()
                todo.append((child, copied))
        return top

    def _copy_own(self) -> TreeNode:
        return TreeNode(
            self.name,
            self.total,
            self.count,
            self.is_parallel,
            None,
            self.gpu_total,
            self.gpu_count,
        )

    def to_dict(self, gpu: bool = True) -> NodeDict:
        """This node in ML-Agents' schema (no ``name``: the name is the key in the parent);
        with `gpu`, ``gpu_total``/``gpu_count`` on nodes with GPU time (otel_rl's extension)."""
        top = self._own_dict(gpu)
        todo = [(self, top)]
        while todo:
            node, out = todo.pop()
            if node.children:
                children: dict[str, NodeDict] = {}
                out["children"] = children
                for name, child in node.children.items():
                    child_dict = children[name] = child._own_dict(gpu)
                    todo.append((child, child_dict))
        return top

    def _own_dict(self, gpu: bool) -> NodeDict:
        res: NodeDict = {"total": self.total, "count": self.count}
        if self.is_parallel:
            res["is_parallel"] = True
        res["self"] = self.self_time
        if gpu and self.gpu_count:
            res["gpu_total"] = self.gpu_total
            res["gpu_count"] = self.gpu_count
        return res

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TreeNode):
            return NotImplemented
        todo = [(self, other)]
        while todo:
            a, b = todo.pop()
            if (
                a.name != b.name
                or a.total != b.total
                or a.count != b.count
                or a.is_parallel != b.is_parallel
                or a.gpu_total != b.gpu_total
                or a.gpu_count != b.gpu_count
                or a.children.keys() != b.children.keys()
            ):
                return False
            todo.extend((child, b.children[name]) for name, child in a.children.items())
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"TreeNode({self.name!r}, total={self.total!r}, count={self.count!r}, "
            f"is_parallel={self.is_parallel!r}, children={list(self.children)!r})"
        )



class Gauge:
    """A gauge as ML-Agents keeps it: the latest value, the range seen, how many values, and
    when the latest was set (`ts`, seconds since the epoch; 0 when unknown).

    `merge` is otel_rl's one rule for folding gauges together (workers into the run, trees
    into trees, run and process spans into a rebuilt tree). ML-Agents' own
    ``GaugeNode.merge`` stays as ML-Agents wrote it, for code that calls it.
    """

    __slots__ = ("count", "max", "min", "ts", "value")

    def __init__(self, value: float, min: float, max: float, count: int = 1,
                 ts: float = 0.0) -> None:
        self.value = value
        self.min = min
        self.max = max
        self.count = count
        self.ts = ts

    def merge(self, other: Gauge) -> None:
        """Fold `other` in: the later value wins (by `ts`; on a tie, `other`, merged in
        later), min of the minima, max of the maxima, counts add."""
        if other.ts >= self.ts:
            self.value, self.ts = other.value, other.ts
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.count += other.count

    def copy(self) -> Gauge:
        return Gauge(self.value, self.min, self.max, self.count, self.ts)

    def to_dict(self, ts: bool = False) -> GaugeDict:
        """As timers.json writes it; with `ts`, as workers send it (the wire format)."""
        res: GaugeDict = {"value": self.value, "min": self.min, "max": self.max,
                          "count": self.count}
        if ts:
            res["ts"] = self.ts
        return res

    @classmethod
    def from_dict(cls, data: GaugeDict) -> Gauge:
        """From the wire format (trusted: otel_rl wrote it)."""
        value = data["value"]
        return cls(value, data.get("min", value), data.get("max", value), data.get("count", 1),
                   data.get("ts", 0.0))

    #: A gauge's fields as span attributes, ``otel_rl.gauge.<name>.<field>``.
    FIELDS = ("value", "min", "max", "count")

    def to_attributes(self, name: str) -> dict[str, AttributeValue]:
        """Gauge `name` as run/process/aggregate span attributes (`from_attributes` reads
        them back): ``otel_rl.gauge.<name>.value|min|max|count``."""
        prefix = f"{semconv.GAUGE_PREFIX}{name}."
        return {prefix + "value": self.value, prefix + "min": self.min,
                prefix + "max": self.max, prefix + "count": self.count}

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, object]) -> dict[str, Gauge]:
        """The gauges a span's attributes hold (`to_attributes`); a gauge without a numeric
        value is left out, a missing or bad count is 1."""
        fields: dict[str, dict[str, object]] = {}
        for key, value in attributes.items():
            if key.startswith(semconv.GAUGE_PREFIX):
                name, _, part = key[len(semconv.GAUGE_PREFIX):].rpartition(".")
                if name and part in cls.FIELDS:
                    fields.setdefault(name, {})[part] = value
        gauges = {}
        for name, parts in fields.items():
            value = parts.get("value")
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            try:
                count = int(parts.get("count", 1))  # type: ignore[call-overload]
            except (TypeError, ValueError):
                count = 1
            gauges[name] = cls(value, parts.get("min", value), parts.get("max", value),  # type: ignore[arg-type]
                               count)
        return gauges

    def __eq__(self, other: object) -> bool:
        # `ts` is bookkeeping for merging: the same gauge read from a file or rebuilt from
        # spans compares equal.
        if not isinstance(other, Gauge):
            return NotImplemented
        return (self.value, self.min, self.max, self.count) == (
            other.value, other.min, other.max, other.count)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (f"Gauge(value={self.value!r}, min={self.min!r}, max={self.max!r}, "
                f"count={self.count!r})")

def json_default(value: object) -> NodeDict:
    """``json.dumps(..., default=json_default)``: a node as its timers.json dict, so payloads
    that hold nodes in process (whole-run contributions) are written as the wire format."""
    if isinstance(value, TreeNode):
        return value.to_dict(gpu=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
