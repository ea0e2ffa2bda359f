"""Carry the current block's context into threads, executors, processes and subprocesses.

The carrier format is `carrier`'s; carriers are made and workers started by `runtime`. This
module is the public propagation API (`get_context`, `attach_context`, `inject_env`) and the
standard-library patches that use it automatically (installed by `otel_rl.configure` when
``propagate`` is on; inert while otel_rl is off).
"""

from __future__ import annotations

import multiprocessing.process
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from types import CoroutineType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, cast

from otel_rl._internal import carrier, log, recorder, runtime

if TYPE_CHECKING:
    from inspect import Signature
from otel_rl._internal.recorder import Base, TimerStack
from otel_rl._internal.runtime import Runtime, make_carrier


def _auto() -> Runtime | None:
    """The runtime, if automatic instrumentation is on (the patches stay installed, inert)."""
    rt = runtime.active()
    if rt is None or not rt.settings.propagate:
        return None
    return rt


def get_context() -> dict[str, str]:
    """A picklable carrier of the current block's context, for any transport.

    >>> carrier = otel_rl.get_context()          # in the parent, inside a block
    >>> with otel_rl.attach_context(carrier):     # in the worker
    ...     work()
    """
    return make_carrier(for_process=True)


class attach_context:
    """Run the ``with`` body as if inside the block `carrier` came from; restores on exit.

    Blocks inside become children of that block's span and are counted under its path in
    the whole-run tree (parallel when in another thread or process).
    """

    __slots__ = ("_carrier", "_previous", "_swapped")

    def __init__(self, carrier: Mapping[str, str] | Base | None) -> None:
        # In this process, tasks hand over the submitting block's `Base` itself.
        self._carrier = carrier
        self._swapped = False
        self._previous: TimerStack | None = None

    def __enter__(self) -> attach_context:
        rt = runtime.active()
        handed = self._carrier
        if rt is None or not handed:
            return self
        if isinstance(handed, Base):
            base = handed
        else:
            ctx = carrier.parse(handed)
            if ctx is None:
                return self
            trace = rt.trace if ctx.trace_id == rt.trace.trace_id else rt.remote_trace(ctx)
            base = Base(trace, ctx.span_id, ctx.path, ctx.pid or rt.pid, ctx.tid)
        stack = _task_stack(rt, base)
        self._previous = recorder.set_active_stack(stack)
        self._swapped = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._swapped:
            self._swapped = False
            recorder.set_active_stack(self._previous)


def _task_stack(rt: Runtime, base: Base) -> TimerStack:
    """One stack per (thread, place in the tree): tasks from the same block share it."""
    stack = recorder.task_stack((base.path, base.pid, base.tid))
    rt.adopt(stack, base=base)
    return stack


class _Task:
    """A callable that runs `fn` inside the context it was submitted from (picklable)."""

    __slots__ = ("carrier", "fn")

    def __init__(self, fn: Callable[..., Any], carrier: Any) -> None:
        self.fn = fn
        self.carrier = carrier

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with attach_context(self.carrier):
            return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        if isinstance(self.carrier, Base):  # in-process only; a copy elsewhere runs plain
            return (_Task, (self.fn, None))
        return (_Task, (self.fn, self.carrier))


def _place_here(rt: Runtime) -> Base:
    """The place this thread is at now (the block open on it, or its stack's own place), as
    work handed from here to another thread of the process starts at."""
    st, base, path = runtime.current_base(rt)
    return Base(st.trace or base.trace, st.span or base.span_id, path, rt.pid, st.tid)


def _in_process_task(fn: Callable[..., Any]) -> Callable[..., Any]:
    rt = _auto()
    if rt is None:
        return fn
    return _Task(fn, _place_here(rt))


def _remote_task(fn: Callable[..., Any]) -> Callable[..., Any]:
    if _auto() is None:
        return fn
    return _Task(fn, make_carrier(for_process=True))


# --- worker processes --------------------------------------------------------------------------

class _Carrier(dict[str, str]):
    """A carrier stored on a `multiprocessing` Process; unpickling it in a spawn/forkserver
    child imports otel_rl, which installs the bootstrap hook before the child runs."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_carrier, (dict(self),))


def _restore_carrier(data: dict[str, str]) -> _Carrier:
    """Unpickled in a spawn/forkserver child before it runs: patch, so its bootstrap
    starts the worker."""
    install()
    return _Carrier(data)


#: multiprocessing's own names for processes nobody named ("Process-3", "SpawnProcess-2:1").
_DEFAULT_PROCESS_NAME = re.compile(r"^[A-Za-z]*(Process|PoolWorker)-\d+(:\d+)*$")


def _role_of(process: multiprocessing.process.BaseProcess) -> str:
    """The role of a worker process: the name the program gave it (Sample Factory's
    ``rollout_proc0`` -> ``rollout_proc``), else its target's name."""
    name = str(getattr(process, "_name", "") or "")
    if name and not _DEFAULT_PROCESS_NAME.match(name):
        role = name.rstrip("0123456789-_:. ")
        if role:
            return role
    target = getattr(process, "_target", None)
    name = getattr(target, "__qualname__", None) or type(process).__name__
    return str(name).strip("_") or "worker"


