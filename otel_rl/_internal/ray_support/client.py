"""A driver on Ray Client (``ray.init("ray://host:port")``): its calls carry context too.

On Ray Client the program's process is not a Ray driver: every ``.remote()`` becomes a
`ClientTask` sent over gRPC to a server process in the cluster, which makes the real call
there (with Ray's own, unpatched code). The local submit patches (`calls`) never run, and the
job's runtime_env cannot take the run's setup hook (a callable; Ray Client sends the job's
runtime_env as JSON). So, in the client:

- Joining: once connected, the run's setup hook is pickled here (`_shim` by value, as for a
  local driver) and stored in the cluster's GCS under the key Ray's own export uses (through
  Ray Client's ``internal_kv`` call); every task and actor the program creates from then on is
  given a runtime_env whose ``env_vars`` name that key (Ray merges them into the job's), so
  the worker processes running them join the run (`driver.Driver.late_runtime_env`, the
  same mechanism as ``configure()`` after ``ray.init``).
- Calls: `patch_submit` wraps Ray Client's one submission point, ``Worker.call_remote``. A
  task or actor-method call carries the block open on the calling thread in its task name
  (the ``name`` option, which the server passes on: ``<name><MARK><carrier>``, as a local
  call), read back by the worker's executor wrapper (`calls.wrap_executor`). An actor
  creation's name is the actor's registered name, and its arguments are checked against
  ``__init__`` by the unpatched server: it carries the carrier in its runtime_env instead
  (``env_vars[ENV]``; an actor has a worker process of its own), read by the wrapper of the
  actor's ``__init__``.

A call or actor with a runtime_env of its own keeps it untouched (its worker process may not
join the run, as with a local driver). Everything here is fail-open: a call runs as without
otel_rl when its context cannot be attached.
"""

from __future__ import annotations

import hashlib
from typing import Any

from otel_rl._internal.ray_support import calls

#: The environment variable an actor created from a Ray Client driver finds its caller's
#: context in (read once, by its ``__init__``'s wrapper).
ENV = calls.CLIENT_ENV


def connected() -> bool:
    """Whether this process talks to Ray through Ray Client now."""
    try:
        import ray.util.client as client

        return bool(client.ray.is_connected())
    except Exception:
        return False


def export_setup_hook(hook: Any) -> dict[str, Any]:
    """Store `hook` in the cluster where Ray workers look setup hooks up; the runtime_env
    (``env_vars``) that makes a task's or actor's worker process run it."""
    import ray
    import ray.cloudpickle
    from ray._private import ray_constants
    from ray._private.function_manager import WORKER_PROCESS_SETUP_HOOK_KEY_NAME_GCS
    from ray._private.runtime_env.setup_hook import decode_function_key
    from ray.experimental.internal_kv import _internal_kv_put

    pickled = ray.cloudpickle.dumps(hook)
    function_id = hashlib.shake_128(pickled).digest(ray_constants.ID_SIZE)
    try:
        job = str(ray.get_runtime_context().get_job_id())
        bytes.fromhex(job)
    except Exception:
        job = "ffffffff"
    # The layout of Ray's own export (`FunctionActorManager.export_setup_func`): the job id
    # in the key lets Ray drop it with the job.
    key = b":".join([WORKER_PROCESS_SETUP_HOOK_KEY_NAME_GCS.encode(), job.encode(), function_id])
    entry = ray.cloudpickle.dumps({"job_id": bytes.fromhex(job), "function_id": function_id,
                                   "function_name": getattr(hook, "__name__", "hook"),
                                   "function": pickled})
    _internal_kv_put(key, entry, True, namespace=ray_constants.KV_NAMESPACE_FUNCTION_TABLE)
    return {"env_vars": {ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR:
                         decode_function_key(key)}}


_original: dict[str, Any] = {}
#: Where a Ray Client actor handle keeps its class's name (`_remember_actor_class`).
_CLASS = "_otel_rl_class"


