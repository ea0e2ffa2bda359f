"""The hot path: per-thread timer stacks, exact aggregates and compact span records.

A timed block costs a push/pop on its thread's stack, an aggregate update on its tree node and,
when spans are on and the policy keeps it, one tuple appended to a bounded buffer. No OTel SDK
object is made here; records become OTLP in bulk on a background thread (`pipeline`).

Span records are `record.Record` tuples, fields named there; ``__exit__`` builds its literal
in that order (`tests/test_record.py` pins it), every other builder calls `record.make`.

The records are the same under the `all` and `auto` policies: which of them a backend gets
is decided off the hot path (`windows.Windower`, in the pipeline).
"""

from __future__ import annotations

import builtins
import functools
import itertools
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, MutableSequence, Sequence
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar, cast

from otel_rl._internal import accel, log
from otel_rl._internal.node import Gauge, TreeNode
from otel_rl._internal.record import Extra, OpenSpan, Record
from otel_rl._internal.shapes import GaugeDict, NodeDict, TimersDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

TIMER_FORMAT_VERSION = "0.1.0"
FuncT = TypeVar("FuncT", bound=Callable[..., Any])



class TimerNode(TreeNode):
    """The time spent in one block of code (keyed by name in its parent's `children`): the one
    tree node (`TreeNode`) with ML-Agents' TimerNode API on top — `get_child`, `add_time`,
    `merge(other, root_name, is_parallel)`, identity equality — and what the whole-run view
    needs: what `merge` brought in, and where a stack's root came from."""

    __slots__ = ("merged_count", "merged_total", "origin")

    def __init__(self, name: str = "") -> None:
        # Assigned here rather than through TreeNode.__init__: blocks make nodes on first entry.
        self.children = {}
        self.total = 0.0
        self.count = 0
        self.is_parallel = False
        self.name = name
        # GPU seconds of the runs whose events were read (opt-in blocks; `gpu` module).
        self.gpu_total = 0.0
        self.gpu_count = 0
        # What `merge` brought in from other trees (ML-Agents' own worker/thread merging).
        # The whole-run tree leaves it out: otel_rl gathers those trees itself.
        self.merged_total = 0.0
        self.merged_count = 0
        # On a stack's root: (pid, thread id) of the stack, so that when the program merges
        # this tree into another (ML-Agents' `workers`, `trainer_threads`) the whole-run tree
        # can place that stack's blocks there. It travels with a pickled root.
        self.origin: tuple[int, int] | None = None

    # ML-Agents compares and hashes its nodes by identity; so do live stacks.
    __eq__ = object.__eq__
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # ML-Agents' env workers pickle their root to the parent every step: the fields as one
        # tuple pickle in half the time and bytes of the default (a dict of slot names).
        return _unpickle_node, (type(self), self.name, self.total, self.count, self.is_parallel,
                                self.children, self.gpu_total, self.gpu_count,
                                self.merged_total, self.merged_count, self.origin)

    def get_child(self, name: str) -> TimerNode:
        """The child node for `name`, created if it does not exist yet (ML-Agents' name for
        `TreeNode.child`)."""
        return self.child(name)

    def add_time(self, elapsed: float) -> None:
        """Accumulate `elapsed` seconds and count one run."""
        self.total += elapsed
        self.count += 1

    def merge(self, other: TreeNode, root_name: str | None = None,  # type: ignore[override]
              is_parallel: bool = True) -> None:
        """Add `other` (and its children, recursively) into this node, ML-Agents style
        (counted as merged-in: the whole-run tree gathers other threads' trees itself)."""
        origin = getattr(other, "origin", None)
        hook = on_merge
        if origin is not None and hook is not None:
            hook(self, origin)
        todo = [(self.get_child(root_name) if root_name else self, other)]
        while todo:  # iteratively: a deep tree must not hit the recursion limit
            node, theirs = todo.pop()
            total = theirs.total
            count = theirs.count
            node.total += total
            node.count += count
            node.merged_total += total
            node.merged_count += count
            node.is_parallel |= is_parallel
            if theirs.children:  # (ML-Agents merges a worker's tree every step: kept lean)
                mine = node.children
                for name, child in theirs.children.items():
                    into = mine.get(name)
                    if into is None:
                        into = mine[name] = type(node)(name)
                    todo.append((into, child))

    def add_own_to(self, target: TreeNode) -> None:
        """Add this tree's blocks less what `merge` brought in (the subtraction the whole-run
        view makes) under `target`'s children: a node is added when it has runs of its own
        or something below it has, with its total less the merged-in part (never below zero).
        In place, no copy made: `reset_timers` does this once per ML-Agents env step. Children
        are read as a snapshot (another thread may be adding blocks to a live tree)."""
        todo = [(child, target) for child in reversed(list(self.children.values()))]
        while todo:  # depth first, children in order: new nodes come in the tree's order
            node, into = todo.pop()
            if node.count - node.merged_count > 0:
                placed = into.child(node.name)
                placed.total += max(0.0, node.total - node.merged_total)
                placed.count += node.count - node.merged_count
                placed.gpu_total += node.gpu_total
                placed.gpu_count += node.gpu_count
                if node.children:
                    todo.extend([(child, placed)
                                 for child in reversed(list(node.children.values()))])
            elif node.children:  # no runs of its own: placed only if something below it is
                _add_own_below(node, into)


def _add_own_below(top: TimerNode, into: TreeNode) -> None:
    """`TimerNode.add_own_to` for the subtree of `top`, which has no runs of its own: a node
    is placed when it has runs of its own, with the ancestors it hangs from (each placed
    once; linear in the subtree, however deep a chain of nodes without runs)."""
    placed: list[Any] = [None, None, into]  # [node, its parent's entry, its placed node]
    todo: list[list[Any]] = [[top, placed, None]]
    while todo:
        entry = todo.pop()
        node: TimerNode = entry[0]
        if node.count - node.merged_count > 0:
            chain: list[list[Any]] = []
            while entry[2] is None:  # this node and its ancestors not placed yet
                chain.append(entry)
                entry = entry[1]
            target: TreeNode = entry[2]
            for item in reversed(chain):
                mine: TimerNode = item[0]
                target = target.child(mine.name)
                target.total += max(0.0, mine.total - mine.merged_total)
                target.count += max(0, mine.count - mine.merged_count)
                target.gpu_total += mine.gpu_total
                target.gpu_count += mine.gpu_count
                item[2] = target
            entry = chain[0]
        if node.children:
            todo.extend([child, entry, None] for child in reversed(list(node.children.values())))


