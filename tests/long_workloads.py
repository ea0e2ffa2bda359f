"""Long-run workloads, run as ``python -m tests.long_workloads KIND OUT [key=value ...]``.

- ``sf``: Sample Factory-shaped — no per-iteration block. Rollout worker processes (spawn) and
  a learner thread time short top-level blocks with `Timing.add_time`; the main thread runs
  its own short blocks. Defaults make ~220k blocks.
- ``ml``: ML-Agents-shaped — ``advance`` iterations inside a long ``start_learning``.
- ``killed``: blocks in a loop forever (``main_loop`` stays open), for SIGKILL and SIGTERM; a
  ``trainer`` thread is in an open block of its own too.
- ``machine``: a process that shares only a run id and a carrier (``CARRIER`` in the
  environment, relay address removed) with the run: a "second machine".

Settings come from ``key=value`` arguments (ints and floats converted) passed to
`otel_rl.configure`; ``n``/``workers`` size the workload, ``min_s`` is the least time the
``sf`` rollout workers run and ``rest_s`` how long they sleep between blocks past their ``n``th
(0: they go on at full speed).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any

import otel_rl
from otel_rl.timers import hierarchical_timer, set_gauge
from otel_rl.timing import Timing


def rollout(n: int, start: Any, min_s: float, rest_s: float = 0.0) -> None:
    timing = Timing()
    start.wait(60)  # every rollout worker (and the main process) starts at once
    until = time.monotonic() + min_s
    i = 0
    while i < n or time.monotonic() < until:
        if i >= n and rest_s:
            time.sleep(rest_s)
        with timing.add_time("env_step"):
            pass
        if i % 8 == 0:
            with timing.add_time("enqueue_policy_requests"):
                pass
        i += 1
    set_gauge("rollout_fps", float(i))


def learner(running: Any) -> None:
    timing = Timing()
    i = 0
    while running():
        with timing.add_time("split_output_tensors"):
            pass
        if i % 4 == 0:
            with timing.add_time("train"):
                with timing.add_time("backward"):
                    time.sleep(0.0002)
        i += 1


def sf(n: int, workers: int, min_s: float, rest_s: float = 0.0) -> None:
    """Rollout workers do `n` env steps each (and go on until `min_s` seconds have passed),
    started together once all of them are up; the learner thread and the main thread work
    alongside them until they are done, as in a real run."""
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(workers + 1)
    procs = [ctx.Process(target=rollout, args=(n, start, min_s, rest_s))
             for _ in range(workers)]
    for p in procs:
        p.start()

    def running() -> bool:
        return any(p.is_alive() for p in procs)

    thread = threading.Thread(target=learner, args=(running,), name="learner")
    thread.start()
    start.wait(60)
    i = 0
    while running():
        with hierarchical_timer("process_batch"):
            time.sleep(0.0002)
        if i % 1000 == 0:
            set_gauge("reward", float(i))
        i += 1
    thread.join()
    for p in procs:
        p.join()


def ml(n: int) -> None:
    with hierarchical_timer("start_learning"):
        for i in range(n):
            with hierarchical_timer("advance"):
                with hierarchical_timer("env_step"):
                    pass
                with hierarchical_timer("update"):
                    pass
            if i % 500 == 0:
                set_gauge("reward", float(i))


def _trainer(stop: threading.Event) -> None:
    with hierarchical_timer("trainer_loop"):
        while not stop.is_set():
            with hierarchical_timer("update"):
                time.sleep(0.001)


def killed() -> None:
    stop = threading.Event()
    threading.Thread(target=_trainer, args=(stop,), name="trainer", daemon=True).start()
    print("ready", flush=True)
    with hierarchical_timer("main_loop"):
        while True:
            with hierarchical_timer("advance"):
                with hierarchical_timer("env_step"):
                    time.sleep(0.0005)


def machine(n: int) -> None:
    for _ in range(n):
        with hierarchical_timer("remote_block"):
            with hierarchical_timer("remote_inner"):
                pass


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(argv: list[str]) -> None:
    kind, out, *pairs = argv
    settings = {k: _value(v) for k, v in (p.split("=", 1) for p in pairs)}
    n = int(settings.pop("n", 50_000))
    workers = int(settings.pop("workers", 2))
    min_s = float(settings.pop("min_s", 0))
    rest_s = float(settings.pop("rest_s", 0))
    if kind == "machine":
        import json

        carrier = json.loads(os.environ["CARRIER"])
        os.environ["TRACEPARENT"] = carrier["traceparent"]
        context = json.loads(carrier["otel_rl"])
        context.pop("relay", None)  # no relay between machines
        os.environ["OTEL_RL_CONTEXT"] = json.dumps(context)
    otel_rl.configure(output_dir=out, **settings)
    if kind == "sf":
        sf(n, workers, min_s, rest_s)
    elif kind == "ml":
        ml(n)
    elif kind == "killed":
        killed()
    elif kind == "machine":
        machine(n)
    else:
        raise SystemExit(f"unknown workload {kind!r}")
    otel_rl.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
