"""Components as the frameworks name them: Sample Factory's `Timing` objects.

Sample Factory runs its components (`Timing("RolloutWorker_w0 profile")`, ``"Learner 0
profile"``, ``"Batcher 0 profile"``, ...) in worker processes started from the runner's
``main_loop``, and prints one tree per component. Placed under the block that started their
process, all components' blocks would sit side by side under ``main_loop``; so a `Timing` used
in a worker (a thread or process that is a parallel branch of the run) gets a *component*: a
block named like the Timing, open from its first use to shutdown, under which its blocks are
recorded. Its span carries the Timing's name, role and index (`semconv.COMPONENT*`), the
whole-run tree reads ``main_loop/RolloutWorker_w0 profile/...`` exactly like Sample Factory's
printed tree, and the cross-worker view groups components by role (N RolloutWorkers).

The component's blocks live on a stack of their own (one per thread and Timing name), made the
thread's active stack while one of the Timing's top-level blocks is open.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from otel_rl._internal import procstate, recorder, runtime, semconv
from otel_rl._internal.record import make
from otel_rl._internal.recorder import Base, TimerStack
from otel_rl._internal.shapes import AttributeValue

__all__ = ["Component", "close_all", "role_of", "stack_for", "switch_to"]

_SUFFIX = re.compile(r"\s*profile\s*$", re.IGNORECASE)
_ROLE = re.compile(r"[A-Za-z][A-Za-z]*")
_NUMBER = re.compile(r"\d+")


def role_of(name: str) -> tuple[str, int]:
    """``("RolloutWorker", 1)`` from ``"RolloutWorker_w1 profile"``; ``("Learner", 0)`` from
    ``"Learner 0 profile"``; the last number is the index (0 when there is none).

    >>> role_of("InferenceWorker_p0-w1 profile")
    ('InferenceWorker', 1)
    """
    label = _SUFFIX.sub("", name).strip() or name.strip() or "component"
    match = _ROLE.match(label)
    role = match.group(0) if match else label
    numbers = _NUMBER.findall(label[len(role):])
    return role, int(numbers[-1]) if numbers else 0


class Component:
    """One Timing's component block in one thread."""

    __slots__ = ("index", "name", "role", "span_id", "start_ns")

    def __init__(self, name: str, span_id: int) -> None:
        self.name = name
        self.role, self.index = role_of(name)
        self.span_id = span_id
        self.start_ns = recorder.now_ns()  # the recorder's clock (a test's, in capture_spans)


#: Sample Factory's default Timing name: a Timing nobody named is no component.
UNNAMED = "Profile"

#: The run's own thread takes its role from the first named Timing it uses (Sample Factory's
#: "Runner profile" -> Runner): ``(name, role, index)``, on the run span and in `workers`.
main_role: tuple[str, str, int] | None = None

_stacks: dict[tuple[int, str], TimerStack] = {}
_lock = threading.Lock()
#: The runtime the components above belong to: a new `configure()` starts afresh.
_owner: Any = None


def main_role_of(rt: Any) -> tuple[str, str, int] | None:
    """`main_role`, if it was taken while `rt` was the runtime."""
    return main_role if _owner is rt else None


def _adopt_runtime(rt: Any) -> None:
    global _owner, main_role
    with _lock:
        if _owner is not rt:
            _stacks.clear()
            main_role = None
            _owner = rt


def stack_for(name: str) -> TimerStack | None:
    """The component stack for the Timing `name` in this thread, or None where the Timing's
    blocks stay on the thread's own stack: otel_rl off, an unnamed Timing, the run's own
    thread, or already inside another component's block."""
    rt = runtime.current()
    if rt is None or rt.closed or rt.pid != os.getpid() or name == UNNAMED:
        return None
    if _owner is not rt:
        _adopt_runtime(rt)
    st = recorder.thread_stack()
    if st.component is not None:
        return None
    key = (st.tid, name)
    comp = _stacks.get(key)
    if comp is not None:
        return comp
    base = st.base or rt.base
    if base is None:
        return None
    inside = len(st.stack) > 1
    if not inside and (base.pid, base.tid) == (st.pid, st.tid):
        global main_role
        if main_role is None and not rt.is_worker:
            main_role = (name, *role_of(name))
        return None
    with _lock:
        comp = _stacks.get(key)
        if comp is None:
            comp = _stacks[key] = _make(rt, st, base, name, inside)
    return comp