def _unpickle_node(cls: type[TimerNode], name: str, total: float, count: int, is_parallel: bool,
                   children: dict[str, TimerNode], gpu_total: float, gpu_count: int,
                   merged_total: float, merged_count: int,
                   origin: tuple[int, int] | None) -> TimerNode:
    """A `TimerNode` from its pickled fields (`TimerNode.__reduce__`)."""
    node = cls.__new__(cls)
    node.name = name
    node.total = total
    node.count = count
    node.is_parallel = is_parallel
    node.children = children
    node.gpu_total = gpu_total
    node.gpu_count = gpu_count
    node.merged_total = merged_total
    node.merged_count = merged_count
    node.origin = origin
    return node


class GaugeNode:
    """The latest value of a metric, with its min, max and update count (a statsd gauge)."""

    __slots__ = ("_timestamp", "count", "max_value", "min_value", "value")

    def __init__(self, value: float) -> None:
        self.value = value
        self.min_value = value
        self.max_value = value
        self.count = 1
        self._timestamp = time.time()

    def update(self, new_value: float) -> None:
        self.min_value = min(self.min_value, new_value)
        self.max_value = max(self.max_value, new_value)
        self.value = new_value
        self.count += 1
        self._timestamp = time.time()

    def merge(self, other: GaugeNode) -> None:
        # ML-Agents' rule, for code that calls it (`timers.merge_gauges`); otel_rl's own
        # merges use `node.Gauge.merge` (on a tie, the gauge merged in wins).
        if self._timestamp < other._timestamp:
            self.value = other.value
            self._timestamp = other._timestamp
        self.min_value = min(self.min_value, other.min_value)
        self.max_value = max(self.max_value, other.max_value)
        self.count += other.count

    def as_dict(self) -> GaugeDict:
        return {"value": self.value, "min": self.min_value, "max": self.max_value,
                "count": self.count}

    def as_gauge(self, count: int) -> Gauge:
        """This gauge as otel_rl's one gauge form (`node.Gauge`), counting `count` updates."""
        return Gauge(self.value, self.min_value, self.max_value, count, self._timestamp)


class Base:
    """Where a stack's top-level blocks sit in the run: the block (span and tree path) and the
    thread that started them. Top-level blocks are parallel branches when that thread differs."""

    __slots__ = ("path", "pid", "span_id", "tid", "trace")

    def __init__(self, trace: Trace | None, span_id: int, path: tuple[str, ...], pid: int,
                 tid: int) -> None:
        self.trace = trace
        self.span_id = span_id
        self.path = path
        self.pid = pid
        self.tid = tid


class RecordSink(Protocol):
    """Where a trace's records go: the export buffer (a deque), a list, or `DISCARD`."""

    def __len__(self) -> int: ...

    def append(self, record: Record, /) -> None: ...


class Trace:
    """One trace this process adds spans to: its id, its share of the span budget (handed on
    to child processes), and where its records go (the export buffer, or `DISCARD` for a
    trace the parent does not sample)."""

    __slots__ = ("budget", "link", "n", "sampled", "sink", "trace_id")

    def __init__(self, trace_id: int, budget: int, sink: RecordSink,
                 link: tuple[int, int] | None = None, sampled: str | None = None) -> None:
        self.trace_id = trace_id
        self.budget = budget
        self.n = 0
        self.sink = sink
        self.link = link
        self.sampled = sampled


class _Discard:
    """A sink that keeps nothing (a carrier that says "not sampled")."""

    __slots__ = ()

    def __len__(self) -> int:
        return 0

    def append(self, record: Record, /) -> None:
        pass


DISCARD: RecordSink = _Discard()


class OpenRoot:
    """The bottom of a stack's chain of open blocks: the span its top-level blocks hang under
    (the block that started the thread or process, or the run span)."""

    __slots__ = ("_name", "_sid", "_start", "_up")

    def __init__(self, span_id: int) -> None:
        self._sid = span_id
        self._up: OpenRoot | None = None
        self._name = ""
        self._start = 0


class OpenBlock(OpenRoot):
    """A block open in a stack that is not a `hierarchical_timer` (a Sample Factory component,
    open for the component's life): in the chain, so windows show it and children find it."""

    __slots__ = ()

    def __init__(self, span_id: int, up: OpenRoot, name: str, start_ns: int) -> None:
        super().__init__(span_id)
        self._up = up
        self._name = name
        self._start = start_ns


