"""A drop-in for ``mlagents_envs.timers``: the same names, semantics and ``get_timer_tree()``.

>>> from otel_rl.timers import hierarchical_timer, timed, get_timer_tree
>>> @timed
... def step():
...     pass
>>> with hierarchical_timer("advance"):
...     step()
>>> get_timer_tree()["children"]["advance"]["children"]["step"]["count"]
1

Without `otel_rl.configure()` this behaves exactly like ML-Agents' module. After it, every
block is also a span (child of the enclosing block), and the whole-run ``timers.json`` written
at shutdown covers every thread and worker process.

`get_timer_tree()` keeps ML-Agents' in-process meaning: the current thread's stack only, with
whatever the program merged into it itself (ML-Agents merges its env workers' roots under
``workers``). The whole-run ``timers.json`` instead gathers every thread and process directly,
leaves out what was merged by hand (so nothing is counted twice), and keeps data across
`reset_timers()`.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, TypeVar, overload

from otel_rl._internal.recorder import (
    TIMER_FORMAT_VERSION,
    GaugeNode,
    TimerNode,
    TimerStack,
    hierarchical_timer,
    set_gpu_opt_in,
    stack_of_thread,
    thread_stack,
    use_stack_lookup,
)
from otel_rl._internal.shapes import TimersDict

__all__ = [
    "TIMER_FORMAT_VERSION",
    "GaugeNode",
    "TimerNode",
    "TimerStack",
    "add_metadata",
    "get_timer_root",
    "get_timer_stack_for_thread",
    "get_timer_tree",
    "hierarchical_timer",
    "merge_gauges",
    "reset_timers",
    "set_gauge",
    "timed",
]

FuncT = TypeVar("FuncT", bound=Callable[..., Any])

#: What ML-Agents names a block timed by a @timed stacked on another (its wrapper's qualname).
_STACKED_NAME = "timed.<locals>.wrapped"


def _gpu_opt_in(timer: hierarchical_timer, name: str, gpu: bool | None) -> None:
    from otel_rl._internal import gpu as gpu_timing  # loaded when a block first asks for it

    gpu_timing.opt_in(timer, name, gpu)


# GPU timing subclasses the recorder's timer, so the recorder cannot import it; the timer's
# public face plugs it in (every block, Sample Factory's and the integrations' too, is made
# through this module).
set_gpu_opt_in(_gpu_opt_in)


#: ML-Agents' name for the current thread's stack (the recorder's function itself: ML-Agents'
#: env workers call `get_timer_root` and `reset_timers` every step).
_get_thread_timer = thread_stack


_original_get_thread_timer = _get_thread_timer


class _TimersModule(types.ModuleType):
    """ML-Agents' tests patch ``timers._get_thread_timer`` to time into a stack of their own;
    replacing it here re-routes blocks without a stack (and the helpers below) to it."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "_get_thread_timer":
            use_stack_lookup(None if value is _original_get_thread_timer else value)


sys.modules[__name__].__class__ = _TimersModule


def get_timer_stack_for_thread(t: threading.Thread) -> TimerStack | None:
    """The stack of thread `t`, or None if it has not timed anything (or has not started)."""
    if t.ident is None:
        return None
    return stack_of_thread(t.ident)


@overload
def timed(func: FuncT, *, gpu: bool | None = None) -> FuncT: ...


@overload
def timed(*, gpu: bool | None = None) -> Callable[[FuncT], FuncT]: ...


def timed(func: FuncT | None = None, *, gpu: bool | None = None) -> Any:
    """Decorator: time every call of `func` under the name ``func.__qualname__``.

    >>> class Trainer:
    ...     @timed
    ...     def update(self): ...

    ``@timed(gpu=True)`` also measures the calls' GPU time (an otel_rl extension; see
    `hierarchical_timer`).
    """
    if func is None:
        return lambda f: timed(f, gpu=gpu)
    # ML-Agents names a block after the function; a @timed on top of another after the inner
    # wrapper, whose __qualname__ there is "timed.<locals>.wrapped". Ours carries the function's
    # own __qualname__ instead, so that pickle finds it by name (a spawn pool's task).
    name = _STACKED_NAME if getattr(func, "_otel_rl_timed", False) else func.__qualname__

    if gpu is None:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with hierarchical_timer(name):
                return func(*args, **kwargs)
    else:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with hierarchical_timer(name, None, gpu):
                return func(*args, **kwargs)

    functools.update_wrapper(wrapped, func)
    wrapped._otel_rl_timed = True  # type: ignore[attr-defined]
    return wrapped


def set_gauge(name: str, value: float, timer_stack: TimerStack | None = None) -> None:
    """Set gauge `name` to `value` (NaN is ignored), tracking its min, max and count."""
    (timer_stack or _get_thread_timer()).set_gauge(name, value)


def merge_gauges(gauges: dict[str, GaugeNode], timer_stack: TimerStack | None = None) -> None:
    """Merge gauges from another stack into `timer_stack` (default: this thread's)."""
    (timer_stack or _get_thread_timer()).merge_gauges(gauges)


def add_metadata(key: str, value: str, timer_stack: TimerStack | None = None) -> None:
    """Record a metadata key/value pair (written under ``metadata`` in timers.json)."""
    (timer_stack or _get_thread_timer()).add_metadata(key, value)


def get_timer_tree(timer_stack: TimerStack | None = None) -> TimersDict:
    """The tree of timings of `timer_stack` (default: this thread's) as a dict."""
    return (timer_stack or _get_thread_timer()).get_timing_tree()


def get_timer_root(timer_stack: TimerStack | None = None) -> TimerNode:
    """The root `TimerNode` of `timer_stack` (default: this thread's), total updated."""
    return (timer_stack or _get_thread_timer()).get_root()


def reset_timers(timer_stack: TimerStack | None = None) -> None:
    """Start `timer_stack` (default: this thread's) over. The whole-run tree keeps the data."""
    (timer_stack or _get_thread_timer()).reset()
