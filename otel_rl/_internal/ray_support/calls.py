"""A Ray call carries the caller's context: made at ``.remote()``, attached where it runs.

Submit side (driver and workers alike): task calls (`RemoteFunction._remote`) and actor
method calls (`ActorMethod._remote`) carry the block open on the calling thread in the
call's *task name*, a string every Ray task already ships: ``<name><MARK><carrier>``, where
``<name>`` is the name the program gave (``.options(name=...)``) or Ray's default one
(``f``, ``Class.method``). An extra argument would cost far more: any argument takes a
no-argument call off Ray's fast path (+14..+36 µs per call measured here, against ~0 for a
longer name). Actor creations (`ActorClass._remote`: there the name is the actor's
registered name) add one keyword argument, `_shim.KEY`, instead; Ray's `flatten_args` takes
it out before checking the call against the function's signature and appends it to the flat
argument list after, so signatures are never changed or checked differently.

Execute side (a worker that joined the run): the executors Ray looks up with
`FunctionActorManager.get_execution_info` are wrapped; the wrapper takes the carrier off the
task's name (or the argument), gives Ray's log prefix and process title and
``get_task_name()`` the program's name back, and runs the call on a stack whose top-level
blocks hang under the caller's block (the same `TimerStack`-per-place scheme as
`propagation.attach_context`). Coroutines (async actors) are stepped with that stack made
active around each step only, so interleaved calls on one event loop each keep their own
caller; generators (Ray's streaming generator tasks and methods, sync or async: their body runs
as Ray iterates them, after the call has returned) the same way, step by step. What the name
change leaves visible: Ray's dashboard and state API (``ray list
tasks``) list such calls under the longer name.
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from types import AsyncGeneratorType, GeneratorType
from typing import Any

from otel_rl._internal import carrier, recorder, runtime, stepping
from otel_rl._internal.recorder import Base, TimerStack
from otel_rl._internal.runtime import Runtime

#: The keyword argument a call's context travels in (removed before the function runs);
#: `_shim.KEY` repeats it (the shim imports nothing of otel_rl).
KEY = "__otel_rl_ctx__"
#: What separates the program's task name from the carrier in a call's task name.
MARK = "\x1fotel_rl\x1f"
#: The environment variable an actor created through Ray Client finds its creator's context
#: in (`client.ENV`).
CLIENT_ENV = "OTEL_RL_RAY_CALL"
_SEP = "\x1f"
_VERSION = "1"

# --- the carrier: one string, cheap to make and to ship --------------------------------------
_made = threading.local()


def carrier_text() -> str | None:
    """The current block's context as a call carrier; None while otel_rl does not propagate."""
    rt = runtime.active()
    if rt is None or not rt.settings.propagate:
        return None
    st = recorder.thread_stack()
    top = st.top
    cached = getattr(_made, "last", None)
    # Keyed by the open block's timer and its span id (a timer object entered again is a
    # new span) and the stack.
    if (cached is not None and cached[0] is top and cached[1] is st
            and cached[3] == st.span):
        return cached[2]  # type: ignore[no-any-return]
    _, base, path = runtime.current_base(rt)
    trace = st.trace or base.trace or rt.trace
    span = st.span or base.span_id or rt.run_span_id
    sampled = trace.sink is rt.pipeline.buffer and rt.spans_on
    value = _SEP.join((_VERSION, f"{trace.trace_id:x}", f"{span:x}", f"{rt.pid:x}",
                       f"{st.tid:x}", "1" if sampled else "0", *path))
    _made.last = (top, st, value, st.span, rt)
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


#: The carrier of a Ray Serve handle call (`patch_serve_handle`), for the Ray call Serve makes
#: for it later from its router's event loop (a thread of its own, where none of the caller's
#: blocks is open), in an asyncio task made from the ``.remote()`` call, which copies its
#: context variables.
_handed: contextvars.ContextVar[str | None] = contextvars.ContextVar("otel_rl_handed",
                                                                     default=None)


