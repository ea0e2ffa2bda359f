"""What this process's timer stacks contribute to the whole-run tree (`wholerun`): each
stack's blocks placed under the block that started it, and the gauges set in the stacks.

The write side's half of the whole-run tree: it reads the recorder's stacks, so the read side
never imports it (`wholerun.build` takes what this returns, as JSON-able data or nodes).
"""

from __future__ import annotations

from collections.abc import Iterable

from otel_rl._internal.node import Gauge
from otel_rl._internal.recorder import Base, TimerStack, stack_contribution
from otel_rl._internal.shapes import GaugeDict
from otel_rl._internal.wholerun import Contribution, merge_gauge

__all__ = ["contributions", "stack_gauges"]


def stack_gauges(stacks: Iterable[TimerStack]) -> dict[str, GaugeDict]:
    """Gauges set in these stacks, without what `merge_gauges` copied between them."""
    result: dict[str, GaugeDict] = {}
    seen: set[int] = set()
    for st in stacks:
        own: list[tuple[str, Gauge]] = list(st.retired_gauges.items())
        for name, node in list(st.gauges.items()):
            if id(node) in seen:
                continue  # merge_gauges shares GaugeNode objects between stacks
            seen.add(id(node))
            own.append((name, node.as_gauge(node.count - st.merged_gauge_counts.get(name, 0))))
        for name, gauge in own:
            if gauge.count > 0:
                merge_gauge(result, name, gauge.to_dict(ts=True))
    return result


def contributions(stacks: Iterable[TimerStack], default_base: Base | None) -> list[Contribution]:
    """What each stack recorded, placed under the block that started it."""
    result: list[Contribution] = []
    for st in stacks:
        node = stack_contribution(st)
        if not node.children:
            continue
        base = st.base or default_base
        path = list(base.path) if base is not None else []
        parallel = base is not None and (base.pid, base.tid) != (st.pid, st.tid)
        contribution: Contribution = {"path": path, "parallel": parallel,
                                      "tree": node,
                                      "pid": st.pid, "tid": st.tid}
        component = st.component
        if component is not None:  # a Sample Factory Timing's component (see `components`)
            contribution["component"] = {"name": component.name, "role": component.role,
                                         "index": component.index}
        result.append(contribution)
    return result
