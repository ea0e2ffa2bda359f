"""Spans -> `Tree`: the ``timers.json`` tree rebuilt from spans of any source.

`build_tree` follows the numbered rules in docs/internals.md ("Tree from spans"):

1. A ``kind=run`` span is the root; several merge; with none, a synthetic root spans all spans.
2. ``kind=process`` spans are transparent; their gauges and metadata merge into the root's.
3. A block's node is its parent span's node's child named like the span. A trace root linked
   to a known span hangs under it; a span whose parent is missing hangs under the root and
   makes the tree incomplete, as do sampled iterations.
4. A span in another process or thread than its parent block starts a parallel branch.
5. total = summed durations, count = number of spans (``otel_rl.count`` on synthetic spans);
   gpu_total/gpu_count likewise from ``otel_rl.gpu.seconds`` (``otel_rl.gpu.count``).
6. Spans of worker processes are also gathered per worker into `Tree.workers`; a component
   span (a Sample Factory Timing in a worker, ``otel_rl.component.role``) starts a worker entry
   of that role holding the blocks below it.
7. A parallel branch whose thread the program merged into one of its own blocks
   (``otel_rl.placements`` on run/process spans, see `placement`) hangs under that block.

With aggregate spans present (``otel_rl.kind=aggregate``, see `aggregates`) the tree is built
from them instead — the exact timers.json, whatever the span policy kept. Window, continuation
and cut-short spans place their children but are not counted.

Spans are taken in start order, so children appear in the order they first ran (as in
ML-Agents) and float sums do not depend on the order the spans arrived in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_rl._internal import aggregates, places, semconv
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Gauge, Tree, TreeNode, WorkerInfo

__all__ = ["build_tree", "tree_from_aggregates"]

#: Spans that are not timed blocks of their own: no count in the tree.
_NOT_COUNTED = (semconv.CONTINUATION, semconv.CUT_SHORT)

_SpanKey = tuple[str, str]  # (trace_id, span_id)
_WorkerKey = tuple[str, int, int]  # (role, index, pid)
_Ident = tuple[Any, Any]  # (process.pid, thread.id); None = unknown


@dataclass(slots=True)
class _Info:
    """Where a span landed: its node and path, and what its children compare against."""

    node: TreeNode
    path: tuple[str, ...]
    ident: _Ident
    parallel: bool  # this block or an ancestor block runs in parallel to its parent
    worker: _WorkerKey | None = None
    worker_parallel: bool = False  # the same, counted from the worker's own first block
    scoped: bool = False  # `worker` is a component's: the blocks below it inherit it
    component: bool = False  # this span is the component itself, not one of its blocks


@dataclass
class _Worker:
    start_paths: list[tuple[str, ...]] = field(default_factory=list)
    blocks: list[tuple[SpanData, _Info]] = field(default_factory=list)


def build_tree(spans: Iterable[SpanData]) -> Tree:
    """Rebuild the timer tree from finished spans (see the module docstring for the rules).

    `spans` may carry ``notes`` (a `readers.SpanList`, e.g. Tempo returned part of a trace);
    they mark the tree incomplete. Duplicate spans (same trace and span id) count once.
    """
    notes: list[str] = list(getattr(spans, "notes", None) or [])
    by_key: dict[_SpanKey, SpanData] = {}
    collected = aggregates.Collected()
    for span in spans:
        by_key.setdefault((span.trace_id, span.span_id), span)
        if span.attributes.get(semconv.KIND) == semconv.KIND_AGGREGATE:
            collected.add(span.attributes)
    if collected:
        return tree_from_aggregates(collected, notes)
    ordered = sorted(by_key.values(), key=lambda s: (s.start_ns, s.end_ns, s.trace_id, s.span_id))
    builder = _Builder(by_key, ordered)
    tree = builder.build()
    tree.notes = notes + tree.notes
    tree.complete = not tree.notes
    return tree


def tree_from_aggregates(collected: aggregates.Collected, notes: list[str] | None = None) -> Tree:
    """The whole-run tree from the latest aggregate of each process (see `aggregates`)."""
    tree, more = aggregates.build(collected)
    tree.notes = list(notes or []) + tree.notes + more  # tree.notes: workers that died
    tree.complete = not tree.notes
    return tree


def _kind(span: SpanData) -> Any:
    return span.attributes.get(semconv.KIND)


def _ident(span: SpanData) -> _Ident:
    return span.resource.get(semconv.PROCESS_PID), span.attributes.get(semconv.THREAD_ID)


def _differs(own: _Ident, parent: _Ident) -> bool:
    # Unknown (missing) on either side is no evidence of a difference.
    own_pid, own_thread = own
    parent_pid, parent_thread = parent
    if own_pid is not None and parent_pid is not None and own_pid != parent_pid:
        return True
    return own_thread is not None and parent_thread is not None and own_thread != parent_thread


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _worker_key(span: SpanData) -> _WorkerKey | None:
    role = span.resource.get(semconv.WORKER_ROLE)
    if role is None:
        return None
    return (
        str(role),
        _int(span.resource.get(semconv.WORKER_INDEX), 0),
        _int(span.resource.get(semconv.PROCESS_PID), 0),
    )


def _add_gpu(node: TreeNode, span: SpanData) -> None:
    """The span's GPU time (a block opted in to GPU timing), if it has one."""
    seconds = span.attributes.get(semconv.GPU_SECONDS)
    if (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            and math.isfinite(seconds) and seconds >= 0):
        count = 1
        if span.attributes.get(semconv.SYNTHETIC) is True:
            count = _int(span.attributes.get(semconv.GPU_COUNT), 1)
        node.gpu_total += float(seconds)
        node.gpu_count += count