def carrier_for_call() -> str | None:
    made = _made.__dict__  # this thread's
    if made.get("internal"):
        return None  # otel_rl's own calls (`internal`)
    handed = _handed.get()
    if handed is not None:
        return handed
    own = made.get("own")
    if own is None:  # looked up once per thread (a thread's name is looked up slowly)
        own = made["own"] = threading.current_thread().name.startswith("otel_rl-")
    if own:
        return None  # otel_rl's own threads deliver and collect
    try:
        # The carrier made last on this thread, while the same block is open (the checks of
        # `carrier_text`, without its lookups: a whole call costs Ray a few tens of µs). The
        # runtime it was made by is still the process's own and open: `runtime.active()`
        # without its pid check (``os.getpid()``, a system call: 0.27 µs here, a sixth of
        # this wrapper), since a forked child's runtime is replaced by the fork hook (and its
        # stacks too, so the first check fails there already).
        cached = made.get("last")
        if cached is not None:
            st = recorder.thread_stack()
            top = st.top
            if cached[0] is top and cached[1] is st and cached[3] == st.span:
                rt = runtime.current()
                if (rt is not None and cached[4] is rt and not rt.closed
                        and rt.settings.propagate):
                    return cached[2]  # type: ignore[no-any-return]
        return carrier_text()
    except Exception:
        return None


def _named_again(target: Any, given: Any) -> Any:
    """The task name the last task call made on this thread was given, if the remote
    function `target` is called again from the same open block of the same runtime with the
    same `given` name; None otherwise. A program calls the same few functions from one block
    over and over: this is `carrier_for_call`'s cached path and `_call_name`'s memo in one
    lookup (~0.1 µs less a call than both). The thread keeps its last called function until
    its next call."""
    made = _made.__dict__
    last = made.get("call")
    if last is None or last[0] is not target or made.get("internal") or _handed.get():
        return None
    st = recorder.active_stack()
    rt: Runtime = last[4]
    if last[1] is not st or runtime.current() is not rt or rt.closed or last[5] != given:
        return None
    if st.top is not last[2] or st.span != last[3] or client_mode():
        return None
    return last[6]


def _remember_call(target: Any, given: Any, value: str, named: Any) -> None:
    """What `_named_again` checks, for the call made now with the carrier `value` (made by
    `carrier_for_call`, which keeps its block in the thread's ``last``)."""
    made = _made.__dict__
    cached = made.get("last")
    if cached is not None and cached[2] is value:
        top, st, _, span, rt = cached
        made["call"] = (target, st, top, span, rt, given, named)


def _patched_flatten_args(signature_parameters: Any, args: Any, kwargs: Any) -> Any:
    # Runs on every submission: a call without our argument goes straight to Ray's.
    if not kwargs or KEY not in kwargs:
        return _original["flatten_args"](signature_parameters, args, kwargs)
    handed = kwargs.pop(KEY)
    if not args and not kwargs and not signature_parameters:
        return [KEY, handed]  # Ray's own no-argument shortcut (nothing to check), plus ours
    flat = _original["flatten_args"](signature_parameters, args, kwargs)
    flat += [KEY, handed]
    return flat


def _task_name(target: Any) -> str:
    """The name Ray gives a task call of `target` by default (`f`)."""
    function = getattr(target, "_function", None)
    return str(getattr(function, "__name__", "") or "")


def _method_name(target: Any) -> str:
    """The name Ray gives a call of the actor method `target` by default (`Class.method`)."""
    actor = target._actor
    descriptor = getattr(actor, "_ray_actor_creation_function_descriptor", None)
    owner = str(getattr(descriptor, "class_name", "") or "").rpartition(".")[2]
    return f"{owner}.{target._method_name}" if owner else str(target._method_name)


def task_name_with(name: Any, value: str, target: Any, default: Callable[[Any], str]) -> Any:
    if name is not None and not isinstance(name, str):
        return name  # not a name Ray takes: let Ray say so
    try:
        return f"{name or default(target)}{MARK}{value}"
    except Exception:
        return name


#: Set in a driver whose Ray session started before otel_rl (`Driver.late_runtime_env`):
#: the runtime_env every task and actor created from it gets (unless it has its own), so
#: that the worker processes running them join the run. The task form is serialized once.
late_env: dict[str, Any] | None = None
_late_task_env: str | None = None
#: Whether the workers this process's actor creations reach can take the keyword argument
#: off (they joined the run, or run the shim): set in a driver with a `Driver` and in a
#: joined worker. Without it, the argument would reach the actor's ``__init__``.
joined = False


