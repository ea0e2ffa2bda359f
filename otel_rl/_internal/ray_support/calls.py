"""A Ray call carries the caller's context: made at ``.remote()``, attached where it runs.

Submit side (driver and workers alike): `RemoteFunction._remote`, `ActorMethod._remote` and
`ActorClass._remote` add one keyword argument, `_shim.KEY`, holding the block open on the
calling thread; Ray's `flatten_args` takes it out before checking the call against the
function's signature and appends it to the flat argument list after, so signatures are
never changed or checked differently. Execute side (a worker that joined the run): the
executors Ray looks up with `FunctionActorManager.get_execution_info` are wrapped; the
wrapper removes the argument and runs the call on a stack whose top-level blocks hang under
the caller's block (the same `TimerStack`-per-place scheme as `propagation.attach_context`).
Coroutines (async actors) are stepped with that stack made active around each step only,
so interleaved calls on one event loop each keep their own caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from otel_rl._internal import carrier, recorder, runtime
from otel_rl._internal.recorder import Base, TimerStack
from otel_rl._internal.runtime import Runtime

#: The keyword argument a call's context travels in (removed before the function runs);
#: `_shim.KEY` repeats it (the shim imports nothing of otel_rl).
KEY = "__otel_rl_ctx__"
_SEP = "\x1f"
_VERSION = "1"

# --- the carrier: one string, cheap to make and to ship --------------------------------------
_made = threading.local()


def carrier_now() -> bytes | None:
    """The current block's context as a call carrier; None while otel_rl does not propagate.
    Bytes: Ray serializes them several times faster than a str (~0.5 vs ~2.4 µs here)."""
    rt = runtime.active()
    if rt is None or not rt.settings.propagate:
        return None
    st = recorder.thread_stack()
    top = st.top
    cached = getattr(_made, "last", None)
    # Keyed by the open block's timer and its span id (a timer object entered again is a
    # new span) and the stack.
    if (cached is not None and cached[0] is top and cached[1] is st
            and cached[3] == top._sid):
        return cached[2]  # type: ignore[no-any-return]
    _, base, path = runtime.current_base(rt)
    trace = st.trace or base.trace or rt.trace
    span = st.span or base.span_id or rt.run_span_id
    sampled = trace.sink is rt.pipeline.buffer and rt.spans_on
    value = _SEP.join((_VERSION, f"{trace.trace_id:x}", f"{span:x}", f"{rt.pid:x}",
                       f"{st.tid:x}", "1" if sampled else "0", *path)).encode("utf-8")
    _made.last = (top, st, value, top._sid)
    return value


def parse(value: object) -> tuple[int, int, int, int, bool, tuple[str, ...]] | None:
    """(trace id, span id, pid, thread id, sampled, path) of a call carrier; None if it is
    not one."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    parts = value.split(_SEP)
    if len(parts) < 6 or parts[0] != _VERSION:
        return None
    try:
        trace_id, span_id, pid, tid = (int(p, 16) for p in parts[1:5])
    except ValueError:
        return None
    return trace_id, span_id, pid, tid, parts[5] == "1", tuple(parts[6:])


# --- submit side ----------------------------------------------------------------------------------
_original: dict[str, Any] = {}


