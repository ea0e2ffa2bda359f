"""Drop-in for Sample Factory's ``sample_factory.utils.timing`` (Sample Factory 2.x).

Same names and the same results as Sample Factory's own module: `Timing` is a dict with
attribute access whose values are the latest (`timeit`), accumulated (`add_time`) or
moving-average (`time_avg`) wall-clock durations; `tree_str()` shows the same numbers nested the
way the blocks were nested. Replace the import and nothing else changes::

    from otel_rl.timing import Timing          # was: from sample_factory.utils.timing import Timing

    timing = Timing("learner")
    with timing.add_time("train"):
        with timing.timeit("forward"):
            ...
    print(timing.tree_str())

What it adds: every timed block is also an `otel_rl.timers.hierarchical_timer` block named like
its key, so after `otel_rl.configure()` it is a span nested under whatever block is open in the
thread, and it counts in the whole-run tree. That bridge never changes Timing's own numbers, and
when it fails Timing carries on (the failure is logged once).

Unlike Sample Factory's module, importing this one imports neither torch nor psutil.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import time
import typing
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from otel_rl._internal import accel, recorder
from otel_rl._internal.recorder import set_active_stack
from otel_rl.timers import hierarchical_timer

__all__ = [
    "EPS",
    "AttrDict",
    "AvgTime",
    "Timing",
    "TimingContext",
    "TimingTreeNode",
    "init_global_profiler",
]

#: Floor on every measurement (Sample Factory's ``sample_factory.algo.utils.misc.EPS``), so a
#: block never reports zero time and rates derived from it never divide by zero.
EPS = 1e-8

#: Sample Factory's logger (``sample_factory.utils.utils.log``), looked up by name so that
#: handlers Sample Factory installs on it apply here too.
log = logging.getLogger("rl")

_logger = logging.getLogger("otel_rl")

#: Set by `init_global_profiler` (Sample Factory defines it only then, too).
TIMING: Timing


class _Block(Protocol):
    def __enter__(self) -> object: ...

    def __exit__(
        self,
        type_: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None: ...


#: Makes the otel_rl block each Timing block is mirrored into; None disables the mirroring.
#: Called with the key, plus ``gpu=`` for a block opted in or out of GPU timing.
_block_factory: Callable[..., _Block] | None = hierarchical_timer
_bridge_failed = False


def _bridge_error(exc: BaseException) -> None:
    # Telemetry must never break training: a failing bridge is reported once and skipped.
    global _bridge_failed
    if not _bridge_failed:
        _bridge_failed = True
        _logger.warning(
            "otel_rl: mirroring a Sample Factory Timing block failed (%s: %s); Timing's own "
            "results are unaffected, further failures are not reported",
            type(exc).__name__,
            exc,
        )


class AttrDict(dict[str, Any]):
    """A dict whose keys can also be read and written as attributes (Sample Factory's AttrDict).

    A key shadows a method or attribute of the same name on reads; every attribute write is a
    key write.
    """

    __setattr__ = dict.__setitem__  # type: ignore[assignment]

    def __getattribute__(self, item: str) -> Any:
        if item in self:
            return self[item]
        return super().__getattribute__(item)


class AvgTime:
    """Moving average over the last ``num_values_to_avg`` measurements (``str`` shows it)."""

    __slots__ = ("values",)

    def __init__(self, num_values_to_avg: int | None) -> None:
        self.values: deque[float] = deque(maxlen=num_values_to_avg)

    def __str__(self) -> str:
        avg_time = sum(self.values) / max(1, len(self.values))
        return f"{avg_time:.4f}"

    # Explicit state, as Sample Factory's instance dict: slotted classes pickle with every
    # protocol only then.
    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.values}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.values = state["values"]


@dataclass
class TimingTreeNode:
    """One key at one nesting depth: its time (as in the flat dict) and its nested keys."""

    self_time: float | AvgTime = 0
    timing: typing.OrderedDict[str, Any] = dataclasses.field(
        default_factory=collections.OrderedDict
    )


_PICKLED_CONTEXT_STATE = (
    "timing_tree_node",
    "_timing",
    "_key",
    "_additive",
    "_average",
    "_time_enter",
    "_time",
)


#: `TimingContext._swap` when the block did not switch the thread to a component's stack.
_NO_SWAP = object()


#: `otel_rl._internal.components`, once otel_rl has been configured in this process.
_components: Any = None


def _enter_component(timing: Timing) -> Any:
    """Switch this thread to the component stack of `timing` (see `otel_rl._internal.
    components`) for one of its top-level blocks; returns the stack to switch back to."""
    components = _components
    if components is None:
        runtime = sys.modules.get("otel_rl._internal.runtime")
        if runtime is None or runtime.current() is None:
            return _NO_SWAP  # otel_rl not configured: nothing to place
        components = _load_components()
    return components.switch_to(str(dict.get(timing, "_name", "")), _NO_SWAP)


def _load_components() -> Any:
    global _components
    from otel_rl._internal import components

    _components = components
    return components


class TimingContext:
    """One timed block of a `Timing`; made by `Timing.timeit`/`add_time`/`time_avg`.

    As in Sample Factory, entering it yields None, its place in the tree is fixed when it is
    made (under the block open at that moment), and leaving it records the time even when the
    block raised.
    """

    # Sample Factory's attribute names, kept so code reading them keeps working; the last two
    # are the otel_rl block this one is mirrored into (and any outer one when re-entered).
    __slots__ = (
        "_additive",
        "_average",
        "_block",
        "_gpu",
        "_key",
        "_outer_blocks",
        "_swap",
        "_time",
        "_time_enter",
        "_timing",
        "timing_tree_node",
    )

    def __init__(
        self,
        timing: Timing,
        key: str,
        additive: bool = False,
        average: int | None = None,
        gpu: bool | None = None,
    ) -> None:
        self.timing_tree_node: TimingTreeNode | None = None
        self._timing = timing
        self._key = key
        self._additive = additive
        self._average = average
        self._time_enter: float | None = None
        self._time: float = 0
        self._block: _Block | None = None
        self._outer_blocks: list[_Block | None] | None = None
        self._gpu = gpu
        self._swap: Any = _NO_SWAP

    def __getstate__(self) -> dict[str, Any]:
        # Sample Factory's attributes (and an explicit GPU choice): a mirror block is live
        # state of this process.
        state = {name: getattr(self, name) for name in _PICKLED_CONTEXT_STATE}
        if self._gpu is not None:
            state["_gpu"] = self._gpu
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._gpu = None
        for name, value in state.items():
            setattr(self, name, value)
        self._block = None
        self._outer_blocks = None
        self._swap = _NO_SWAP

    def set_tree_node(self, node: TimingTreeNode) -> None:
        self.timing_tree_node = node

    def initial_value(self) -> float | AvgTime:
        if self._average is not None:
            return AvgTime(num_values_to_avg=self._average)
        return 0.0

    def _record_measurement(self, key: str, value: float) -> None:
        node: Any = self.timing_tree_node
        if self._additive:
            self._timing[key] += value
            node.self_time += value
        elif self._average is not None:
            self._timing[key].values.append(value)
            node.self_time.values.append(value)
        else:
            self._timing[key] = value
            node.self_time = value

    def __enter__(self) -> None:
        factory = _block_factory
        if factory is not None:
            if self._block is not None:
                # The same context re-entered while open (recursion): keep the outer block to
                # close after this one.
                if self._outer_blocks is None:
                    self._outer_blocks = []
                self._outer_blocks.append(self._block)
                self._block = None
            try:
                if len(dict.__getitem__(self._timing, "_open_contexts_stack")) == 1:
                    self._swap = _enter_component(self._timing)
                gpu = self._gpu
                block = factory(self._key) if gpu is None else factory(self._key, gpu=gpu)
                block.__enter__()
                self._block = block
            except Exception as exc:
                _bridge_error(exc)
        # Measured after the mirror block opened, so its cost stays out of Timing's numbers.
        self._time_enter = time.time()
        dict.__getitem__(self._timing, "_open_contexts_stack").append(self)

    def __exit__(
        self,
        type_: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            time_passed = max(time.time() - self._time_enter, EPS)  # type: ignore[operator]
            self._record_measurement(self._key, time_passed)
            dict.__getitem__(self._timing, "_open_contexts_stack").pop()
        finally:
            # Also when recording raised (as it does in Sample Factory, e.g. `add_time` on a key
            # first used by `time_avg`): the mirror block must close to keep its stack balanced.
            block = self._block
            if block is not None:
                outer = self._outer_blocks
                self._block = outer.pop() if outer else None
                try:
                    block.__exit__(type_, value, traceback)
                except Exception as exc:
                    _bridge_error(exc)
            swap = self._swap
            if swap is not _NO_SWAP:
                self._swap = _NO_SWAP
                set_active_stack(swap)


class Timing(AttrDict):
    """Named wall-clock timings of code blocks, readable as ``timing[key]`` or ``timing.key``.

    ``timeit(key)`` keeps the latest duration, ``add_time(key)`` the sum, ``time_avg(key, n)``
    the average of the last ``n``. Like Sample Factory's, the dict also holds the entries
    ``_name``, ``_root_context`` and ``_open_contexts_stack``, and one Timing is not meant to be
    shared between threads.
    """

    def __init__(self, name: str = "Profile", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

        self._name = name

        self._root_context = TimingContext(self, "~")
        self._root_context.set_tree_node(TimingTreeNode())
        self._open_contexts_stack = [self._root_context]

    def _push_context(self, ctx: TimingContext) -> TimingContext:
        self._open_contexts_stack.append(ctx)
        return ctx

    def _init_context(self, key: str, *args: Any, **kwargs: Any) -> TimingContext:
        ctx = TimingContext(self, key, *args, **kwargs)
        if key not in self:
            self[key] = ctx.initial_value()

        parent_ctx = dict.__getitem__(self, "_open_contexts_stack")[-1]
        parent_tree_node = parent_ctx.timing_tree_node
        if key not in parent_tree_node.timing:
            parent_tree_node.timing[key] = TimingTreeNode(ctx.initial_value())

        ctx.timing_tree_node = parent_tree_node.timing[key]
        return ctx

    def timeit(self, key: str, gpu: bool | None = None) -> TimingContext:
        """Time a block; the value is its latest duration in seconds.

        ``gpu=True`` (an otel_rl extension, in all three methods) also measures the block's
        GPU time, in otel_rl's spans and timers.json; Timing's own values stay wall-clock.
        """
        return self._init_context(key, gpu=gpu)

    def add_time(self, key: str, gpu: bool | None = None) -> TimingContext:
        """Time a block; the value is the sum of its durations in seconds."""
        return self._init_context(key, additive=True, gpu=gpu)

    def time_avg(self, key: str, average: int = 10, gpu: bool | None = None) -> TimingContext:
        """Time a block; the value is an `AvgTime` over its last ``average`` durations."""
        return self._init_context(key, average=average, gpu=gpu)

    @staticmethod
    def _time_str(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    def flat_str(self) -> str:
        """``key: value`` for every entry (``_name`` included, as in Sample Factory)."""
        # skip data members of Timing
        skip_names = ["_root_context", "_open_contexts_stack"]

        s = []
        for key, value in self.items():
            if key not in skip_names:
                s.append(f"{key}: {self._time_str(value)}")
        return ", ".join(s)

    @classmethod
    def _tree_str_func(cls, node: TimingTreeNode, depth: int) -> list[str]:
        indent = " " * 2 * depth

        def node_str(k: str, node_: TimingTreeNode) -> str:
            return f"{k}: {cls._time_str(node_.self_time)}"

        # Leaves of a level share one line, first; then each key with children, then its level.
        tokens = [node_str(k, v) for k, v in node.timing.items() if not v.timing]

        lines = []
        if tokens:
            lines.append(f"{indent}{', '.join(tokens)}")

        for key, child_node in node.timing.items():
            if child_node.timing:
                lines.append(f"{indent}{node_str(key, child_node)}")
                lines.extend(cls._tree_str_func(child_node, depth + 1))

        return lines

    def tree_str(self) -> str:
        """The timings nested as the blocks were, under a ``<name> tree view:`` header."""
        lines = [f"{self._name} tree view:"]
        lines.extend(self._tree_str_func(self._root_context.timing_tree_node, 0))  # type: ignore[arg-type]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.tree_str()


#: The methods `_timingacc.c` compiles, in the order its ``install`` takes them: the class
#: each lives on, its name and the pure function.
_PURE: list[tuple[type, str, Any]] = [
    (cls, name, cls.__dict__[name])
    for cls, name in (
        (AttrDict, "__getattribute__"),
        (Timing, "timeit"),
        (Timing, "add_time"),
        (Timing, "time_avg"),
        (TimingContext, "__init__"),
        (TimingContext, "__enter__"),
        (TimingContext, "__exit__"),
    )
]


#: The compiled Timing's failure to install, once it was reported.
_warned: list[Exception] = []


def _use_accelerator(on: bool) -> bool:
    """Run Timing's common path compiled (`otel_rl/_internal/_timingacc.c`, the same results)
    when `on` and it is built, else the pure Python above; whether the compiled one is in use.
    Follows the ``accelerator`` setting (`recorder.use_accelerator` calls it); safe between
    blocks and while some are open: both paths keep the same slots."""
    module = accel.compiled("_timingacc") if on else None
    compiled: dict[Any, Any] = {}
    if module is not None:
        try:
            compiled = module.install(AttrDict, Timing, TimingContext, globals(),
                                      *(pure for _, _, pure in _PURE))
        except Exception as exc:  # a build that does not fit this module: stay pure
            if not _warned:  # once per process, not at every `configure`
                _warned.append(exc)
                _logger.warning("otel_rl: the compiled Timing does not load (%s: %s); Timing "
                                "runs pure Python", type(exc).__name__, exc)
    for cls, name, pure in _PURE:
        setattr(cls, name, compiled.get(pure, pure))
    return accelerated()


def accelerated() -> bool:
    """Whether Timing's blocks run the compiled path (the classes hold its methods)."""
    return all(cls.__dict__[name] is not pure for cls, name, pure in _PURE)


recorder.accelerator_hooks.append(_use_accelerator)
_use_accelerator(recorder.accelerator_on())


def init_global_profiler(t: Timing) -> None:
    """This is for debugging purposes. Normally prefer to pass it around."""
    global TIMING
    try:
        # psutil only here, as in Sample Factory's log line, but never at import time.
        import importlib

        process: object = importlib.import_module("psutil").Process()
    except ImportError:
        import os

        process = f"pid={os.getpid()}"
    log.info("Setting global profiler in process %r", process)
    TIMING = t