def set_late_env(env: dict[str, Any] | None, on_client: bool = False) -> None:
    global late_env, _late_task_env
    if env is None:
        late_env = _late_task_env = None
        return
    if on_client:  # Ray Client: the server parses it (`client`)
        late_env, _late_task_env = env, None
        return
    from ray._private.utils import get_runtime_env_info, parse_runtime_env_for_task_or_actor

    parsed = parse_runtime_env_for_task_or_actor(env)
    _late_task_env = get_runtime_env_info(parsed, is_job_runtime_env=False, serialize=True)
    late_env = parsed


def _submit_wrapper(name: str) -> Callable[..., Any]:
    original = _original[name]
    default = _task_name if name == "task" else _method_name

    if name == "actor":
        def _remote(self: Any, args: Any = None, kwargs: Any = None, *rest: Any,
                    **options: Any) -> Any:
            value = carrier_for_call() if joined else None
            if value is not None and not _cross_language(self) and not client_mode():
                if late_env is not None:
                    if options.get("runtime_env"):  # its own: its worker may not join
                        return original(self, args, kwargs, *rest, **options)
                    options["runtime_env"] = late_env
                kwargs = {} if kwargs is None else dict(kwargs)
                kwargs[KEY] = value.encode("utf-8")
            return original(self, args, kwargs, *rest, **options)
    else:
        is_method = name == "method"

        def _remote(self: Any, args: Any = None, kwargs: Any = None, *rest: Any,
                    **options: Any) -> Any:
            positional = rest and is_method  # ActorMethod._remote(args, kwargs, name, ...)
            given = rest[0] if positional else options.get("name")
            # Not for actor methods: ``handle.method`` is a new ActorMethod at each access
            # (the memo would never hit), and it holds the actor's handle: remembered, the
            # actor would outlive the program's last handle.
            named = None if is_method else _named_again(self, given)
            if named is None:
                value = carrier_for_call()
                if value is None or client_mode():
                    return original(self, args, kwargs, *rest, **options)
                named = _call_name(self, value, given, is_method, default)
                if named is None:
                    return original(self, args, kwargs, *rest, **options)
                if not is_method:
                    _remember_call(self, given, value, named)
            if positional:
                rest = (named, *rest[1:])
            else:
                options["name"] = named
            if (_late_task_env is not None and not is_method and not rest
                    and not options.get("serialized_runtime_env_info")):
                options["serialized_runtime_env_info"] = _late_task_env
            return original(self, args, kwargs, *rest, **options)

    _remote.__name__ = original.__name__
    _remote.__doc__ = original.__doc__
    _remote.__wrapped__ = original  # type: ignore[attr-defined]
    return _remote


#: Where a remote function, or an actor handle (for its methods), keeps the task names its
#: last calls were given: {method name or None: (carrier, given name, task name)}. A caller
#: calls the same few targets from the same block over and over; the name is made once.
_MEMO = "_otel_rl_names"


def _call_name(target: Any, value: str, given: Any, is_method: bool,
               default: Callable[[Any], str]) -> Any:
    """The task name a call of `target` from the block `value` stands for is given (the
    program's `given` name, or Ray's default, with the carrier); None: it carries none."""
    try:
        owner = target._actor if is_method else target
        memo = owner.__dict__.get(_MEMO)
        if memo is None:
            memo = owner.__dict__[_MEMO] = {}
        key = target._method_name if is_method else None
    except Exception:
        return None if _cross_language(target) else task_name_with(given, value, target, default)
    hit = memo.get(key)
    if hit is not None and hit[0] is value and hit[1] == given:
        return hit[2]
    named = None if _cross_language(target) else task_name_with(given, value, target, default)
    if len(memo) > 256:
        memo.clear()
    memo[key] = (value, given, named)
    return named


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


def client_mode() -> bool:
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