class internal:
    """Ray calls made in the ``with`` body are otel_rl's own (delivery, collection): they
    carry no context and are not counted as the program's calls."""

    def __enter__(self) -> None:
        _made.internal = getattr(_made, "internal", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _made.internal -= 1


def _with_carrier(kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    if getattr(_made, "internal", 0) or threading.current_thread().name.startswith("otel_rl-"):
        return kwargs  # otel_rl's own calls (its threads deliver and collect)
    try:
        value = carrier_now()
    except Exception:
        return kwargs
    if value is None:
        return kwargs
    kwargs = {} if kwargs is None else dict(kwargs)
    kwargs[KEY] = value
    return kwargs


def _patched_flatten_args(signature_parameters: Any, args: Any, kwargs: Any) -> Any:
    handed = kwargs.pop(KEY, None) if kwargs and KEY in kwargs else None
    if handed is not None and not args and not kwargs and not signature_parameters:
        return [KEY, handed]  # Ray's own no-argument shortcut (nothing to check), plus ours
    flat = _original["flatten_args"](signature_parameters, args, kwargs)
    if handed is not None:
        flat += [KEY, handed]
    return flat


def _submit_wrapper(name: str) -> Callable[..., Any]:
    original = _original[name]

    def _remote(self: Any, args: Any = None, kwargs: Any = None, *rest: Any,
                **options: Any) -> Any:
        if not _cross_language(self) and not _client_mode():
            kwargs = _with_carrier(kwargs)
        return original(self, args, kwargs, *rest, **options)

    _remote.__name__ = original.__name__
    _remote.__doc__ = original.__doc__
    _remote.__wrapped__ = original  # type: ignore[attr-defined]
    return _remote


def _cross_language(target: Any) -> bool:
    """A call to Java or C++ takes no keyword arguments: it carries no context."""
    try:
        actor = getattr(target, "_actor", None)  # an ActorMethod's handle
        meta = getattr(target, "__ray_metadata__", None)  # an ActorClass's metadata
        return bool(getattr(target, "_is_cross_language", False)
                    or getattr(actor, "_ray_is_cross_language", False)
                    or getattr(meta, "is_cross_language", False))
    except Exception:
        return True


def _client_mode() -> bool:
    should_convert = _original.get("client_mode")
    if should_convert is None:
        return True
    try:
        return bool(should_convert())
    except Exception:
        return True


def patch_submit() -> None:
    """Make every task, actor creation and actor method call carry the caller's context."""
    if _original:
        return
    import ray._common.signature as signature
    import ray.actor
    import ray.remote_function
    from ray._private.client_mode_hook import client_mode_should_convert

    _original["client_mode"] = client_mode_should_convert
    _original["flatten_args"] = signature.flatten_args
    signature.flatten_args = _patched_flatten_args
    for key, owner in (("task", ray.remote_function.RemoteFunction),
                       ("method", ray.actor.ActorMethod), ("actor", ray.actor.ActorClass)):
        _original[key] = owner._remote
        owner._remote = _submit_wrapper(key)


# --- execute side ---------------------------------------------------------------------------------
#: Parsed carriers (a worker sees the same few callers' blocks over and over).
_bases: dict[bytes, Base] = {}
running = 0  # calls running now in this process (read by the delivery, for loss accounting)
started = 0  # calls started so far
_running_lock = threading.Lock()
#: Called at the start of each call (the delivery's idle -> busy notice); set by `worker`.
on_call_start: Callable[[], None] | None = None
#: Called with (actor instance) when an actor's __init__ runs with context (its role).
on_actor: Callable[[Any], None] | None = None
#: Called when an actor's __init__ raises (the actor dies with it: deliver first).
on_init_failed: Callable[[], Any] | None = None


def calls_running() -> int:
    return running


def calls_started() -> int:
    return started


def _base_of(rt: Runtime, value: bytes) -> Base | None:
    base = _bases.get(value)
    if base is not None and base.trace is not None:
        return base
    parsed = parse(value)
    if parsed is None:
        return None
    trace_id, span_id, pid, tid, sampled, path = parsed
    if trace_id == rt.trace.trace_id:
        trace = rt.trace
    else:
        ctx = carrier.Context(trace_id, span_id, sampled)
        trace = rt.remote_trace(ctx)
    base = Base(trace, span_id, path, pid, tid)
    if len(_bases) > 4096:
        _bases.clear()
    _bases[value] = base
    return base


def _stack_for(rt: Runtime, base: Base) -> TimerStack:
    stack = recorder.task_stack((base.path, base.pid, base.tid))
    stack.base = base
    rt.adopt(stack)
    return stack


def _started() -> None:
    global running, started
    with _running_lock:
        running += 1
        started += 1
    hook = on_call_start
    if hook is not None:
        try:
            hook()
        except Exception:
            pass


def _ended() -> None:
    global running
    with _running_lock:
        running -= 1


def wrap_executor(executor: Callable[..., Any]) -> Callable[..., Any]:
    """`executor` (a task's function or an actor method's executor) taking the context
    argument off and running inside the caller's block."""
    is_init = getattr(executor, "name", None) == "__init__"

    def run(*args: Any, **kwargs: Any) -> Any:
        handed = kwargs.pop(KEY, None)
        rt = runtime.active()
        base = _base_of(rt, handed) if rt is not None and isinstance(handed, bytes) else None
        if base is None or rt is None:
            return executor(*args, **kwargs)
        stack = _stack_for(rt, base)
        _started()
        previous = recorder.set_active_stack(stack)
        ended = True
        try:
            if is_init and args and on_actor is not None:
                try:
                    on_actor(args[0])
                except Exception:
                    pass
            result = executor(*args, **kwargs)
            if isinstance(result, Coroutine):
                ended = False
                return _stepped(result, stack)
            return result
        except BaseException:
            if is_init:  # the actor dies with its constructor: deliver what it holds first
                _flush_quietly()
            raise
        finally:
            recorder.set_active_stack(previous)
            if ended:
                _ended()

    run.__dict__.update(getattr(executor, "__dict__", {}))
    run.__name__ = getattr(executor, "__name__", "run")
    run.__qualname__ = getattr(executor, "__qualname__", "run")
    return run


def _flush_quietly() -> None:
    hook = on_init_failed
    if hook is not None:
        try:
            hook()
        except Exception:
            pass


class _Step:
    """Hands one value a coroutine yielded to the event loop, and the loop's answer back."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self.value)


async def _stepped(coro: Coroutine[Any, Any, Any], stack: TimerStack) -> Any:
    """Run `coro` with `stack` active around each of its steps only."""
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            previous = recorder.set_active_stack(stack)
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                recorder.set_active_stack(previous)
            try:
                value, error = await _Step(yielded), None
            except BaseException as exc:  # cancellation: passed into the call
                value, error = None, exc
    finally:
        _ended()


def patch_execute() -> None:
    """In a worker of the run: wrap the executors of every call it runs."""
    import ray._private.function_manager as fm

    cls = fm.FunctionActorManager
    original = cls.get_execution_info
    if getattr(original, "_otel_rl", False):
        return
    wrapped: dict[int, tuple[Any, Any]] = {}

    def get_execution_info(self: Any, job_id: Any, function_descriptor: Any) -> Any:
        info = original(self, job_id, function_descriptor)
        function = info.function
        known = wrapped.get(id(function))
        if known is None or known[0] is not function:
            known = wrapped[id(function)] = (function, wrap_executor(function))
        return info._replace(function=known[1])

    get_execution_info._otel_rl = True  # type: ignore[attr-defined]
    cls.get_execution_info = get_execution_info  # type: ignore[method-assign]