_original: dict[str, Any] = {}


def _patched_process_start(self: multiprocessing.process.BaseProcess) -> None:
    rt = _auto()
    if rt is not None and "_otel_rl_carrier" not in self.__dict__:
        try:
            role = _role_of(self)
            self._otel_rl_carrier = _Carrier(  # type: ignore[attr-defined]
                make_carrier(for_process=True, role=role, index=rt.next_index(role)))
        except Exception as exc:  # never stop a worker from starting
            rt.stats.warn_once("carrier", f"cannot pass context to a worker: {exc!r}")
    with runtime.starting_process():
        _original["start"](self)


def _patched_bootstrap(self: multiprocessing.process.BaseProcess, *args: Any, **kwargs: Any) -> Any:
    carrier = self.__dict__.get("_otel_rl_carrier")
    if carrier is None:
        return _original["bootstrap"](self, *args, **kwargs)
    runtime.join_or_say(carrier, "worker process")
    try:
        return _original["bootstrap"](self, *args, **kwargs)
    finally:
        # multiprocessing children leave with os._exit, skipping atexit: flush here.
        runtime.shutdown()


def _patched_pool_submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return _original["ppe_submit"](self, _remote_task(fn), *args, **kwargs)


def _patched_thread_submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return _original["tpe_submit"](self, _in_process_task(fn), *args, **kwargs)