class TimerStack:
    """All the time spent in one thread (or an explicitly passed stack)."""

    __slots__ = ("base", "component", "dropped", "fork_path", "gauges", "merged_gauge_counts",
                 "metadata", "pid", "retired", "retired_gauges", "root", "run_start", "slot",
                 "stack", "start_time", "tid", "tname", "top", "trace", "unretired")

    def __init__(self) -> None:
        current = threading.current_thread()
        self.tid = current.ident or 0
        self.tname = current.name
        self.pid = os.getpid()
        self.root = TimerNode("root")
        self.root.origin = (self.pid, self.tid)
        self.stack = [self.root]
        self.start_time = time.perf_counter()
        self.gauges: dict[str, GaugeNode] = {}
        self.metadata: dict[str, str] = {}
        self._add_default_metadata()
        # otel_rl's own state; never reset by `reset()`.
        self.run_start = perf_counter_ns()
        self.retired = TimerNode("root")
        # Roots `reset()` let go of whose blocks are not in `retired` yet (`_settle` adds them).
        self.unretired: deque[TimerNode] = deque()
        self.retired_gauges: dict[str, Gauge] = {}
        self.merged_gauge_counts: dict[str, int] = {}
        self.dropped = 0
        # In a forked child: the names of the blocks that were open in the parent at the fork
        # (the child's own blocks hang under them in its legacy tree; in the whole run they
        # hang under the block that started the child). Cleared by `reset()`.
        self.fork_path: tuple[str, ...] = ()
        # Set on a `components` stack: the Sample Factory Timing it serves (see `components`).
        self.component: Any = None
        self.base: Base | None = None
        self.trace: Trace | None = None
        # The innermost open block (a `hierarchical_timer`, each linking to the one it is
        # nested in) down to an `OpenRoot`: parent span ids, and what is still open at a
        # window's close or at shutdown.
        self.top: Any = OpenRoot(0)
        #: This stack's counter in `tally` (set by `_register_stack`).
        self.slot = TALLY_SLOTS - 1
        _register_stack(self)

    @property
    def span(self) -> int:
        """The span id new blocks in this stack hang under (0: none)."""
        return self.top._sid  # type: ignore[no-any-return]

    def merge_gauges(self, gauges: dict[str, GaugeNode]) -> None:
        """ML-Agents' `merge_gauges` into this stack (its rule: `GaugeNode.merge`), noting
        what came from elsewhere so the whole run counts it once."""
        for name, gauge in gauges.items():
            if name in self.gauges:
                self.gauges[name].merge(gauge)
                counts = self.merged_gauge_counts
                counts[name] = counts.get(name, 0) + gauge.count
            else:
                self.gauges[name] = gauge

    def push_open(self, span_id: int, name: str, start_ns: int) -> None:
        """Open a block that is not a `hierarchical_timer` (a Sample Factory component, open
        for its whole life) as the stack's innermost: its blocks hang under it."""
        self.top = OpenBlock(span_id, self.top, name, start_ns)

    def pop_open(self, span_id: int) -> bool:
        """Close the innermost open block if it is `span_id` (a `push_open` block that was
        recorded, so not cut short at shutdown); whether it was."""
        top = self.top
        if top._sid != span_id or top._up is None:
            return False
        self.top = top._up
        return True

    def open_blocks(self) -> list[OpenSpan]:
        """The blocks open now in this stack, innermost first. Safe to call from another
        thread: it only reads links that are replaced whole."""
        result = []
        node = self.top
        # Bounded: a timer object re-entered while open (a program error) could link the
        # chain into a loop; shutdown (a signal handler, too) must never spin on it.
        for _ in range(100_000):
            if node is None or node._up is None:
                break
            up = node._up
            start = getattr(node, "_start", None)  # None: entered a moment ago
            if start is not None:
                result.append(OpenSpan(self.pid, node._sid, up._sid, node._name, start,
                                       self.tid))
            node = up
        return result

    def reset(self) -> None:
        """Start over (ML-Agents semantics). The whole-run tree keeps what was recorded.

        ML-Agents' env workers reset every step, so the old root's blocks are usually only
        queued here: `_settle` adds a batch of them to `retired` at once, and before anything
        reads it. Gauges, a fork path or a retire hook (GPU time still due) retire it now."""
        old_root = self.root
        hook = on_retire
        if self.gauges or self.fork_path or hook is not None:
            _settle(self)
            _retire(self)
            if hook is not None:
                hook(self, old_root)
        else:
            unretired = self.unretired
            unretired.append(old_root)
            if len(unretired) >= SETTLE_AT:
                _settle(self)
        self.fork_path = ()
        self.root = TimerNode("root")
        self.root.origin = (self.pid, self.tid)
        self.stack = [self.root]
        self.start_time = time.perf_counter()
        self.gauges = {}
        self.metadata = {}
        self.merged_gauge_counts = {}
        self._add_default_metadata()

    def push(self, name: str) -> TimerNode:
        """Enter a block by hand; prefer `hierarchical_timer`, which pairs push and pop."""
        next_node = self.stack[-1].get_child(name)
        self.stack.append(next_node)
        return next_node

    def pop(self) -> None:
        self.stack.pop()

    def get_root(self) -> TimerNode:
        """The root node, its total updated to the time since the stack started."""
        root = self.root
        root.total = time.perf_counter() - self.start_time
        root.count = 1
        return root

    def get_timing_tree(self, node: TimerNode | None = None) -> TimersDict:
        """The tree of timings as a dict (ML-Agents' timers.json schema)."""
        res: TimersDict = {}
        if node is None:
            node = self.get_root()
            res["name"] = "root"
            if self.gauges:
                res["gauges"] = self._get_gauges()
            if self.metadata:
                fix_argv(self.metadata)
                self.metadata["end_time_seconds"] = str(int(time.time()))
                res["metadata"] = self.metadata
        res.update(cast(TimersDict, node_dict(node)))  # a node's keys are a document's
        return res

    def set_gauge(self, name: str, value: float) -> None:
        if math.isnan(value):
            return
        gauge = self.gauges.get(name)
        if gauge:
            gauge.update(value)
        else:
            self.gauges[name] = GaugeNode(value)

    def add_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def _get_gauges(self) -> dict[str, GaugeDict]:
        return {name: gauge.as_dict() for name, gauge in self.gauges.items()}

    def _add_default_metadata(self) -> None:
        self.metadata["timer_format_version"] = TIMER_FORMAT_VERSION
        self.metadata["start_time_seconds"] = str(int(time.time()))
        self.metadata["python_version"] = sys.version
        self.metadata["command_line_arguments"] = " ".join(sys.argv)


#: ``" ".join(sys.argv)`` while Python was still starting (set by zero-code mode, whose
#: start-up hook configures otel_rl before ``-m module`` has rewritten sys.argv).
startup_argv: str | None = None


def fix_argv(metadata: dict[str, str]) -> None:
    """Record the program's real command line where a stack was made during start-up."""
    if startup_argv is not None and metadata.get("command_line_arguments") == startup_argv:
        metadata["command_line_arguments"] = " ".join(sys.argv)


