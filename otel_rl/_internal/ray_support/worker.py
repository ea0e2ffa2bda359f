"""A Ray worker process in the run: joining it, and delivering its records through Ray.

A worker joins when the job's ``worker_process_setup_hook`` (see `_shim.setup_hook`) runs
`join` with the run's joining carrier: the run id, the run span, the settings carried to
workers, and ``relay = "ray:/<mailbox>"``. It becomes an otel_rl worker like a
forked one, with three differences: its clock offset is its own (nothing about clocks is
taken from the driver: the carrier has none, so `Runtime` measures it here), its records go to
`RaySink` (Ray's own channel to the driver: pushes into the run's mailbox in the GCS) instead
of a Unix socket, and each call it runs carries its own caller's context (`calls`).

Delivery is periodic, never left to exit handlers: every flush interval the worker pushes
its cumulative tree snapshot and the records drained since the last push, and waits for the
push (bounded). A worker killed without warning loses at most what it recorded since its
last push (one flush interval); the driver counts it (`driver.Ledger`). Where Ray ends a
process itself, with Ray still up, the process delivers first: `exit_actor()`, an actor
ended gracefully (its last handle gone: `_patch_actor_shutdown`), a task worker at its
function's ``max_calls`` (`calls.on_last_call`).
"""

from __future__ import annotations

import time
from typing import Any

from otel_rl._internal import runtime, semconv
from otel_rl._internal.ray_support import calls
from otel_rl._internal.ray_support.sink import PUSH_TIMEOUT, RELAY_PREFIX, RaySink

#: Default role of a worker process that runs tasks (an actor's is its class name).
TASK_ROLE = "ray_task"

_role_set = False


def join(joining: dict[str, str]) -> bool:
    """Make this Ray worker process a worker of the run `joining` describes; True if it is
    one now (it may have been already)."""
    from otel_rl._internal import carrier

    ctx = carrier.parse(joining)
    if ctx is None or ctx.relay is None or not ctx.relay.startswith(RELAY_PREFIX):
        return False
    rt = runtime.active()
    if rt is None or rt.run_id != ctx.run_id:
        if rt is not None:
            runtime.shutdown()
        runtime.start_worker(joining)
        rt = runtime.active()
        if rt is None:
            return False
    if rt.settings.propagate:
        from otel_rl._internal import propagation

        propagation.install()
    if rt.role in (None, "worker"):
        rt.role = TASK_ROLE  # until it runs an actor's __init__ (`_on_actor`) or `set_role`
        rt.resource[semconv.WORKER_ROLE] = TASK_ROLE
    calls.patch_submit()
    calls.patch_execute()
    calls.joined = True
    calls.on_actor = _on_actor
    calls.on_init_failed = lambda: flush_now(final=False)
    calls.on_last_call = lambda: flush_now(final=True)
    _patch_exit_actor()
    _patch_actor_shutdown()
    sink = rt.relay_client
    if isinstance(sink, RaySink):
        sink.running = calls.calls_running
        sink.started = calls.calls_started
        sink.wake = rt.pipeline.wake.set
        calls.on_call_start = sink.note_busy
    return True


def set_role(role: str, index: int | None = None) -> None:
    """Name this worker process's role (and index; by default the driver numbers each role's
    processes 0, 1, ... in the order it hears of them). For framework integrations (RLlib's
    env runners and learners); an actor's role is its class name unless set here."""
    global _role_set
    rt = runtime.active()
    if rt is None or not rt.is_worker:
        return
    _role_set = True
    rt.role = role
    rt.resource[semconv.WORKER_ROLE] = role
    if index is not None:
        rt.index = index
        rt.resource[semconv.WORKER_INDEX] = index
    sink = rt.relay_client
    if isinstance(sink, RaySink):
        sink.index_given = index is not None


def _on_actor(instance: Any) -> None:
    if _role_set:
        return
    cls = getattr(type(instance), "__ray_actor_class__", type(instance))
    rt = runtime.active()
    if rt is not None and rt.role in (None, "worker", TASK_ROLE):
        rt.role = str(getattr(cls, "__name__", "actor"))
        rt.resource[semconv.WORKER_ROLE] = rt.role


def flush_now(final: bool) -> str | None:
    """Deliver what this process holds now (synchronously, bounded); its key, or None."""
    rt = runtime.active()
    if rt is None:
        return None
    sink = rt.relay_client
    if not isinstance(sink, RaySink):
        return None
    deadline = time.monotonic() + PUSH_TIMEOUT
    if final:
        sink.final = True
    rt.pipeline.flush(deadline)
    # The flush's push went before its records reached the sink (the sink's own thread takes
    # them): push those now, as the process may end right after this.
    sink.push_rest(deadline)
    return sink.key


def _patch_actor_shutdown() -> None:
    """An actor Ray ends gracefully (the program's last handle to it gone, its owner ended)
    has Ray call ``ray._raylet._call_actor_shutdown`` (the actor's ``__ray_shutdown__``)
    once its calls are done, with Ray still up: deliver first. Without it, an actor ended
    right after its last call (Ray ends it within ~0.3 s) lost what that call recorded."""
    import ray._raylet

    original = getattr(ray._raylet, "_call_actor_shutdown", None)
    if original is None or getattr(original, "_otel_rl", False):
        return  # another Ray: the periodic delivery and the ledger's count stay

    def _call_actor_shutdown(*args: Any, **kwargs: Any) -> Any:
        try:
            flush_now(final=True)
        except Exception:
            pass
        return original(*args, **kwargs)

    _call_actor_shutdown._otel_rl = True  # type: ignore[attr-defined]
    _call_actor_shutdown.__doc__ = original.__doc__
    ray._raylet._call_actor_shutdown = _call_actor_shutdown


def _patch_exit_actor() -> None:
    """`ray.actor.exit_actor()` ends the actor: deliver first (its exit may skip atexit)."""
    import ray.actor

    original = ray.actor.exit_actor
    if getattr(original, "_otel_rl", False):
        return

    def exit_actor() -> Any:
        try:
            flush_now(final=True)
        except Exception:
            pass
        return original()

    exit_actor._otel_rl = True  # type: ignore[attr-defined]
    exit_actor.__doc__ = original.__doc__
    ray.actor.exit_actor = exit_actor
    import ray

    if getattr(ray, "exit_actor", None) is original:
        ray.exit_actor = exit_actor  # type: ignore[attr-defined]
