"""The whole-run tree: every thread's and worker process's blocks, under the block that
started them, as ML-Agents' timers.json schema (plus a ``workers`` list for per-worker views).

A process describes what it recorded as *contributions*: (path of the starting block,
parallel flag, subtree). Workers send theirs to the parent as snapshots (cumulative, so the
latest one replaces the previous, and a worker killed mid-run loses only its last interval).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from otel_rl._internal.recorder import (
    GaugeNode,
    TimerNode,
    TimerStack,
    merge_into,
    stack_contribution,
)


def node_to_dict(node: TimerNode) -> dict[str, Any]:
    """ML-Agents' node schema: total, count, is_parallel (when set), self, children."""
    res: dict[str, Any] = {"total": node.total, "count": node.count}
    if node.is_parallel:
        res["is_parallel"] = True
    children = {name: node_to_dict(child) for name, child in node.children.items()}
    res["self"] = max(0.0, node.total - sum(c["total"] for c in children.values()))
    if children:
        res["children"] = children
    return res


def node_from_dict(data: dict[str, Any], name: str = "root") -> TimerNode:
    node = TimerNode(name)
    node.total = float(data.get("total", 0.0))
    node.count = int(data.get("count", 0))
    node.is_parallel = bool(data.get("is_parallel", False))
    for child_name, child in (data.get("children") or {}).items():
        node.children[child_name] = node_from_dict(child, child_name)
    return node


def _gauge_dict(gauge: GaugeNode, count: int) -> dict[str, Any]:
    return {"value": gauge.value, "min": gauge.min_value, "max": gauge.max_value,
            "count": count, "ts": gauge._timestamp}


def stack_gauges(stacks: Iterable[TimerStack]) -> dict[str, dict[str, Any]]:
    """Gauges set in these stacks, without what `merge_gauges` copied between them."""
    result: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()
    for st in stacks:
        for source, merged in ((st.retired_gauges, {}), (st.gauges, st.merged_gauge_counts)):
            for name, gauge in list(source.items()):
                if id(gauge) in seen:
                    continue  # merge_gauges shares GaugeNode objects between stacks
                seen.add(id(gauge))
                count = gauge.count - merged.get(name, 0)
                if count <= 0:
                    continue
                merge_gauge(result, name, _gauge_dict(gauge, count))
    return result


def merge_gauge(into: dict[str, dict[str, Any]], name: str, gauge: dict[str, Any]) -> None:
    mine = into.get(name)
    if mine is None:
        into[name] = dict(gauge)
        return
    if mine.get("ts", 0) < gauge.get("ts", 0):
        mine["value"], mine["ts"] = gauge["value"], gauge.get("ts", 0)
    mine["min"] = min(mine["min"], gauge["min"])
    mine["max"] = max(mine["max"], gauge["max"])
    mine["count"] += gauge["count"]


def contributions(stacks: Iterable[TimerStack], default_base: Any) -> list[dict[str, Any]]:
    """What each stack recorded, placed under the block that started it."""
    result = []
    for st in stacks:
        node = stack_contribution(st)
        if not node.children:
            continue
        base = st.base or default_base
        path = list(base.path) if base is not None else []
        parallel = base is not None and (base.pid, base.tid) != (st.pid, st.tid)
        result.append({"path": path, "parallel": parallel, "tree": node_to_dict(node),
                       "pid": st.pid, "tid": st.tid})
    return result


def _walk(root: TimerNode, path: Iterable[str]) -> TimerNode:
    node = root
    for name in path:
        node = node.get_child(name)
    return node


def _flatten(snapshot: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield snapshot
    for child in snapshot.get("children") or ():
        yield from _flatten(child)


def build(*, local: list[dict[str, Any]], snapshots: Iterable[dict[str, Any]], root_total: float,
          gauges: dict[str, dict[str, Any]], metadata: dict[str, str]) -> dict[str, Any]:
    """The timers.json dict of the whole run."""
    root = TimerNode("root")
    all_gauges = {name: dict(g) for name, g in gauges.items()}
    workers = []
    for contribution in local:
        node = node_from_dict(contribution["tree"])
        merge_into(_walk(root, contribution["path"]), node, contribution["parallel"])
    for top in snapshots:
        for snap in _flatten(top):
            for contribution in snap.get("contributions") or ():
                node = node_from_dict(contribution["tree"])
                merge_into(_walk(root, contribution["path"]), node, contribution["parallel"])
                workers.append({"role": snap.get("role") or "worker",
                                "index": int(snap.get("index") or 0),
                                "pid": int(snap.get("pid") or 0),
                                "path": list(contribution["path"]), "tree": contribution["tree"]})
            for name, gauge in (snap.get("gauges") or {}).items():
                merge_gauge(all_gauges, name, gauge)
    root.total = root_total
    root.count = 1
    res: dict[str, Any] = {"name": "root"}
    if all_gauges:
        res["gauges"] = {name: {k: g[k] for k in ("value", "min", "max", "count")}
                         for name, g in all_gauges.items()}
    meta = dict(metadata)
    meta["end_time_seconds"] = str(int(time.time()))
    res["metadata"] = meta
    res.update(node_to_dict(root))
    if workers:
        res["workers"] = workers
    return res