def node_dict(node: TimerNode, gpu: bool = False) -> NodeDict:
    """One node in ML-Agents' timers.json schema (`TreeNode.to_dict`); with `gpu`, also
    ``gpu_total``/``gpu_count`` on nodes with GPU time (the whole-run tree's extension)."""
    return node.to_dict(gpu)


# --- Registries -----------------------------------------------------------------------------
# ML-Agents keeps one stack per thread in a dict keyed by thread ident; the same dict is kept
# (get_timer_stack_for_thread reads it) and a thread-local gives the hot path a faster lookup.
_thread_timer_stacks: dict[int, TimerStack] = {}
_local = threading.local()
#: The same thread-local, for a hot path elsewhere that reads or sets the thread's active
#: stack (``.stack``) without a call (`components.switch_to`); anything else goes through
#: `active_stack`/`set_active_stack`.
thread_state = _local
_all_stacks: list[TimerStack] = []
_registry_lock = threading.Lock()
#: Held while a stack's queued roots are added to its `retired` tree (`_settle`).
_settle_lock = threading.Lock()
#: How many roots `TimerStack.reset` queues before it adds them to `retired` itself. Few: the
#: queue amortizes the walk over `retired` (cold in cache between a worker's steps) as well
#: at 16 as at 256, and its roots must die young. At 256 they outlived the young collections,
#: and in a real ML-Agents run each env worker made 10 % more young collections and one more
#: full one, which walks the whole heap the worker inherited from the trainer (~0.13 s).
SETTLE_AT = 16

#: The `gpu_blocks` setting's verdict per block name (`gpu.wanted`), while it names any.
gpu_wanted: dict[str, bool] = {}
#: Set by the `gpu` module: called by `TimerStack.reset` with the stack and its old root, so
#: GPU time still pending for the old nodes lands in the retired tree.
on_retire: Callable[[TimerStack, TimerNode], None] | None = None
# The recorder's switches. Read on the hot path as module globals (the fastest lookup);
# written only by `arm` and `disarm`, which only the runtime calls.
#: While armed: called with each new stack to attach it to the run.
on_new_stack: Callable[[TimerStack], None] | None = None
#: Called as ``(target, origin)`` when the program merges a stack's root (tagged with its
#: `origin`) into `target` (see `placement`); set by `arm`, kept after `disarm`.
on_merge: Callable[[TimerNode, tuple[int, int]], None] | None = None
#: Records beyond this many in a buffer are dropped (and counted); 0 while disarmed.
buffer_cap = 0
#: Called with the buffer by the block whose record leaves it holding more than `pack_at`
#: records (0: never): a main process's pipeline lays them out there and then, in the thread
#: that recorded them (`Pipeline.pack_full`). Set by `arm`, cleared by `disarm`.
pack_at = 0
on_full: Callable[[Any], None] | None = None
#: The thread (its `threading.get_ident()`) whose blocks never call `on_full`: the main thread,
#: where Python runs signal handlers between any two bytecodes (a SIGTERM's last flush, a
#: KeyboardInterrupt), so that none can find records taken but not yet packed.
full_skip = 0
#: What this process has recorded, kept where its parent can read it if it is killed: a
#: relaying worker points this at a shared file mapping (`otel_rl._internal.tallyfile`).
#: Slot 0: records appended outside a timed block (`tally_add`); slot 1: the first span id
#: of `_ids` (which only timed blocks draw from); slot 2 on: per stack, the span id of its
#: latest block (one store per block, in the entering thread, no lock: a stack is one
#: thread's). Blocks entered = the highest of those - slot 1 + 1. A shared tally grows when
#: stacks outnumber its slots (`on_tally_full`); a plain list's extra stacks share the last.
TALLY_SLOTS = 4096
FIRST_STACK_SLOT = 2
#: A list here; a ctypes array over the shared file in a relaying worker (of the shared
#: kinds measured, its store of a 62-bit id was the cheapest: a memoryview "Q" store is slower).
tally: MutableSequence[int] = [0] * TALLY_SLOTS
_next_slot = FIRST_STACK_SLOT
#: Set by `tallyfile` while this process counts in a shared file: called (under the stack
#: registry's lock) with a slot past the tally's end, returns the tally mapped larger (same
#: file, same first slots), or None (the extra stacks then share the last slot).
on_tally_full: Callable[[int], MutableSequence[int] | None] | None = None
_tally_lock = threading.Lock()
_ids = itertools.count(0)  # set by `reseed_ids` below
#: Span ids of everything but timed blocks (the run, aggregates, components), so that `_ids`
#: counts blocks. Both start at random 62-bit points: their ranges never meet in practice.
_other_ids = itertools.count(0)
_random: Any = None


class _State(TypedDict, total=False):
    """The recorder's process state, in one place: the clock, the id sources, the switches
    and hooks, the tally, the registries' lock and counters. Each is a module global (the hot
    path reads them as globals: 6 ns a read against 13 ns for an attribute, CPython 3.11)
    and `_assign` is their one writer (no ``global`` statement in this module)."""

    perf_counter_ns: Callable[[], int]
    _ids: itertools.count[int]
    _other_ids: itertools.count[int]
    _trace_ids: Callable[[], int]
    _random: Any
    buffer_cap: int
    pack_at: int
    on_full: Callable[[Any], None] | None
    full_skip: int
    on_new_stack: Callable[[TimerStack], None] | None
    on_merge: Callable[[TimerNode, tuple[int, int]], None] | None
    on_retire: Callable[[TimerStack, TimerNode], None] | None
    _gpu_opt_in: Callable[[hierarchical_timer, str, bool | None], None]
    _plain_enter: Callable[[hierarchical_timer], TimerNode]
    _compiled: dict[Any, Any]
    startup_argv: str | None
    tally: MutableSequence[int]
    on_tally_full: Callable[[int], MutableSequence[int] | None] | None
    _tally_lock: threading.Lock
    _registry_lock: threading.Lock
    _settle_lock: threading.Lock
    _next_slot: int
    _generation: int
    _accelerator_on: bool


def _assign(**values: Unpack[_State]) -> None:
    """Set recorder state (see `_State`): the only writer of the module's state."""
    globals().update(values)