def switch_to(name: str, unchanged: Any) -> Any:
    """Make the component stack of the Timing `name` this thread's active stack for one of its
    top-level blocks; returns the stack to switch back to (`recorder.set_active_stack`), or
    `unchanged` where the block stays on the thread's own stack (see `stack_for`).

    Runs at every top-level Timing block: a component made already is found with a few
    lookups. Its runtime is the components' `_owner` only in the process that adopted it
    (`stack_for` checks the pid; in a forked child the fork hooks every started runtime
    registers replace the runtime and reset `_owner`), so no ``os.getpid()`` system call is
    made here (`runtime.active`: 0.34 µs of a 4.1 µs top-level Timing block, 0.17 s of a
    real Sample Factory run). That common case reads and sets the thread's stack on
    `recorder.thread_state` itself, without `active_stack`/`set_active_stack`'s two calls
    (~0.3 µs of each top-level block; a 60,000-step Sample Factory run has ~220,000)."""
    rt = runtime.current()
    if rt is _owner and rt is not None and not rt.closed:
        local = recorder.thread_state
        st = getattr(local, "stack", None)
        if st is not None and st.component is None:
            comp = _stacks.get((st.tid, name))
            if comp is not None:
                local.stack = comp
                return st
    stack = stack_for(name)
    if stack is None:
        return unchanged
    return recorder.set_active_stack(stack)


def _make(rt: runtime.Runtime, st: TimerStack, base: Base, name: str,
          inside: bool) -> TimerStack:
    path = tuple(base.path) + tuple(node.name for node in st.stack[1:])
    pid, tid = (st.pid, st.tid) if inside else (base.pid, base.tid)
    trace = st.trace if st.trace is not None else base.trace
    comp = TimerStack()
    rt.adopt(comp, base=Base(trace, st.span or base.span_id, path, pid, tid))
    component = comp.component = Component(name, recorder.new_span_id())
    comp.stack.append(comp.root.get_child(name))
    if comp.trace is not None:
        recorder.tally_add(1)  # a block from now on (a record at its end, or cut short)
        comp.trace.n += 1
        comp.push_open(component.span_id, name, component.start_ns)
    return comp


def close_all(end_ns: int, buffer: Any, spans_on: bool) -> None:
    """At shutdown: each component block ends (its node counts one run) and its span is
    recorded."""
    with _lock:
        stacks = list(_stacks.values())
    for comp in stacks:
        component: Component = comp.component
        node = comp.root.children.get(component.name)
        if node is None or node.count:
            continue
        node.total += (end_ns - component.start_ns) / 1e9
        node.count += 1
        base = comp.base
        trace = comp.trace
        if not spans_on or trace is None or base is None:
            continue
        attrs: dict[str, AttributeValue] = {
            semconv.COMPONENT: component.name, semconv.COMPONENT_ROLE: component.role,
            semconv.COMPONENT_INDEX: component.index}
        buffer.append(make(component.span_id, base.span_id, component.name,
                           component.start_ns, end_ns, comp.tid, trace.trace_id,
                           {"attrs": attrs}))
        comp.pop_open(component.span_id)  # recorded: not open any more (not cut short)


def reset_after_fork() -> None:
    """A forked child's components are its own (it starts none of the parent's)."""
    global _lock, main_role, _owner
    _lock = threading.Lock()
    _stacks.clear()
    main_role = _owner = None


procstate.register("components", after_in_child=reset_after_fork, for_tests=reset_after_fork)