def patch_submit() -> None:
    """Make every call submitted through Ray Client from this process carry its context."""
    if _original:
        return
    from ray.util.client import worker as client_worker

    cls = client_worker.Worker
    original = _original["call_remote"] = cls.call_remote

    def call_remote(self: Any, instance: Any, *args: Any, **kwargs: Any) -> Any:
        value = calls.carrier_for_call() if calls.joined else None
        if value is not None:
            try:
                instance = _with_context(instance, value)
            except Exception:
                pass  # the call goes as the program made it
        return original(self, instance, *args, **kwargs)

    call_remote.__name__ = original.__name__
    call_remote.__doc__ = original.__doc__
    call_remote.__wrapped__ = original  # type: ignore[attr-defined]
    cls.call_remote = call_remote
    _remember_actor_class()


def _remember_actor_class() -> None:
    """A Ray Client actor handle made here keeps its class's name (Ray's default task name
    of a method call is ``Class.method``; the handle itself does not keep the class)."""
    from ray.util.client.common import ClientActorHandle

    original = _original["handle_init"] = ClientActorHandle.__init__

    def __init__(self: Any, actor_ref: Any, actor_class: Any = None, *args: Any,
                 **kwargs: Any) -> None:
        original(self, actor_ref, actor_class, *args, **kwargs)
        if actor_class is not None:
            self.__dict__[_CLASS] = getattr(actor_class, "_name", None)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    ClientActorHandle.__init__ = __init__


def _with_context(instance: Any, value: str) -> Any:
    """`instance` (a Ray Client stub, or its `.options(...)` wrapper) with options that carry
    `value`: a new wrapper over the same stub, the program's options kept."""
    from ray.util.client.common import (
        ClientActorClass,
        ClientRemoteFunc,
        ClientRemoteMethod,
        OptionWrapper,
    )

    if isinstance(instance, OptionWrapper):
        stub, options = instance._remote_stub, dict(instance._options or {})
    else:
        stub, options = instance, {}
    late = calls.late_env
    if late is None:
        return instance
    if isinstance(stub, ClientActorClass):
        env = _joining_env(options, stub, late)
        if env is None:
            return instance  # a setup hook of its own: its process cannot join the run
        env["env_vars"][ENV] = value
        options["runtime_env"] = env
    elif isinstance(stub, ClientRemoteFunc):
        env = _joining_env(options, stub, late)
        if env is None:
            return instance
        options["runtime_env"] = env
        options["name"] = calls.task_name_with(options.get("name"), value, stub, _func_name)
    elif isinstance(stub, ClientRemoteMethod):
        options["name"] = calls.task_name_with(options.get("name"), value, stub, _method_name)
    else:
        return instance
    return OptionWrapper(stub, options)


def _joining_env(options: dict[str, Any], stub: Any,
                 late: dict[str, Any]) -> dict[str, Any] | None:
    """The runtime_env that makes the call's worker process join the run: the call's own
    (given to ``.options`` or ``@ray.remote``) with the run's setup-hook variable added to its
    ``env_vars`` (so a worker where otel_rl cannot be imported still takes the carrier off),
    or the run's alone; None if the call brings a setup hook of its own."""
    own = options.get("runtime_env") or (getattr(stub, "_options", None) or {}).get(
        "runtime_env")
    if not own:
        return {**late, "env_vars": dict(late.get("env_vars") or {})}
    own = dict(own)
    env_vars = dict(own.get("env_vars") or {})
    if own.get("worker_process_setup_hook") or any(k in env_vars for k in late["env_vars"]):
        return None
    env_vars.update(late["env_vars"])
    own["env_vars"] = env_vars
    return own


def _func_name(stub: Any) -> str:
    """The name Ray gives a task call of `stub` by default (``f``)."""
    return str(stub._name)


def _method_name(stub: Any) -> str:
    """The name Ray gives a call of the actor method `stub` by default (``Class.method``)."""
    owner = str(stub._actor_handle.__dict__.get(_CLASS) or "")
    return f"{owner}.{stub._method_name}" if owner else str(stub._method_name)