def patch_serve_handle(module: Any) -> None:
    """Ray Serve: a ``DeploymentHandle.remote()`` call carries the block open at the call to
    the replica (through `_handed`: Serve makes the replica's Ray call later, elsewhere)."""
    cls = module._DeploymentHandleBase
    original = cls._remote
    if getattr(original, "_otel_rl", False):
        return

    @functools.wraps(original)
    def _remote(self: Any, *args: Any, **kwargs: Any) -> Any:
        value = carrier_for_call() if joined else None
        if value is None:
            return original(self, *args, **kwargs)
        token = _handed.set(value)
        try:
            return original(self, *args, **kwargs)
        finally:
            _handed.reset(token)

    _remote._otel_rl = True  # type: ignore[attr-defined]
    cls._remote = _remote


# --- execute side ---------------------------------------------------------------------------------
#: Parsed carriers (a worker sees the same few callers' blocks over and over).
_bases: dict[bytes | str, Base] = {}
running = 0  # calls running now in this process (read by the delivery, for loss accounting)
started = 0  # calls started so far
_running_lock = threading.Lock()
#: Called at the start of each call (the delivery's idle -> busy notice); set by `worker`.
on_call_start: Callable[[], None] | None = None
#: Called with (actor instance) when an actor's __init__ runs with context (its role).
on_actor: Callable[[Any], None] | None = None
#: Called when an actor's __init__ raises (the actor dies with it: deliver first).
on_init_failed: Callable[[], Any] | None = None
#: Called when a task's worker process is about to end after its function's ``max_calls``
#: calls (Ray's default for GPU tasks is 1): deliver first.
on_last_call: Callable[[], Any] | None = None


def calls_running() -> int:
    return running


def calls_started() -> int:
    return started


def _carrier_in_task_name(is_task: bool) -> str | None:
    """The carrier in the running call's task name, if it has one; Ray's log prefix and
    process title are given the program's name back (they took the whole name). `is_task`:
    a task's call, not an actor's (known from the executor: asking Ray, ``actor_id``, costs
    ~4.5 µs a call here)."""
    worker, prefix, setproctitle = _ray_parts.get("parts") or _load_ray_parts()
    name: str = worker.core_worker.get_current_task_name()
    if MARK not in name:
        return None
    plain, _, value = name.partition(MARK)
    try:
        if is_task:  # a task: Ray names its log lines' prefix after it
            token = f"{prefix}{plain}\n"
            print(token, end="")
            print(token, file=sys.stderr, end="")
        setproctitle(f"ray::{plain}")
    except Exception:
        pass
    return value


#: ``"parts"``: Ray's worker, log-prefix marker and ``setproctitle``, looked up once (not
#: per call).
_ray_parts: dict[str, tuple[Any, str, Callable[[str], Any]]] = {}


def _load_ray_parts() -> tuple[Any, str, Callable[[str], Any]]:
    import ray._private.worker as ray_worker
    import ray._raylet
    from ray._private.ray_constants import LOG_PREFIX_TASK_NAME

    parts = (ray_worker.global_worker, LOG_PREFIX_TASK_NAME, ray._raylet.setproctitle)
    _ray_parts["parts"] = parts
    return parts


def _is_actor_executor(executor: Any) -> bool:
    """Whether `executor` runs an actor's method (``__init__`` included): Ray's
    ``actor_method_executor``, which carries the method's ``name`` and ``method``."""
    return hasattr(executor, "method") and isinstance(getattr(executor, "name", None), str)


def _plain_task_name(self: Any) -> str:
    """`Worker.current_task_name` (``ray.get_runtime_context().get_task_name()``) without the
    carrier: the name the program gave or Ray's default."""
    return str(self.core_worker.get_current_task_name()).partition(MARK)[0]


def _base_of(rt: Runtime, value: bytes | str) -> Base | None:
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
    rt.adopt(stack, base=base)
    return stack