def _pool_wrapper(name: str) -> Callable[..., Any]:
    def method(self: Any, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if isinstance(self, sys.modules["multiprocessing.pool"].ThreadPool):
            func = _in_process_task(func)
        else:
            func = _remote_task(func)
        return _original[name](self, func, *args, **kwargs)

    method.__name__ = name
    return method


def _handing_place(rt: Runtime) -> Base | None:
    """Where work this thread hands to another thread of the process runs: the block open here,
    or the place this thread's active stack runs at (a task's, a Ray call's); None at the
    thread's own root (the other thread's own place is right then)."""
    st = recorder.active_stack()
    if st is None or (len(st.stack) <= 1 and st.base is rt.base):
        return None
    return _place_here(rt)


def _patched_thread_start(self: threading.Thread) -> None:
    rt = _auto()
    if rt is not None and not self.name.startswith("otel_rl-"):
        place = _handing_place(rt)
        if place is not None:
            self._otel_rl_base = place  # type: ignore[attr-defined]
    _original["thread_start"](self)


def _patched_run_coroutine_threadsafe(coro: Any, loop: Any) -> Any:
    # A coroutine handed to another thread's event loop (Ray Serve runs a deployment's code so)
    # runs at the place it was handed from, on a stack of its own: others handed from the same
    # place run interleaved with it on that loop.
    rt = _auto()
    if rt is not None and type(coro) is CoroutineType:
        place = _handing_place(rt)
        if place is not None:
            from otel_rl._internal import stepping  # on first use, as the other cold paths

            coro = stepping.at_place(coro, place)
    return _original["run_coroutine_threadsafe"](coro, loop)


_popen_signature: Signature | None = None


def _patched_popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    global _popen_signature
    rt = _auto()
    if rt is not None and not runtime.programs_quiet():
        try:
            if _popen_signature is None:
                import inspect  # on first use: worker start-up does not pay for it

                _popen_signature = inspect.signature(_original["popen_init"])
            # Bound by name, so `env` is found however the caller passed it.
            bound = _popen_signature.bind(self, *args, **kwargs)
            injected = inject_env(bound.arguments.get("env"))
            if injected is not None:
                bound.arguments["env"] = injected
                _original["popen_init"](*bound.args, **bound.kwargs)
                return
        except Exception as exc:
            rt.stats.warn_once("popen", f"cannot pass context to a subprocess: {exc!r}")
    _original["popen_init"](self, *args, **kwargs)


def inject_env(env: Mapping[str, str] | Mapping[bytes, bytes] | None = None
               ) -> dict[str, str] | None:
    """A copy of `env` (default: os.environ) with the current context added; the caller's
    mapping and os.environ are left as they are. None if `env` has bytes keys."""
    base = os.environ if env is None else env
    if any(isinstance(key, bytes) for key in base):
        return None
    result = dict(cast("Mapping[str, str]", base))
    from otel_rl._internal import torchrun  # on first use: worker start-up does not pay for it

    role, index = torchrun.child_role(result) or ("subprocess", None)
    if role == "rank":
        torchrun.on_rank_started(runtime.active(), result)
    handed_down = make_carrier(for_process=True, role=role, index=index)
    if handed_down:
        carrier.to_env(handed_down, result)
    return result


# --- install --------------------------------------------------------------------------------------

_install_lock = threading.Lock()


def _patch_process_pool(module: ModuleType) -> None:
    cls = module.ProcessPoolExecutor
    _original["ppe_submit"] = cls.submit
    cls.submit = _patched_pool_submit


def _patch_thread_pool(module: ModuleType) -> None:
    cls = module.ThreadPoolExecutor
    _original["tpe_submit"] = cls.submit
    cls.submit = _patched_thread_submit


def _patch_asyncio(module: Any) -> None:  # asyncio.tasks
    original = _original["run_coroutine_threadsafe"] = module.run_coroutine_threadsafe
    _patched_run_coroutine_threadsafe.__doc__ = original.__doc__
    module.run_coroutine_threadsafe = _patched_run_coroutine_threadsafe
    package: Any = sys.modules.get("asyncio")  # re-exported there (when already imported)
    if package is not None and getattr(package, "run_coroutine_threadsafe", None) is original:
        package.run_coroutine_threadsafe = _patched_run_coroutine_threadsafe


def _patch_anyio(module: Any) -> None:  # anyio.to_thread
    # anyio (Starlette, FastAPI, Ray Serve's sync methods) runs a function in a worker thread
    # it keeps for later calls: each call runs where it was made, as a pool's task does (the
    # worker thread's own place is where it was first started).
    original = _original["anyio_run_sync"] = module.run_sync

    async def run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await original(_in_process_task(func), *args, **kwargs)

    run_sync.__name__, run_sync.__doc__ = original.__name__, original.__doc__
    run_sync.__wrapped__ = original  # type: ignore[attr-defined]
    module.run_sync = run_sync


def _patch_pool(module: ModuleType) -> None:
    for name in ("apply_async", "_map_async", "imap", "imap_unordered"):
        _original[name] = getattr(module.Pool, name)
        setattr(module.Pool, name, _pool_wrapper(name))


#: Modules patched when they are imported (at once if they already are): a worker that never
#: uses a pool does not pay for importing one (~6 ms of start-up).
def _patch_ray(module: ModuleType) -> None:
    from otel_rl._internal.ray_support import patches  # Ray tasks and actors

    patches.install()


def _patch_serve(module: ModuleType) -> None:
    from otel_rl._internal.ray_support import calls  # Ray Serve handle calls

    calls.patch_serve_handle(module)


#: The RLlib modules `rllib.PATCHES` patches (RLlib's own timers as blocks, its actors' roles):
#: `rllib` itself is imported when one of them is, not by every worker.
RLLIB_MODULES = (
    "ray.rllib.utils.metrics.stats.base",
    "ray.rllib.utils.metrics.stats.ema",
    "ray.rllib.utils.metrics.metrics_logger",
    "ray.rllib.env.env_runner",
    "ray.rllib.core.learner.learner",
)


def _patch_rllib(module: ModuleType) -> None:
    from otel_rl._internal import rllib

    rllib.PATCHES[module.__name__](module)


_LAZY_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "anyio.to_thread": _patch_anyio,
    "asyncio.tasks": _patch_asyncio,
    "concurrent.futures.process": _patch_process_pool,
    "concurrent.futures.thread": _patch_thread_pool,
    "multiprocessing.pool": _patch_pool,
    "ray": _patch_ray,
    "ray.serve.handle": _patch_serve,
    **dict.fromkeys(RLLIB_MODULES, _patch_rllib),
}


class _PatchOnImport:
    """A `sys.meta_path` finder that lets the normal finders load a module, then patches it."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            if self.patches.pop(name, None) is not None:
                _apply(name, patch, module)

        setattr(loader, "exec_module", exec_and_patch)  # noqa: B010 - a method on purpose
        return spec


def _apply(name: str, patch: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        patch(module)
    except Exception as exc:  # another version of that module: it runs as without otel_rl
        log.warning("otel_rl: cannot instrument %s (%r); it runs as without otel_rl", name, exc)


def _install_lazy_patches() -> None:
    pending = {}
    for name, patch in _LAZY_PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            _apply(name, patch, module)
        else:
            pending[name] = patch
    if pending:
        sys.meta_path.insert(0, _PatchOnImport(pending))


def install() -> None:
    """Patch the standard library once; every patch does nothing while otel_rl is off."""
    with _install_lock:
        if _original:
            return
        bp = multiprocessing.process.BaseProcess
        _original["start"] = bp.start
        _original["bootstrap"] = bp._bootstrap  # type: ignore[attr-defined]
        bp.start = _patched_process_start  # type: ignore[method-assign]
        bp._bootstrap = _patched_bootstrap  # type: ignore[attr-defined]
        _install_lazy_patches()
        _original["thread_start"] = threading.Thread.start
        threading.Thread.start = _patched_thread_start  # type: ignore[method-assign]
        _original["popen_init"] = subprocess.Popen.__init__
        subprocess.Popen.__init__ = _patched_popen_init  # type: ignore[assignment]
