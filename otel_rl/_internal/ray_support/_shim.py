"""The part of otel_rl's Ray support that Ray ships to its workers *by value*.

Ray pickles the job's ``worker_process_setup_hook`` and the flush function `ray.kill` runs
first with cloudpickle; this module is registered with
``ray.cloudpickle.register_pickle_by_value``, so none of that needs otel_rl to be importable
on the worker's machine. Hence: standard library only, nothing imported from otel_rl at
module level, and no module state (each function is unpickled with its own globals).

Where otel_rl is importable, the setup hook hands over to
`otel_rl._internal.ray_support.worker` (looked up by name); where it is not, it still removes the per-call
context argument before the user's function sees it (fail open: the call runs as without
otel_rl).
"""

from __future__ import annotations

from typing import Any

#: The keyword argument a call's context travels in (removed before the function runs).
KEY = "__otel_rl_ctx__"
#: What separates the program's task name from the context in a call's task name.
MARK = "\x1fotel_rl\x1f"


def make_setup_hook(joining: dict[str, str], user_hook: Any = None, job: str | None = None
                    ) -> Any:
    """The job's setup hook for the run `joining` describes (a named function: Ray wants one);
    `job`: the job's id (hex), where the hook reaches every worker of the instance (raylet's
    environment: `driver.Driver.raylet_hook`) and only the job's may join."""

    def otel_rl_setup_hook() -> None:
        setup_hook(joining, user_hook, job)

    return otel_rl_setup_hook


def setup_hook(joining: dict[str, str], user_hook: Any = None, job: str | None = None) -> None:
    """Ray's ``worker_process_setup_hook`` for the run's job: join the run, then run the
    program's own hook (a callable or a ``module.function`` string), as Ray would have. A
    worker of another job than `job` (given) does nothing: its calls carry no context."""
    if job is not None and _job_of_this_worker() not in (job, None):
        return
    joined = False
    try:
        joined = _entry_point().join(joining)
    except Exception:
        joined = False
    if not joined:
        strip_only()
    if user_hook is not None:
        if isinstance(user_hook, str):  # "module.function", or the key Ray exported it by
            from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook

            error = load_and_execute_setup_hook(user_hook)
            if error is not None:
                raise RuntimeError(error)
            return
        user_hook()


def _job_of_this_worker() -> str | None:
    """The job this worker process was started for (hex; "" for none: Ray's spill and
    restore workers, which run no calls; None if Ray does not say: then it joins, as a worker
    of the run's job would)."""
    try:
        import ray._private.worker as ray_worker

        job = ray_worker.global_worker.current_job_id
        return "" if job.is_nil() else str(job.hex())
    except Exception:
        return None


def strip_only() -> None:
    """Without otel_rl: drop the context argument from every call this worker runs."""
    import ray._private.function_manager as fm

    cls = fm.FunctionActorManager
    original = cls.get_execution_info
    if getattr(original, "_otel_rl", False):
        return
    wrapped: dict[int, Any] = {}

    def strip(executor: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop(KEY, None)
            try:
                plain_task_name()
            except Exception:
                pass
            return executor(*args, **kwargs)

        run.__dict__.update(getattr(executor, "__dict__", {}))
        run.__name__ = getattr(executor, "__name__", "run")
        return run

    def get_execution_info(self: Any, job_id: Any, function_descriptor: Any) -> Any:
        info = original(self, job_id, function_descriptor)
        known = wrapped.get(id(info.function))
        if known is None or known[0] is not info.function:
            known = wrapped[id(info.function)] = (info.function, strip(info.function))
        return info._replace(function=known[1])

    get_execution_info._otel_rl = True  # type: ignore[attr-defined]
    cls.get_execution_info = get_execution_info
    import ray._private.worker as ray_worker

    def current_task_name(self: Any) -> str:
        return str(self.core_worker.get_current_task_name()).partition(MARK)[0]

    ray_worker.Worker.current_task_name = property(current_task_name)  # type: ignore[assignment]


def plain_task_name() -> None:
    """The running call's task name carries the caller's context (``<name><MARK><context>``):
    give Ray's log prefix (a task's) and the process title the program's name back."""
    import ray._private.worker as ray_worker

    worker = ray_worker.global_worker
    name = str(worker.core_worker.get_current_task_name())
    if MARK not in name:
        return
    plain = name.partition(MARK)[0]
    if worker.actor_id.is_nil():  # a task: Ray names its log lines' prefix after it
        import sys

        from ray._private.ray_constants import LOG_PREFIX_TASK_NAME

        token = f"{LOG_PREFIX_TASK_NAME}{plain}\n"
        print(token, end="")
        print(token, file=sys.stderr, end="")
    import ray._raylet

    ray._raylet.setproctitle(f"ray::{plain}")


def flush_in_actor(actor: Any) -> Any:
    """Run in an actor (``__ray_call__``) just before `ray.kill`: deliver what it holds now.
    Returns the worker's key once delivered, None if there was nothing to do."""
    try:
        worker = _entry_point()
    except Exception:
        return None
    return worker.flush_now(final=True)


def _entry_point() -> Any:
    """otel_rl's worker side, looked up by name: this module runs where otel_rl may not be
    installed, and imports nothing of it otherwise (ImportError then: fail open)."""
    import importlib

    return importlib.import_module("otel_rl._internal.ray_support.worker")