def _started(new_call: bool = True) -> None:
    """A call starts running (`new_call`), or a generator call's body runs again after its
    call returned (counted running again, not started again); the driver is told if the
    worker's last word was idle."""
    global running, started
    with _running_lock:
        running += 1
        if new_call:
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
    is_task = not _is_actor_executor(executor)

    def run(*args: Any, **kwargs: Any) -> Any:
        handed = kwargs.pop(KEY, None)
        if handed is None:
            try:
                handed = _carrier_in_task_name(is_task)
            except Exception:  # another Ray: the call runs as without otel_rl
                handed = None
            if handed is None and is_init:  # made from a Ray Client driver (`client.ENV`)
                handed = os.environ.get(CLIENT_ENV)
        rt = runtime.active()
        base = (_base_of(rt, handed) if rt is not None and isinstance(handed, (bytes, str))
                else None)
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
                return _stepped(result, base)
            # A generator runs as Ray iterates it (Ray takes what `inspect.isgenerator` and
            # `isasyncgen` take: these exact types).
            if type(result) is GeneratorType:
                return _generated(result, base)
            if type(result) is AsyncGeneratorType:
                return _agenerated(result, base, again=not is_task)
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


def _own_base(base: Base) -> Base:
    """The place of the call running now, by its task name read now; `base` if none is found."""
    try:
        handed = _carrier_in_task_name(False)
        rt = runtime.active()
        own = _base_of(rt, handed) if rt is not None and handed is not None else None
    except Exception:  # another Ray: keep what was read before
        return base
    return own or base


def _flush_quietly() -> None:
    hook = on_init_failed
    if hook is not None:
        try:
            hook()
        except Exception:
            pass


async def _stepped(coro: Coroutine[Any, Any, Any], base: Base) -> Any:
    """The call `coro` run on a stack of its own at `base`'s place, active around each of its
    steps only; the call's count of running calls ends with it."""
    try:
        return await stepping.at_place(coro, base)
    finally:
        _ended()


def _generated(gen: Generator[Any, Any, Any], base: Base) -> Generator[Any, Any, Any]:
    """`gen` on a stack of its own at `base`'s place, active around each of its steps only
    (and while it is closed)."""
    _started(new_call=False)
    value: Any = None
    error: BaseException | None = None
    try:
        with stepping.Leased(base) as stack:
            while True:
                try:
                    item = stepping.step(gen, stack, value, error)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                try:
                    value, error = (yield item), None
                except GeneratorExit:  # closed early: its own clean-up on its own stack
                    stepping.step(gen, stack, None, stepping.CLOSE)
                    raise
                except BaseException as exc:
                    value, error = None, exc
    finally:
        _ended()


async def _agenerated(agen: AsyncGenerator[Any, Any], base: Base,
                      again: bool = False) -> AsyncGenerator[Any, Any]:
    """`agen` on a stack of its own at `base`'s place, active around each step of each of its
    steps only. `again`: the call's carrier is read again at its first step. (An async actor's
    generator call is made on a thread of Ray's where the task name read can be another
    call's, made since; its steps run in the call's own context, where it is its own.)"""
    if again:
        base = _own_base(base)
    _started(new_call=False)
    value: Any = None
    error: BaseException | None = None
    try:
        with stepping.Leased(base) as stack:
            while True:
                step = agen.asend(value) if error is None else agen.athrow(error)
                try:
                    item = await stepping.steps(step, stack)  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
                try:
                    value, error = (yield item), None
                except GeneratorExit:
                    await stepping.steps(agen.aclose(), stack)  # type: ignore[arg-type]
                    raise
                except BaseException as exc:
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
    _patch_task_counter(cls)
    import ray._private.worker as ray_worker

    ray_worker.Worker.current_task_name = property(_plain_task_name)  # type: ignore[assignment]


def _patch_task_counter(cls: Any) -> None:
    """Ray counts the calls of a function with ``max_calls`` after each one ends
    (``increase_task_counter``) and ends the worker process when the count reaches it, before
    the next flush: `on_last_call` delivers first. Fail-open: an error here leaves Ray's
    counting as it was, and the ledger's count of a worker that ended unannounced."""
    original = getattr(cls, "increase_task_counter", None)
    if original is None or getattr(original, "_otel_rl", False):
        return

    def increase_task_counter(self: Any, function_descriptor: Any) -> Any:
        result = original(self, function_descriptor)
        try:
            info = self._function_execution_info.get(function_descriptor.function_id)
            limit = getattr(info, "max_calls", 0)
            hook = on_last_call
            if limit and hook is not None and self.get_task_counter(function_descriptor) >= limit:
                hook()
        except Exception:
            pass
        return result

    increase_task_counter._otel_rl = True  # type: ignore[attr-defined]
    cls.increase_task_counter = increase_task_counter
