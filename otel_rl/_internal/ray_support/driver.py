"""The driver's side of a Ray run: workers join through the job, records come back through Ray.

`ray.init` (patched) adds the run's ``worker_process_setup_hook`` to the job's runtime_env
(chaining the program's own hook), so every worker process of the job joins the run, on a
local instance and on a cluster that was already running alike. For a local instance whose job
would have no runtime_env but the hook, the hook goes in the environment of the raylet it
starts instead (`Driver.raylet_hook`): the job's runtime_env stays empty and Ray starts its
workers without ``setup_worker.py``. Right after, it opens the run's mailbox in the GCS's key-value store
(`mailbox`: no process of its own). Every flush the driver takes what workers put there
(`feed`) into the pipeline, exactly as records relayed by forked workers, and keeps each
worker's latest snapshot for the whole-run tree.

At `ray.shutdown` (and `ray.kill` of an actor, and the run's own shutdown) the driver asks
for a last delivery: every worker answers with its next push (at most a flush interval
away). Workers that were busy at their last push and never answer are counted lost by
`Ledger`, with the reason, and the whole-run tree is marked incomplete.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from otel_rl._internal import relay, semconv, wholerun
from otel_rl._internal.ray_support import _shim, client
from otel_rl._internal.ray_support.mailbox import Mailbox, decode
from otel_rl._internal.runtime import Runtime

#: Seconds a take from the mailbox may take.
DRAIN_TIMEOUT = 10.0
#: A Ray worker's flush interval at most (seconds): a worker that Ray ends when idle has
#: delivered everything by then, and one killed during a call loses at most that call plus
#: this much of what came before it.
WORKER_FLUSH_INTERVAL = 0.5


class _WorkerState:
    __slots__ = ("answered", "busy", "final", "index", "pid", "recorded", "records", "refused",
                 "role", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self.busy = False
        self.answered = False
        self.final = False
        self.records = 0
        #: What the worker's latest snapshot says it recorded (its buffer included).
        self.recorded = 0
        self.refused = 0
        self.role = "worker"
        self.index = 0
        self.pid = 0


class Ledger:
    """Per Ray worker process of the run: what it delivered, and whether it ended without
    delivering everything (the counts the run's loss accounting reads)."""

    def __init__(self) -> None:
        self.workers: dict[str, _WorkerState] = {}
        self.indices: dict[str, int] = {}
        self.pushes = 0
        self.records = 0
        self.refused = 0
        self.lost: list[str] = []  # one line per worker that ended without its last push

    def state(self, key: str) -> _WorkerState:
        state = self.workers.get(key)
        if state is None:
            state = self.workers[key] = _WorkerState()
        return state

    def index_for(self, key: str, role: str) -> int:
        slot = f"{role}\0{key}"
        index = self.indices.get(slot)
        if index is None:
            index = self.indices[slot] = sum(1 for s in self.indices if s.startswith(f"{role}\0"))
        return index

    def held(self) -> int:
        """Records workers still running reported recorded (their latest snapshots) and have
        not delivered."""
        return sum(max(0, s.recorded - s.records - s.refused)
                   for s in self.workers.values() if not s.final)

    def waiting(self) -> list[str]:
        """Workers a last delivery is still awaited from: busy at their last push, or holding
        records their latest snapshot counts and no push has carried yet (a call that ended
        between a worker's drain and its snapshot: the tree has its blocks, the records come
        with the next push)."""
        return [key for key, s in self.workers.items()
                if not s.final and ((s.busy and not s.answered)
                                    or s.recorded > s.records + s.refused)]


class Driver:
    """The run's Ray side in the driver process."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.name = f"{rt.run_id}-{uuid.uuid4().hex[:8]}"
        self.mailbox: Mailbox | None = None  # open once Ray is up
        self.ledger = Ledger()
        self.finished = False
        self._final = False
        self._drains = 0
        self._lock = threading.Lock()

    # -- joining ------------------------------------------------------------------------------
    def joining_carrier(self) -> dict[str, str]:
        """The carrier a worker process joins the run with (no clock offset: its own)."""
        from otel_rl._internal import carrier
        from otel_rl._internal.config import CARRIED

        rt = self.rt
        data: dict[str, Any] = {
            "path": [], "pid": rt.pid, "tid": rt.run_stack.tid if rt.run_stack else 0,
            "run_id": rt.run_id, "role": None, "index": None,
            "run": [f"{rt.root_run[0]:032x}", f"{rt.root_run[1]:016x}"], "t0": rt.t0_ns,
            "relay": f"ray:/{self.name}",
            "settings": {name: getattr(rt.settings, name) for name in CARRIED},
        }
        data["settings"]["flush_interval"] = min(rt.settings.flush_interval,
                                                 WORKER_FLUSH_INTERVAL)
        sampled = rt.spans_on
        return carrier.make(rt.trace.trace_id, rt.run_span_id, sampled, data)

    def runtime_env(self, runtime_env: Any) -> Any:
        """`runtime_env` with the run's setup hook added (the program's own one chained)."""
        env = dict(runtime_env or {})
        user_hook = env.get("worker_process_setup_hook")
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(_shim)
        env["worker_process_setup_hook"] = _shim.make_setup_hook(self.joining_carrier(),
                                                                 user_hook)
        return env

    @property
    def _hook_key(self) -> bytes:
        """The function-table key of the hook `raylet_hook` names (the driver's own)."""
        return f"otel_rl:{self.name}:setup_hook".encode()

    def raylet_hook(self) -> tuple[str, str]:
        """For a local instance the driver's ``ray.init`` starts, when the program gives the
        job no runtime_env: (variable, value) that, in the environment of the raylet it
        starts, makes each worker run the run's setup hook (Ray's ``default_worker.py`` reads
        it before its main loop) while the job's runtime_env stays empty, so Ray starts its
        workers without ``setup_worker.py`` (~0.3 s of CPU each). The value names a GCS entry
        that exists once `export_raylet_hook` has run, right after the driver connected and
        before the program can start a call (no worker is prestarted: `patches._no_prestart`)."""
        import base64

        from ray._private import ray_constants
        from ray._private.runtime_env.setup_hook import RUNTIME_ENV_FUNC_IDENTIFIER

        return (ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR,
                RUNTIME_ENV_FUNC_IDENTIFIER + base64.b64encode(self._hook_key).decode())

    def export_raylet_hook(self) -> None:
        """Store the hook `raylet_hook` names, as Ray stores a job's (its function table),
        for this job only: a worker of another job on the same instance skips it."""
        import pickle

        import ray._private.worker as ray_worker
        import ray.cloudpickle
        from ray._private import ray_constants

        worker = ray_worker.global_worker
        job = worker.current_job_id
        ray.cloudpickle.register_pickle_by_value(_shim)
        hook = _shim.make_setup_hook(self.joining_carrier(), None, job.hex())
        entry = pickle.dumps({"job_id": job.binary(), "function_id": self._hook_key,
                              "function": ray.cloudpickle.dumps(hook)})
        for attempt in range(3):  # the GCS was reached a moment ago; a worker fails without it
            try:
                worker.gcs_client.internal_kv_put(self._hook_key, entry, True,
                                                  ray_constants.KV_NAMESPACE_FUNCTION_TABLE,
                                                  timeout=DRAIN_TIMEOUT)
                return
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.1)

    def late_runtime_env(self) -> dict[str, Any]:
        """For a Ray session that was started before otel_rl (``configure()`` after
        ``ray.init``): the job's runtime_env can no longer change, so each task and actor
        created from now on is given one that runs the run's setup hook (Ray merges its
        ``env_vars`` into the job's; the job's own setup hook, if any, still runs after ours).
        Ray starts such calls in worker processes of their own, which join the run."""
        import ray
        import ray._private.worker as ray_worker
        import ray.cloudpickle
        from ray._private import ray_constants
        from ray._private.runtime_env.setup_hook import export_setup_func_callable

        variable = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
        job_env = ray.get_runtime_context().runtime_env or {}
        user_hook = (job_env.get("env_vars") or {}).get(variable)
        ray.cloudpickle.register_pickle_by_value(_shim)
        hook = _shim.make_setup_hook(self.joining_carrier(), user_hook)
        if client.connected():  # Ray Client: no local worker to export with
            return client.export_setup_hook(hook)
        exported = export_setup_func_callable({}, hook, ray_worker.global_worker)
        return {"env_vars": {variable: exported["env_vars"][variable]}}

    def open_mailbox(self) -> None:
        """Open the run's mailbox (Ray is up): workers may put into it from now on."""
        mailbox = Mailbox(self.name)
        mailbox.say(DRAIN_TIMEOUT, final=False, drains=0)
        self.mailbox = mailbox
        self.rt.stats.ledger.held_elsewhere(0)  # (a killed driver's count is a lower bound now)

    # -- receiving ----------------------------------------------------------------------------
    def feed(self, deadline: float) -> None:
        """Take what workers pushed since the last feed into the run (flush thread)."""
        mailbox = self.mailbox
        if mailbox is None or self.finished:
            return
        import ray

        with self._lock:
            if not ray.is_initialized():
                return
            timeout = max(0.1, min(DRAIN_TIMEOUT, deadline - time.monotonic()))
            items: list[tuple[str, bytes]] = []
            try:
                items = mailbox.take(timeout)
                if items:  # the workers' bound on what waits starts again (`mailbox`)
                    self._drains += 1
                    mailbox.say(timeout, final=self._final, drains=self._drains)
            except Exception as exc:
                self.rt.stats.warn_once("ray-drain", f"cannot take from the Ray mailbox: {exc!r}")
                if not items:
                    return
            for key, value in items:
                self._ingest(key, value)
            self.rt.stats.ledger.held_elsewhere(self.ledger.held())

    def _ingest(self, key: str, value: bytes) -> None:
        try:
            meta, frames = decode(value)
        except Exception as exc:
            self.rt.stats.warn_once("ray-frame", f"ignoring a malformed push from {key}: {exc!r}")
            return
        ledger, rt = self.ledger, self.rt
        state = ledger.state(key)
        ledger.pushes += 1
        if meta.get("notice"):
            state.busy = True
            return
        state.seq = max(state.seq, int(meta.get("seq") or 0))
        state.busy = bool(meta.get("busy"))
        state.answered = state.answered or bool(meta.get("answer"))
        state.final = state.final or bool(meta.get("final"))
        state.pid = int(meta.get("pid") or 0)
        records = int(meta.get("records") or 0)
        if meta.get("refused"):
            state.refused += records
            ledger.refused += records
            rt.stats.add_dropped("buffer full", records, None, "the Ray mailbox was full")
            rt.stats.ledger.taken(0, outside=records)  # (never records of this process)
            return
        at = 0
        while at + relay.FRAME_HEADER.size <= len(frames):
            length, kind = relay.FRAME_HEADER.unpack_from(frames, at)
            body = frames[at + relay.FRAME_HEADER.size:at + relay.FRAME_HEADER.size + length]
            at += relay.FRAME_HEADER.size + length
            try:
                if kind == relay.KIND_COLUMNS:
                    batch = relay.decode_columns(body)
                    role = str(batch.resource.get(semconv.WORKER_ROLE) or "worker")
                    if not meta.get("index_given") and batch.records:
                        batch.resource[semconv.WORKER_INDEX] = ledger.index_for(key, role)  # type: ignore[index]
                    # Held here from now on: a killed driver's survivor counts them.
                    rt.stats.ledger.taken(len(batch.records))
                    rt.pipeline.add_relayed(batch)
                    state.records += len(batch.records)
                    ledger.records += len(batch.records)
                elif kind == relay.KIND_SNAPSHOT:
                    import json

                    snapshot = wholerun.received(json.loads(body))
                    state.role = str(snapshot.get("role") or "worker")
                    state.recorded = max(state.recorded, int(snapshot.get("recorded") or 0))
                    if not meta.get("index_given") and snapshot.get("contributions"):
                        snapshot["index"] = ledger.index_for(key, state.role)
                    with rt.snapshots_lock:
                        rt.snapshots[f"ray:{key}"] = snapshot
            except Exception as exc:
                rt.stats.warn_once("ray-frame", f"ignoring a malformed frame from {key}: {exc!r}")

    # -- ending -------------------------------------------------------------------------------
    def finish(self, deadline: float, reason: str) -> None:
        """Ask every worker for a last delivery and wait for the busy ones (bounded); count
        the ones that never answer as lost."""
        mailbox = self.mailbox
        if mailbox is None or self.finished:
            return
        import ray

        if not ray.is_initialized():
            self.finished = True
            return
        wait_until = min(deadline, time.monotonic() + WORKER_FLUSH_INTERVAL + 3.0)
        self._final = True
        try:
            mailbox.say(max(0.1, wait_until - time.monotonic()), final=True,
                        drains=self._drains)
        except Exception as exc:
            self.rt.stats.warn_once("ray-final", f"cannot reach the Ray mailbox: {exc!r}")
        self.feed(deadline)
        while self.ledger.waiting() and time.monotonic() < wait_until:
            time.sleep(0.1)
            self.feed(deadline)
        self.finished = True
        try:  # what a worker puts from now on is not read: leave nothing in the GCS
            mailbox.clear(max(0.1, min(DRAIN_TIMEOUT, deadline - time.monotonic())))
        except Exception:
            pass
        self._count_lost(reason)
        self.rt.stats.ledger.held_elsewhere(None)  # (nothing comes from Ray workers any more)

    def forget(self, key: str) -> None:
        """`key`'s worker delivered its last push (before `ray.kill`)."""
        self.ledger.state(key).final = True

    def _count_lost(self, reason: str) -> None:
        interval = min(self.rt.settings.flush_interval, WORKER_FLUSH_INTERVAL)
        for key in self.ledger.waiting():
            state = self.ledger.workers[key]
            line = (f"Ray worker {key} ({state.role} {self.ledger.index_for(key, state.role)}) "
                    f"ended during a call without delivering its last records "
                    f"(its current call and at most {interval:g} s before it; found {reason})")
            self.ledger.lost.append(line)
            self.rt.notes.append(line)
            # The run's ledger: what its last snapshot said it had recorded and never arrived
            # (a lower bound: what it recorded after that snapshot cannot be counted).
            with self.rt.snapshots_lock:
                snap = self.rt.snapshots.get(f"ray:{key}")
            recorded = int((snap or {}).get("recorded") or 0)
            lost = max(0, recorded - state.records)
            self.rt.stats.add_dropped("killed worker", lost, None, f"Ray worker {key}")
            self.rt.stats.ledger.taken(0, outside=lost)  # (never records of this process)
            self.rt.stats.ledger.note(line)  # (said in the exit line, once)
            state.final = True  # counted once
