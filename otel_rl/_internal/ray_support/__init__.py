"""Ray tasks and actors in the run: calls carry context, workers join, nothing lost.

Modules (imports point down this list, never back up):

- `patches`: what is patched in Ray. Installed when ``ray`` is imported in a process where
  otel_rl propagates (`propagation` patches on import: the driver after `otel_rl.configure()`
  or under ``otel-rl run``), and by `worker.join` in every Ray worker process of the run.
- `driver`: the run's side in the driver: the job's setup hook, taking from the mailbox, the
  `driver.Ledger` of deliveries and losses.
- `worker`: a Ray worker process joining the run, its role.
- `client`: a driver on Ray Client (``ray://``): its one submission point, the setup hook
  stored through the client.
- `calls`: the per-call carrier, its submit side and its execute side.
- `sink`: a worker's delivery to the driver through Ray.
- `mailbox`: where workers' pushes wait for the driver: the run's entries in the GCS's
  key-value store.
- `_shim`: what Ray ships to workers by value (works where otel_rl is not installed).

Internal API for framework integrations (the RLlib module builds on it):

- A Ray worker process joins the run by itself: nothing to call. In it,
  `otel_rl._internal.runtime.active()` is a worker runtime (``is_worker``) whose records go
  to the driver through Ray (`sink.RaySink`). Joining runs `propagation.install()`, so patches
  made when a module is imported (`propagation._LAZY_PATCHES`, e.g. one for ``ray.rllib``)
  apply in Ray workers too, on any node, with or without ``otel-rl run``.
- ``worker.set_role(role, index=None)``: name this worker process's role in the run (resource
  ``otel_rl.worker.role``, the whole-run ``workers`` list, the HTML report). Default: an
  actor's class name (set before its ``__init__`` runs), ``ray_task`` for a process that runs
  tasks only. Indices are numbered per role by the driver in the order it first receives
  blocks from each process, unless given.
- ``worker.flush_now(final)``: deliver what this process holds now (bounded).
- ``calls.carrier_text()`` / ``calls.parse(value)``: the per-call context carrier (a str;
  an actor creation's argument holds it as bytes, which Ray serializes faster); task and
  actor-method calls carry it in their task name.
- Every ``.remote()`` (task, actor creation, actor method; from the driver or from inside a
  worker) carries the block open on the calling thread; the call's blocks in the worker are
  children of it (spans, and the whole-run timers.json as parallel branches).
- A Ray Serve ``DeploymentHandle.remote()`` carries the block open at the call the same way
  (`calls.patch_serve_handle`; Serve makes the Ray call later, from its router's thread).
- ``patches.current_driver()``: the driver's `driver.Driver` (its `Ledger` holds per-worker
  delivery counts and the lines of workers counted lost), None elsewhere.
"""