def arm(cap: int, new_stack_hook: Callable[[TimerStack], None] | None,
        merge_hook: Callable[[TimerNode, tuple[int, int]], None] | None = None,
        full_hook: Callable[[Any], None] | None = None, full_at: int = 0,
        full_skip: int | None = None) -> None:
    """Record spans: stacks with a trace append records (up to `cap` per buffer), every new
    stack goes to `new_stack_hook`, merges of tagged roots to `merge_hook`, and a buffer that
    an append leaves holding more than `full_at` records (if not 0) to `full_hook`, unless
    the block is the `full_skip` thread's (default: the main thread's)."""
    if full_skip is None:
        full_skip = threading.main_thread().ident or 0
    _assign(buffer_cap=cap, on_new_stack=new_stack_hook, on_merge=merge_hook,
            on_full=full_hook, pack_at=full_at if full_hook is not None else 0,
            full_skip=full_skip)


def disarm() -> None:
    """Stop recording spans (aggregates go on)."""
    _assign(buffer_cap=0, on_new_stack=None, on_full=None, pack_at=0)


def _register_stack(stack: TimerStack) -> None:
    with _registry_lock:
        _all_stacks.append(stack)
        slot = _next_slot
        if slot >= len(tally):  # a shared tally grows (`on_tally_full`), else slots share
            grown = on_tally_full(slot) if on_tally_full is not None else None
            if grown is not None and slot < len(grown):
                _assign(tally=grown)  # the same file, mapped larger: no store is lost
            else:
                slot = len(tally) - 1
        stack.slot = slot
        _assign(_next_slot=_next_slot + 1)
    hook = on_new_stack
    if hook is not None:
        hook(stack)


def all_stacks() -> list[TimerStack]:
    with _registry_lock:
        return list(_all_stacks)


def thread_stack() -> TimerStack:
    """The current thread's active stack (made on first use, as ML-Agents does)."""
    try:
        return _local.stack  # type: ignore[no-any-return]
    except AttributeError:
        pass
    ident = threading.get_ident()
    stack = _thread_timer_stacks.get(ident)
    if stack is None:
        stack = _thread_timer_stacks[ident] = TimerStack()
    _local.stack = stack
    return stack


def active_stack() -> TimerStack | None:
    """The current thread's active stack, None if it has not timed anything yet."""
    return getattr(_local, "stack", None)


def stack_of_thread(ident: int) -> TimerStack | None:
    """Thread `ident`'s own stack; None if it has timed nothing."""
    return _thread_timer_stacks.get(ident)


def set_active_stack(stack: TimerStack | None) -> TimerStack | None:
    """Make `stack` the current thread's active stack (None: its own); returns the previous."""
    previous = getattr(_local, "stack", None)
    if stack is None:
        try:
            del _local.stack
        except AttributeError:
            pass
    else:
        _local.stack = stack
    return previous


_generation = 0  # bumped by every reset: cached task stacks from before are forgotten


def task_stack(key: tuple[object, ...]) -> TimerStack:
    """The current thread's stack for tasks that run at one place in the tree (`key`): tasks
    submitted from the same block share it; a fresh one while one is in use (nested)."""
    cache: dict[tuple[object, ...], TimerStack] | None = getattr(_local, "task_stacks", None)
    if cache is None or getattr(_local, "task_generation", -1) != _generation:
        cache = _local.task_stacks = {}
        _local.task_generation = _generation
    stack = cache.get(key)
    if stack is None or len(stack.stack) > 1:
        stack = TimerStack()
        if len(cache) < 4096:
            cache[key] = stack
    return stack


def lease_task_stack(key: tuple[object, ...]) -> TimerStack:
    """A stack of the current thread for one coroutine or generator that runs at place `key`
    step by step, interleaved with others (an async actor's calls from one block): its own
    until `give_back_task_stack`, so that two suspended ones never share one (a shared stack
    would nest one's blocks in the other's). Stacks stay registered (their trees are the
    process's), so given-back ones are used again: a place gets as many as were ever running
    there at once."""
    free = _task_pool().get(key)
    return free.pop() if free else TimerStack()


def give_back_task_stack(key: tuple[object, ...], stack: TimerStack) -> None:
    """`stack` of `lease_task_stack(key)` is free again (kept for the next one, unless a
    block is still open in it)."""
    pool = _task_pool()
    if len(stack.stack) == 1 and (key in pool or len(pool) < 4096):
        pool.setdefault(key, []).append(stack)


def _task_pool() -> dict[tuple[object, ...], list[TimerStack]]:
    pool: dict[tuple[object, ...], list[TimerStack]] | None = getattr(_local, "task_pool", None)
    if pool is None or getattr(_local, "pool_generation", -1) != _generation:
        pool = _local.task_pool = {}
        _local.pool_generation = _generation
    return pool


def new_span_id() -> int:
    """A span id for anything but a timed block."""
    return next(_other_ids)  # starts below 2**62: never 0, never past 64 bits


def _random_trace_id() -> int:
    if _random is None:  # imported on first use: worker start-up does not pay for it
        import random

        _assign(_random=random.Random(os.urandom(16)))
    return _random.getrandbits(128) or 1  # type: ignore[no-any-return]


_trace_ids: Callable[[], int] = _random_trace_id


def new_trace_id() -> int:
    return _trace_ids()


IdSource = Callable[[], int]


def now_ns() -> int:
    """The recorder's clock (perf_counter_ns, or `otel_rl.testing`'s deterministic one)."""
    return perf_counter_ns()


def swap_clock_and_ids(clock: Callable[[], int], span_ids: itertools.count[int],
                       trace_ids: IdSource) -> tuple[Callable[[], int], itertools.count[int],
                                                     IdSource]:
    """Replace the clock (perf_counter_ns), the span id sequence and the trace id source;
    returns the previous three (for `otel_rl.testing`'s deterministic mode)."""
    previous = (perf_counter_ns, _ids, _trace_ids)
    if _swapped and _swapped[-1][0] is span_ids:  # swapping back
        other_ids = _swapped.pop()[1]
    else:  # one sequence for every span: deterministic
        _swapped.append((_ids, _other_ids))
        other_ids = span_ids
    _assign(perf_counter_ns=clock, _ids=span_ids, _trace_ids=trace_ids, _other_ids=other_ids)
    return previous


