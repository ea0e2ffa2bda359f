"""What otel_rl patches in Ray: submission everywhere; init, shutdown and kill in a driver."""


from __future__ import annotations

import atexit
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from otel_rl._internal import log, runtime
from otel_rl._internal.ray_support import _shim, calls, client

_installed = False
_driver: Any = None  # driver.Driver of this process's Ray session, if it is the run's driver
#: Seconds `ray.kill` waits for the actor's last delivery before killing it.
KILL_FLUSH_TIMEOUT = 2.0


def current_driver() -> Any:
    return _driver


def install(in_worker: bool = False) -> None:
    """Patch Ray (once): submission everywhere; init/shutdown/kill in a driver."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        calls.patch_submit()
    except Exception as exc:
        log.warning("otel_rl: Ray calls will not carry context (%r)", exc)
    if in_worker:
        return
    try:
        _patch_driver()
    except Exception as exc:
        log.warning("otel_rl: Ray workers will not join the run (%r)", exc)


def _patch_driver() -> None:
    import ray
    import ray._private.worker as ray_worker

    for owner in (ray_worker, ray):  # `ray.kill` is not always `ray._private.worker.kill`
        for name, make in (("init", _init), ("shutdown", _shutdown), ("kill", _kill)):
            old = getattr(owner, name, None)
            if old is None or getattr(old, "_otel_rl", False):
                continue
            new = make(old)
            new.__name__, new.__doc__ = name, old.__doc__
            new.__wrapped__ = old  # type: ignore[attr-defined]
            new._otel_rl = True  # type: ignore[attr-defined]
            setattr(owner, name, new)
    # Runs before Ray's own exit handler (registered when ray was imported, before this).
    atexit.register(_finish, "the program exited")
    if ray.is_initialized():
        _join_running()


def _join_running() -> None:
    """otel_rl configured after ``ray.init``: the tasks and actors created from now on run
    in worker processes that join the run (`Driver.late_runtime_env`); those started before
    stay outside it."""
    global _driver
    rt = runtime.active()
    on_client = client.connected()
    if (rt is None or rt.is_worker or rt.settings.disabled or not rt.settings.propagate
            or _driver is not None or (calls.client_mode() and not on_client)):
        return
    from otel_rl._internal.ray_support.driver import Driver

    try:
        driver = Driver(rt)
        if on_client:  # Ray Client (``ray://``): its own submission point
            client.patch_submit()
        calls.set_late_env(driver.late_runtime_env(), on_client)
        driver.open_mailbox()
    except Exception as exc:
        calls.set_late_env(None)
        rt.stats.warn_once("ray-init", f"Ray workers will not join the run: {exc!r}")
        return
    _driver = driver
    calls.joined = True
    rt.feeds.append(driver.feed)
    rt.finishers.append(lambda deadline: driver.finish(deadline, "at the run's end"))


def _init(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(*args: Any, **kwargs: Any) -> Any:
        global _driver
        import ray

        rt = runtime.active()
        address = kwargs.get("address", args[0] if args else None)
        if (rt is None or rt.is_worker or rt.settings.disabled or not rt.settings.propagate
                or ray.is_initialized() or kwargs.get("local_mode")):
            return original(*args, **kwargs)
        if _is_client_address(address):
            # Ray Client: the job's runtime_env cannot take the hook (it goes as JSON); the
            # run joins once connected, as after a late ``configure()``.
            result = original(*args, **kwargs)
            _join_running()
            return result
        from otel_rl._internal.ray_support.driver import Driver

        driver = None
        given = dict(kwargs)
        hook: tuple[str, str] | None = None  # the hook in the raylet's environment, if so
        try:
            driver = Driver(rt)
            if _raylet_can_hook(address, kwargs):
                with contextlib.suppress(Exception):  # (another Ray: the job's way)
                    hook = driver.raylet_hook()
            if hook is None:
                kwargs["runtime_env"] = driver.runtime_env(kwargs.get("runtime_env"))
        except Exception as exc:
            rt.stats.warn_once("ray-init", f"Ray workers will not join the run: {exc!r}")
            driver, hook = None, None
        # raylet's workers join by the job's hook; no idle workers prestarted without it
        with runtime.no_context_for_programs(), _no_prestart(driver is not None):
            if hook is not None:
                os.environ[hook[0]] = hook[1]
            try:
                result = original(*args, **kwargs)
            except Exception as exc:
                if hook is not None:
                    os.environ.pop(hook[0], None)
                if driver is None or ray.is_initialized():
                    raise
                # Refused before connecting (a job's runtime_env that cannot take the hook,
                # say): the program's own call must still work, without otel_rl's part.
                rt.stats.warn_once("ray-init", f"Ray workers will not join the run: {exc!r}")
                driver = None
                result = original(*args, **given)
            finally:
                if hook is not None:
                    os.environ.pop(hook[0], None)
        if driver is not None and hook is not None:
            if not _started_raylet():  # it joined a running instance after all: no hook there
                driver = None
                _join_running()
            else:
                try:
                    driver.export_raylet_hook()
                except Exception as exc:
                    # The raylet's workers would fail to start without the hook's entry: the
                    # program's instance again, as it asked for it, without otel_rl's part.
                    rt.stats.warn_once("ray-init",
                                       f"Ray workers will not join the run: {exc!r}")
                    driver = None
                    ray.shutdown()
                    with runtime.no_context_for_programs():
                        result = original(*args, **given)
        if driver is not None:
            try:
                driver.open_mailbox()
                _driver = driver
                calls.joined = True
                rt.feeds.append(driver.feed)
                rt.finishers.append(lambda deadline: driver.finish(deadline, "at the run's end"))
            except Exception as exc:
                rt.stats.warn_once("ray-mailbox", f"cannot open the Ray mailbox: {exc!r}")
        return result

    return init


#: Ray's setting (read by the raylet a local ``ray.init`` starts, from its environment) that
#: prestarts one worker per CPU when the first driver connects. Those workers have no
#: runtime_env, so a job with the run's setup hook never leases them: each costs ~0.4 s of
#: CPU to start and sits idle until Ray ends it. Set to 0 for that ``ray.init`` only, unless
#: the program set it.
PRESTART_ENV = "RAY_prestart_worker_first_driver"


@contextlib.contextmanager
def _no_prestart(hooked: bool) -> Iterator[None]:
    if not hooked or PRESTART_ENV in os.environ:
        yield
        return
    os.environ[PRESTART_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(PRESTART_ENV, None)


def _raylet_can_hook(address: object, kwargs: dict[str, Any]) -> bool:
    """Whether this ``ray.init`` starts a local instance whose job would have no runtime_env
    but the run's hook: then the hook goes in the raylet's environment (`Driver.raylet_hook`)
    instead of the job's runtime_env, which makes Ray start every worker through
    ``setup_worker.py``. Not when the program gives the job a runtime_env or a setup hook of
    its own (its workers start so anyway; its hook is chained), sets Ray's prestart (a
    worker prestarted before the hook is stored could not start), or connects to a running
    instance (its raylet's environment is not this process's)."""
    from ray._private import ray_constants, services

    job_config = kwargs.get("job_config")
    if (kwargs.get("runtime_env") or getattr(job_config, "runtime_env", None)
            or PRESTART_ENV in os.environ
            or ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR in os.environ):
        return False
    try:
        return services.canonicalize_bootstrap_address(address, kwargs.get("_temp_dir")) is None
    except Exception:
        return False


def _started_raylet() -> bool:
    """Whether the ``ray.init`` that just returned started the raylet (a local instance)."""
    import ray._private.worker as ray_worker
    from ray._private import ray_constants

    try:
        processes = ray_worker._global_node.all_processes
        return bool(processes.get(ray_constants.PROCESS_TYPE_RAYLET))
    except Exception:
        return True  # (another Ray: if it did, its workers need the hook's entry)


def _is_client_address(address: object) -> bool:
    """Whether ``ray.init(address)`` connects through Ray Client (``ray://``, given or in
    ``RAY_ADDRESS``)."""
    if address is None or address == "auto":
        address = os.environ.get("RAY_ADDRESS")
    return isinstance(address, str) and address.startswith("ray://")


def _shutdown(original: Callable[..., Any]) -> Callable[..., Any]:
    def shutdown(*args: Any, **kwargs: Any) -> Any:
        _finish("at ray.shutdown()")
        return original(*args, **kwargs)

    return shutdown


def _kill(original: Callable[..., Any]) -> Callable[..., Any]:
    def kill(actor: Any, *args: Any, **kwargs: Any) -> Any:
        driver = _driver
        if driver is not None and not driver.finished:
            _flush_before_kill(driver, actor)
        elif driver is None and calls.joined:
            # A worker of the run ending an actor (Ray Train's controller actor ends its
            # workers so): the actor's last delivery says final, so the driver knows.
            _flush_before_kill(None, actor)
        return original(actor, *args, **kwargs)

    return kill


def _finish(reason: str) -> None:
    global _driver
    driver = _driver
    if driver is None:
        return
    _driver = None
    calls.joined = False
    calls.set_late_env(None)
    rt = driver.rt
    try:
        driver.finish(time.monotonic() + rt.settings.shutdown_timeout, reason)
    except Exception as exc:
        rt.stats.warn_once("ray-finish", f"cannot collect Ray workers' last records: {exc!r}")
    try:
        rt.feeds.remove(driver.feed)
    except ValueError:
        pass


def _is_this_actor(actor: Any) -> bool:
    import ray

    own = ray.get_runtime_context().get_actor_id()
    actor_id = getattr(actor, "_actor_id", None)
    return own is not None and actor_id is not None and actor_id.hex() == own


def _flush_before_kill(driver: Any, actor: Any) -> None:
    """Let the actor deliver what it holds before `ray.kill` ends it (bounded); `driver`:
    this process's, or None in a worker (the delivery reaches the driver on its own)."""
    try:
        if _is_this_actor(actor):
            # An actor ending itself (Ray Serve's controller does, from its event loop): a call
            # into it could not run before the kill, it delivers here.
            _shim.flush_in_actor(None)
            return
        with calls.internal():
            ref = actor.__ray_call__.remote(_shim.flush_in_actor)
        key = ref.future().result(timeout=KILL_FLUSH_TIMEOUT)  # not `ray.get` (see sink._push)
    except Exception:
        return  # busy or gone: what it held is counted at the end if it was busy
    if driver is None:
        return
    driver.feed(time.monotonic() + KILL_FLUSH_TIMEOUT)
    if key:
        driver.forget(key)