class _Builder:
    def __init__(self, by_key: dict[_SpanKey, SpanData], ordered: list[SpanData]) -> None:
        self.by_key = by_key
        self.ordered = ordered
        self.tree = Tree()
        self.run_spans = [s for s in ordered if _kind(s) == semconv.KIND_RUN]
        root_ident: _Ident = _ident(self.run_spans[0]) if self.run_spans else (None, None)
        self.root_info = _Info(self.tree.root, (), root_ident, False)
        self.infos: dict[_SpanKey, _Info] = {}
        self.missing: list[SpanData] = []  # placed under the root for want of a parent
        self.cycles = 0
        self.windows = 0
        self.workers: dict[_WorkerKey, _Worker] = {}
        self.places: dict[tuple[int, int], tuple[str, ...]] = {}
        # The run's own thread, when a named Timing gave it a role (`components.main_role`).
        self.main_worker: _WorkerKey | None = None

    def build(self) -> Tree:
        tree = self.tree
        if not self.ordered:
            tree.root.count = 0
            tree.notes.append("no spans: there is nothing to build a tree from")
            return tree
        self._root_and_attributes()
        for span in self.ordered:
            kind = _kind(span)
            if kind in (semconv.KIND_RUN, semconv.KIND_PROCESS, semconv.KIND_WINDOW):
                self.windows += kind == semconv.KIND_WINDOW
                continue
            info = self._resolve(span)
            attributes = span.attributes
            if attributes.get(_NOT_COUNTED[0]) is True or attributes.get(_NOT_COUNTED[1]) is True:
                continue  # placed (its children hang under it), not counted
            count = 1
            if span.attributes.get(semconv.SYNTHETIC) is True:
                count = _int(span.attributes.get(semconv.COUNT), 1)
            info.node.add(span.duration_s, count)
            _add_gpu(info.node, span)
            info.node.is_parallel |= info.parallel
            if info.worker is not None and not info.component:
                self.workers[info.worker].blocks.append((span, info))
        tree.workers = self._worker_infos()
        self._notes()
        return tree

    def _root_and_attributes(self) -> None:
        root = self.tree.root
        if self.run_spans:
            for span in self.run_spans:
                root.add(span.duration_s)
        else:
            start = min(s.start_ns for s in self.ordered)
            end = max(s.end_ns for s in self.ordered)
            root.add(max(0, end - start) / 1e9)
        processes = [s for s in self.ordered if _kind(s) == semconv.KIND_PROCESS]
        for span in self.run_spans[:1]:
            role = span.attributes.get(semconv.COMPONENT_ROLE)
            if role is not None:
                self.main_worker = (str(role), _int(span.attributes.get(semconv.COMPONENT_INDEX),
                                                    0), _int(_ident(span)[0], 0))
        self.places = places.decode(
            s.attributes[semconv.PLACEMENTS] for s in self.run_spans + processes
            if semconv.PLACEMENTS in s.attributes
        )
        # Gauges in end order: as in ML-Agents' GaugeNode.merge, the later value wins.
        for span in sorted(self.run_spans + processes, key=lambda s: s.end_ns):
            for name, gauge in Gauge.from_attributes(span.attributes).items():
                if name in self.tree.gauges:
                    self.tree.gauges[name].merge(gauge)
                else:
                    self.tree.gauges[name] = gauge
        # Metadata: the run's own keys win over what workers report.
        for span in self.run_spans + processes:
            for key, value in span.attributes.items():
                if key.startswith(semconv.METADATA_PREFIX):
                    self.tree.metadata.setdefault(key[len(semconv.METADATA_PREFIX) :], str(value))

    def _parent(self, span: SpanData) -> SpanData | None:
        """The span this one hangs under, or None for the root (noting a missing parent)."""
        if span.parent_span_id:
            parent = self.by_key.get((span.trace_id, span.parent_span_id))
            if parent is None:
                self.missing.append(span)
            return parent
        for link in span.links:
            linked = self.by_key.get(link)
            if linked is not None:
                return linked
        if span.attributes.get(semconv.SAMPLED) and span.links:
            self.missing.append(span)  # a sampled iteration whose run trace is not here
        return None

    def _resolve(self, span: SpanData) -> _Info:
        """The span's `_Info`, resolving its ancestors first (iteratively: traces are deep)."""
        chain: list[SpanData] = []
        on_chain: set[_SpanKey] = set()
        current: SpanData | None = span
        parent_info = self.root_info
        while current is not None:
            key = (current.trace_id, current.span_id)
            known = self.infos.get(key)
            if known is not None:
                parent_info = known
                break
            if key in on_chain:  # corrupt data: a parent cycle; cut it at the root
                self.cycles += 1
                break
            chain.append(current)
            on_chain.add(key)
            top = _kind(current) in (semconv.KIND_RUN, semconv.KIND_WINDOW)
            current = None if top else self._parent(current)
        for item in reversed(chain):
            parent_info = self._place(item, parent_info)
            self.infos[(item.trace_id, item.span_id)] = parent_info
        return parent_info

    def _place(self, span: SpanData, parent: _Info) -> _Info:
        kind = _kind(span)
        if kind == semconv.KIND_RUN:
            return _Info(self.tree.root, (), _ident(span), False)
        if kind == semconv.KIND_WINDOW:  # a window of the run: the root, seen from its trace
            return _Info(self.tree.root, (), self.root_info.ident, False)
        if kind == semconv.KIND_PROCESS:
            return parent  # transparent: its children hang under (and compare with) its parent
        own = _ident(span)
        differs = _differs(own, parent.ident)
        if span.attributes.get(semconv.SYNTHETIC) is True and span.attributes.get(semconv.IS_PARALLEL):
            differs = True  # `otel-rl import` keeps ML-Agents' flag as an attribute
        if differs and self.places:
            place = self.places.get((_int(own[0], 0), _int(own[1], 0)))
            if place is not None:  # rule 7: where the program merged this thread's tree
                parent = _Info(self.tree.node_at(place), place, parent.ident, True)
        path = (*parent.path, span.name)
        info = _Info(
            node=parent.node.child(span.name),
            path=path,
            ident=own,
            parallel=parent.parallel or differs,
        )
        role = span.attributes.get(semconv.COMPONENT_ROLE)
        if role is not None:  # rule 6: a component starts a worker entry of its role
            info.worker = (str(role), _int(span.attributes.get(semconv.COMPONENT_INDEX), 0),
                           _int(own[0], 0))
            info.scoped = info.component = True
            self.workers.setdefault(info.worker, _Worker()).start_paths.append(path)
            return info
        if parent.scoped and parent.worker is not None and parent.worker[2] == _int(own[0], 0):
            info.worker, info.scoped = parent.worker, True
            info.worker_parallel = (parent.worker_parallel and not parent.component) or differs
            return info
        worker = _worker_key(span)
        if worker is None and self.main_worker is not None and own == self.root_info.ident:
            info.worker = self.main_worker  # a block of the run's own thread (rule 6)
            record = self.workers.setdefault(self.main_worker, _Worker())
            if parent.worker == self.main_worker:
                info.worker_parallel = parent.worker_parallel
            else:
                record.start_paths.append(parent.path)
            return info
        if worker is not None:
            info.worker = worker
            record = self.workers.setdefault(worker, _Worker())
            if parent.worker == worker:
                info.worker_parallel = parent.worker_parallel or differs
            else:
                record.start_paths.append(parent.path)
        return info

    def _worker_infos(self) -> list[WorkerInfo]:
        infos = []
        for (role, index, pid), record in sorted(self.workers.items()):
            prefix = _common_prefix(record.start_paths)
            node = TreeNode(role)
            for span, info in record.blocks:
                target = node
                for name in info.path[len(prefix) :]:
                    target = target.child(name)
                count = 1
                if span.attributes.get(semconv.SYNTHETIC) is True:
                    count = _int(span.attributes.get(semconv.COUNT), 1)
                target.add(span.duration_s, count)
                _add_gpu(target, span)
                target.is_parallel |= info.worker_parallel
            infos.append(WorkerInfo(role, index, pid, list(prefix), node))
        return infos

    def _notes(self) -> None:
        notes = self.tree.notes
        if self.missing:
            first = self.missing[0]
            notes.append(
                f"{len(self.missing)} span(s) whose parent span is not in the data were placed "
                f"under the root (first: {first.name!r} in trace {first.trace_id})"
            )
        if self.windows:
            notes.append(
                f"the spans hold {self.windows} sampled time window(s) of the run and no "
                "aggregates: totals and counts are partial"
            )
        if self.cycles:
            notes.append(f"{self.cycles} parent cycle(s) in the span data were cut at the root")
        sampled = Counter(
            str(s.attributes[semconv.SAMPLED])
            for s in self.ordered
            if s.attributes.get(semconv.SAMPLED)
        )
        if sampled:
            detail = ", ".join(f"{n} by {why}" for why, n in sorted(sampled.items()))
            notes.append(
                f"{sum(sampled.values())} iteration(s) were sampled ({detail}): the spans hold "
                "only the sampled iterations, so totals and counts are partial"
            )


def _common_prefix(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    if not paths:
        return ()
    prefix = paths[0]
    for path in paths[1:]:
        n = 0
        while n < min(len(prefix), len(path)) and prefix[n] == path[n]:
            n += 1
        prefix = prefix[:n]
    return prefix