_swapped: list[tuple[itertools.count[int], itertools.count[int]]] = []


def reseed_ids() -> None:
    """After a fork: fresh id sequences so parent and child never collide."""
    first = int.from_bytes(os.urandom(8), "big") >> 2 | 1
    _assign(_random=None, _ids=itertools.count(first),
            _other_ids=itertools.count(int.from_bytes(os.urandom(8), "big") >> 2 | 1))
    tally[1] = first


reseed_ids()


def use_tally(slots: MutableSequence[int],
              grow: Callable[[int], MutableSequence[int] | None] | None = None) -> None:
    """Count in `slots` from now on (what was counted so far is copied into it): timed
    blocks store their span ids there (`_tallied_enter`); `grow` becomes `on_tally_full`."""
    slots[:] = tally
    _assign(tally=slots, on_tally_full=grow)
    _swap_enter(_tallied_enter)


def _swap_enter(enter: Callable[[hierarchical_timer], TimerNode]) -> None:
    """Make `enter` the plain `__enter__` (what `use_stack_lookup`'s wraps, too)."""
    enter = _compiled.get(enter, enter)
    if hierarchical_timer.__enter__ is _plain_enter:
        hierarchical_timer.__enter__ = enter  # type: ignore[method-assign]
    _assign(_plain_enter=enter)


#: Called with the setting after every `use_accelerator` (`otel_rl.timing` switches its
#: compiled methods with it); `_accelerator_on` is the last setting.
accelerator_hooks: list[Callable[[bool], object]] = []
_accelerator_on = False


def accelerator_on() -> bool:
    """The last `use_accelerator` setting (whether compiled code is wanted)."""
    return _accelerator_on


#: The compiled hot path's `__init__`, `__enter__`, `__exit__` and `_tallied_enter`, by the
#: pure functions they stand for (`accel`); empty on the pure path.
_compiled: dict[Any, Any] = {}


def use_accelerator(on: bool) -> bool:
    """Time blocks with the compiled hot path when `on` and it is built, else with the pure
    Python above (the same results); whether the compiled one is in use. Safe between blocks
    and while some are open: both paths keep the same slots."""
    tallied = _plain_enter in (_tallied_enter, _compiled.get(_tallied_enter))
    gpu_init = hierarchical_timer.__init__ is _init_with_gpu_blocks
    module = accel.compiled() if on else None
    _assign(_compiled={} if module is None else module.install(
        hierarchical_timer, TimerStack, TimerNode, Trace, globals(), _plain_init,
        _untallied_enter, _tallied_enter, _pure_exit))
    hierarchical_timer.__exit__ = _compiled.get(_pure_exit, _pure_exit)  # type: ignore[method-assign]
    if not gpu_init:
        hierarchical_timer.__init__ = _compiled.get(_plain_init, _plain_init)  # type: ignore[method-assign]
    _swap_enter(_tallied_enter if tallied else _untallied_enter)
    _assign(_accelerator_on=on)
    for hook in accelerator_hooks:
        hook(on)
    return bool(_compiled)


def accelerated() -> bool:
    """Whether blocks run the compiled hot path."""
    return bool(_compiled)


def hot_path() -> str:
    """Which hot path times blocks, and why (`accel.describe`)."""
    return accel.describe(accelerated())


def tallied() -> int:
    """Records this process has recorded (ended, dropped or still open) by `tally`."""
    return tallied_in(tally)


def tallied_in(slots: Sequence[int]) -> int:
    """The count a tally holds (`tallied`; the parent reads a dead worker's with it)."""
    last = max(slots[FIRST_STACK_SLOT:])
    blocks = last - slots[1] + 1 if last >= slots[1] > 0 else 0
    return int(slots[0]) + blocks


def tally_add(n: int) -> None:
    """`n` records appended to the buffer outside a timed block (slot 0)."""
    if n <= 0:
        return
    with _tally_lock:
        tally[0] += n


def reset_after_fork() -> TimerStack:
    """In a forked child: only the forking thread survives, and it keeps its stack as it was,
    as with ML-Agents (the child's `get_timer_tree()` starts from a copy of the parent's). What
    that copy holds is the parent's: it is marked as merged-in, so the child's whole-run
    contribution holds only what the child records itself."""
    # The parent's counters (maybe its shared file) are not the child's to count in.
    _assign(_registry_lock=threading.Lock(), _settle_lock=threading.Lock(),
            _generation=_generation + 1,
            tally=[0] * TALLY_SLOTS, _tally_lock=threading.Lock(),
            _next_slot=FIRST_STACK_SLOT + 1)
    _swap_enter(_untallied_enter)
    ident = threading.get_ident()
    survivor = _thread_timer_stacks.get(ident)
    _all_stacks.clear()
    _thread_timer_stacks.clear()
    _local.__dict__.pop("stack", None)
    reseed_ids()
    if survivor is None:
        return thread_stack()
    survivor.pid = os.getpid()
    survivor.root.origin = (survivor.pid, survivor.tid)
    _mark_inherited(survivor.root)
    survivor.merged_gauge_counts = {name: g.count for name, g in survivor.gauges.items()}
    survivor.retired = TimerNode("root")
    survivor.unretired = deque()  # the parent's
    survivor.retired_gauges = {}
    survivor.dropped = 0
    survivor.fork_path = tuple(node.name for node in survivor.stack[1:])
    survivor.base = None
    survivor.trace = None
    survivor.top = OpenRoot(0)
    survivor.slot = FIRST_STACK_SLOT
    _thread_timer_stacks[ident] = survivor
    _all_stacks.append(survivor)
    return survivor


def _mark_inherited(node: TimerNode) -> None:
    node.merged_total = node.total
    node.merged_count = node.count
    node.gpu_total, node.gpu_count = 0.0, 0  # the parent's; ML-Agents' tree never shows them
    for child in node.children.values():
        _mark_inherited(child)


