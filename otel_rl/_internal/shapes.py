"""The data shapes that cross otel_rl's module seams, as types (a leaf: imports nothing).

- *Attributes*: what a span or resource attribute may hold (OTel's AnyValue subset we write).
- The whole-run tree's wire format (`NodeDict`, `GaugeDict`, `TimersDict`): timers.json, and
  the trees inside what a process describes of its own blocks (`wholerun.Snapshot`), sent
  from workers to the parent over the relay and kept in aggregate spans. It is JSON: what
  comes back from ``json.loads`` is trusted to have this shape only because otel_rl itself
  wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

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


