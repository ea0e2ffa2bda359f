"""Work that runs step by step, interleaved with other work on one thread, at a place of its own.

A coroutine on an event loop (a Ray async actor's call, a coroutine handed to another thread's
loop) or a generator iterated by someone else (Ray's streaming calls) runs in steps between
which the thread runs other things. Its blocks must hang under the place it came from, and
none of them under another's: it gets a stack of its own at that place for its whole run
(`Leased`), made active around each of its steps only (`step`, `steps`).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

from otel_rl._internal import recorder, runtime
from otel_rl._internal.recorder import Base, TimerStack


class Leased:
    """A stack of this thread of its own at `base`'s place, for the ``with`` body (one
    coroutine's or generator's whole run: two interleaved ones from the same place must not
    share one); None where otel_rl is off by then."""

    __slots__ = ("base", "key", "stack")

    def __init__(self, base: Base) -> None:
        self.base = base
        self.key = (base.path, base.pid, base.tid)
        self.stack: TimerStack | None = None

    def __enter__(self) -> TimerStack | None:
        rt = runtime.active()
        if rt is not None:
            self.stack = recorder.lease_task_stack(self.key)
            rt.adopt(self.stack, base=self.base)
        return self.stack

    def __exit__(self, *exc: object) -> None:
        if self.stack is not None:
            recorder.give_back_task_stack(self.key, self.stack)
            self.stack = None


class _Yielded:
    """Hands one value a coroutine yielded to the event loop, and the loop's answer back."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self.value)


#: `step`'s `error` that closes the generator instead (an early close: its clean-up runs at its
#: place too).
CLOSE = GeneratorExit()


def step(it: Any, stack: TimerStack | None, value: Any, error: BaseException | None) -> Any:
    """One step of the coroutine or generator `it` (``send(value)``, ``throw(error)``, or
    ``close()`` for `CLOSE`) with `stack` active around it only (None: as it stands)."""
    previous = recorder.set_active_stack(stack) if stack is not None else None
    try:
        if error is None:
            return it.send(value)
        return it.close() if error is CLOSE else it.throw(error)
    finally:
        if stack is not None:
            recorder.set_active_stack(previous)


async def steps(coro: Coroutine[Any, Any, Any], stack: TimerStack | None) -> Any:
    """Run `coro` with `stack` active around each of its steps only."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = step(coro, stack, value, error)
        except StopIteration as stop:
            return stop.value
        try:
            value, error = await _Yielded(yielded), None
        except BaseException as exc:  # cancellation: passed into the coroutine
            value, error = None, exc


async def at_place(coro: Coroutine[Any, Any, Any], base: Base) -> Any:
    """`coro` run on a stack of its own at `base`'s place (on whichever thread runs it)."""
    with Leased(base) as stack:
        return await steps(coro, stack)