#: Stack traces already formatted, by `_error_key`: a block that keeps raising the same
#: exception from the same place (``queue.Empty`` from a ``get(timeout=...)`` inside a timed
#: wait, a Sample Factory inference worker's idle loop) formats it once, not at every exit.
_formatted_stacks: dict[tuple[Any, ...], str] = {}
_FORMATTED_STACKS_MAX = 256
#: Exception groups format their members too (Python 3.11+; none before).
_GROUPS: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(builtins, "BaseExceptionGroup", None),) if t is not None)


def _error_key(exc_type: type[BaseException], exc: BaseException | None,
               tb: TracebackType | None, message: str) -> tuple[Any, ...] | None:
    """What decides an exception's formatted text — its type, message and the code object and
    instruction of every traceback frame — or None where more does (a chained exception,
    notes, a group)."""
    if exc is None or exc.__cause__ is not None or exc.__context__ is not None or \
            getattr(exc, "__notes__", None) or isinstance(exc, _GROUPS):
        return None
    places: list[Any] = [exc_type, message]
    depth = 0
    while tb is not None:
        depth += 1
        if depth > 64:
            return None
        places.append(tb.tb_frame.f_code)
        places.append(tb.tb_lasti)  # the instruction: 3.11's carets mark its columns
        tb = tb.tb_next
    return tuple(places)


def _error_extra(exc_type: type[BaseException], exc: BaseException | None,
                 tb: TracebackType | None) -> Extra:
    try:
        message = str(exc) if exc is not None else ""
    except Exception:
        message = "<unprintable>"
    try:
        key = _error_key(exc_type, exc, tb, message)
    except Exception:
        key = None
    stack = _formatted_stacks.get(key) if key is not None else None
    if stack is None:
        import traceback

        try:
            stack = "".join(traceback.format_exception(exc_type, exc, tb))
        except Exception:  # a broken __str__ must not break the training loop
            stack = ""
        if key is not None and stack:
            if len(_formatted_stacks) >= _FORMATTED_STACKS_MAX:
                _formatted_stacks.clear()
            _formatted_stacks[key] = stack
    qualname = getattr(exc_type, "__qualname__", str(exc_type))
    module = getattr(exc_type, "__module__", "builtins")
    type_name = qualname if module == "builtins" else f"{module}.{qualname}"
    return {"error": (type_name, message, stack)}


# --- The timed block --------------------------------------------------------------------------

class hierarchical_timer:
    """Time a block of code; the block's `TimerNode` is the value of the ``with``.

    >>> with hierarchical_timer("update"):
    ...     pass

    After `otel_rl.configure()` the block is also a span named like the timer. With
    ``gpu=True`` (or a name the ``gpu_blocks`` setting matches; ``gpu=False`` opts out) its
    GPU time is measured too, with CUDA events (see `otel_rl._internal.gpu`).
    """

    __slots__ = ("_frames", "_gpu", "_gpu_opt", "_name", "_node", "_sid", "_st", "_stack",
                 "_start", "_tr", "_up")
    _gpu: Any  # GpuTimer's pending event pair
    _gpu_opt: bool  # an explicit gpu= choice, kept for the decorator form

    def __init__(self, name: str, timer_stack: TimerStack | None = None,
                 gpu: bool | None = None) -> None:
        self._name = name
        self._stack = timer_stack
        if gpu is not None:  # the one check GPU timing adds (see `use_gpu_blocks`)
            _gpu_opt_in(self, name, gpu)

    def __enter__(self) -> TimerNode:
        st = self._stack
        if st is None:
            try:
                st = _local.stack
            except AttributeError:
                st = thread_stack()
        name = self._name
        # The frames list is kept, not looked up again at exit: if the stack is reset (or
        # replaced after a fork) meanwhile, this block pops its own list, never the new one.
        frames = self._frames = st.stack
        children = frames[-1].children
        node = children.get(name)
        if node is None:
            node = children[name] = TimerNode(name)
        frames.append(node)
        self._node = node
        tr = st.trace
        if tr is not None:
            self._st = st
            self._up = st.top
            st.top = self
            self._sid = next(_ids)
        self._tr = tr
        self._start = perf_counter_ns()
        return node

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        end = perf_counter_ns()
        start = self._start
        node = self._node
        node.total += (end - start) * 1e-9
        node.count += 1
        self._frames.pop()
        tr = self._tr
        if tr is None:
            return
        st = self._st
        up = self._up
        st.top = up
        record = (self._sid, up._sid, self._name, start, end, st.tid, tr.trace_id,
                  None if exc_type is None else _error_extra(exc_type, exc, tb))
        sink = tr.sink
        held = len(sink)
        if held < buffer_cap:
            sink.append(record)
            if 0 < pack_at <= held and threading.get_ident() != full_skip:
                on_full(sink)  # type: ignore[misc]  # (set with pack_at)
        else:
            st.dropped += 1

    def __call__(self, func: FuncT) -> FuncT:
        """Use as a decorator too, like a `contextlib.contextmanager` object."""
        name, stack = self._name, self._stack
        gpu = getattr(self, "_gpu_opt", None)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with hierarchical_timer(name, stack, gpu):
                return func(*args, **kwargs)

        # The function's names (as contextlib's decorators do): pickle finds it by them.
        functools.update_wrapper(wrapped, func)
        return cast(FuncT, wrapped)


def _tallied_enter(self: hierarchical_timer) -> TimerNode:
    """`hierarchical_timer.__enter__` plus one store: the block's span id in `tally`, for a
    relaying worker (`use_tally`); the main process never pays for it. Line for line the same
    otherwise (`tests/faults/test_tally.py` compares the two)."""
    st = self._stack
    if st is None:
        try:
            st = _local.stack
        except AttributeError:
            st = thread_stack()
    name = self._name
    # The frames list is kept, not looked up again at exit: if the stack is reset (or
    # replaced after a fork) meanwhile, this block pops its own list, never the new one.
    frames = self._frames = st.stack
    children = frames[-1].children
    node = children.get(name)
    if node is None:
        node = children[name] = TimerNode(name)
    frames.append(node)
    self._node = node
    tr = st.trace
    if tr is not None:
        self._st = st
        self._up = st.top
        st.top = self
        tally[st.slot] = self._sid = next(_ids)
    self._tr = tr
    self._start = perf_counter_ns()
    return node


_untallied_enter = _plain_enter = hierarchical_timer.__enter__
_pure_exit = hierarchical_timer.__exit__


def use_stack_lookup(lookup: Callable[[], TimerStack] | None) -> None:
    """Blocks with no explicit stack take it from `lookup()` instead of this thread's (None:
    back to this thread's). `otel_rl.timers` calls this when a test patches its
    `_get_thread_timer`, as ML-Agents' own tests do; the plain hot path never pays for it."""
    if lookup is None:
        hierarchical_timer.__enter__ = _plain_enter  # type: ignore[method-assign]
        return

    def enter(self: hierarchical_timer) -> TimerNode:
        if self._stack is None:
            self._stack = lookup()
        return _plain_enter(self)

    hierarchical_timer.__enter__ = enter  # type: ignore[method-assign]


_said: set[str] = set()


def _say_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        log.warning("otel_rl: %s", message)


def _no_gpu_timing(timer: hierarchical_timer, name: str, gpu: bool | None) -> None:
    """Until `otel_rl.timers` plugs GPU timing in (on import): blocks are timed on the CPU,
    and the first that asks says so."""
    if gpu:
        _say_once("no-gpu-plugin", f"GPU time asked for block {name!r} before otel_rl.timers "
                                   "was imported (it plugs GPU timing in); timed on the CPU")


#: GPU timing's opt-in (``(timer, name, gpu)``), called by `hierarchical_timer.__init__` when
#: `gpu` is given or the `gpu_blocks` setting names blocks. A plugin above the recorder (`gpu`
#: subclasses the timer), so it is plugged in from above (`set_gpu_opt_in`), never imported.
_gpu_opt_in: Callable[[hierarchical_timer, str, bool | None], None] = _no_gpu_timing


def set_gpu_opt_in(opt_in: Callable[[hierarchical_timer, str, bool | None], None]) -> None:
    """Plug in GPU timing's opt-in (`otel_rl.timers`' loader of the `gpu` module)."""
    _assign(_gpu_opt_in=opt_in)


def keep_gpu_choice(timer: hierarchical_timer, gpu: bool) -> None:
    """Remember `timer`'s explicit ``gpu=`` choice (for its decorator form; `gpu.opt_in`)."""
    timer._gpu_opt = gpu


_plain_init = hierarchical_timer.__init__


def _init_with_gpu_blocks(self: hierarchical_timer, name: str,
                          timer_stack: TimerStack | None = None,
                          gpu: bool | None = None) -> None:
    self._name = name
    self._stack = timer_stack
    if gpu is not None or gpu_wanted.get(name, True):  # False: known not to match
        _gpu_opt_in(self, name, gpu)


def use_gpu_blocks(on: bool) -> None:
    """While the `gpu_blocks` setting names blocks, every block checks its name against it
    (cached per name in `gpu_wanted`, emptied here); otherwise blocks skip that check."""
    gpu_wanted.clear()
    plain = _compiled.get(_plain_init, _plain_init)
    hierarchical_timer.__init__ = _init_with_gpu_blocks if on else plain  # type: ignore[method-assign]


def set_retire_hook(hook: Callable[[TimerStack, TimerNode], None] | None) -> None:
    """Called by `TimerStack.reset` with the stack and its old root (GPU timing's hook)."""
    _assign(on_retire=hook)


def set_startup_argv(argv: str | None) -> None:
    """The command line as Python had it while starting (zero-code mode configures otel_rl
    before ``-m module`` rewrites sys.argv); `fix_argv` records the real one."""
    _assign(startup_argv=argv)


# --- The whole-run view of this process -------------------------------------------------------

def _add_own(stack: TimerStack, target: TreeNode) -> None:
    """Add what `stack` recorded itself since its last reset under `target` (its tree less what
    `merge` brought in; in a forked child, lifted out of the blocks open at the fork)."""
    if not stack.fork_path:
        stack.root.add_own_to(target)
        return
    own = TimerNode("root")
    stack.root.add_own_to(own)
    target.merge_children(own.lifted(stack.fork_path))


def _settle(stack: TimerStack) -> None:
    """Add the roots `stack.reset()` queued to `stack.retired`, oldest first. Any thread may
    call it (the owner as its queue fills, a reader before it reads `retired`): each root is
    taken off the queue once, and the lock keeps two threads from adding into `retired` at
    once."""
    unretired = stack.unretired
    if not unretired:
        return
    with _settle_lock:
        retired = stack.retired
        while True:
            try:
                root = unretired.popleft()
            except IndexError:
                return
            root.add_own_to(retired)


def _retire(stack: TimerStack) -> None:
    _add_own(stack, stack.retired)
    for name, gauge in stack.gauges.items():
        # What this stack set itself (not what `merge_gauges` copied in), by the one rule.
        mine = gauge.as_gauge(gauge.count - stack.merged_gauge_counts.get(name, 0))
        kept = stack.retired_gauges.get(name)
        if kept is None:
            stack.retired_gauges[name] = mine
        else:
            kept.merge(mine)


def stack_contribution(stack: TimerStack) -> TimerNode:
    """Everything `stack` recorded (its own blocks, resets included) as one root node."""
    result = TimerNode("root")
    _settle(stack)
    result.merge_children(stack.retired)
    _add_own(stack, result)
    return result


def reset_for_tests() -> None:
    """Forget every stack (tests only; never while blocks are open)."""
    _assign(_generation=_generation + 1, tally=[0] * TALLY_SLOTS)
    _swap_enter(_untallied_enter)
    with _registry_lock:
        _all_stacks.clear()
    _thread_timer_stacks.clear()
    if hasattr(_local, "stack"):
        del _local.stack


use_accelerator(accel.wanted())
