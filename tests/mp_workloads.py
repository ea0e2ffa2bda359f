"""Worker functions for the cross-process tests (importable, so spawn/forkserver work)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

from otel_rl.timers import get_timer_root, hierarchical_timer, reset_timers, set_gauge, timed


@timed
def env_step() -> None:
    with hierarchical_timer("physics"):
        pass


@timed
def timed_double(x: int) -> int:
    return x * 2


@hierarchical_timer("decorated_block")
def decorated_double(x: int) -> int:
    return x * 2


def worker(n: int) -> None:
    for _ in range(n):
        env_step()
    set_gauge("worker_gauge", float(n))


def task(x: int) -> int:
    with hierarchical_timer("task"):
        with hierarchical_timer("task_inner"):
            return x * 2


def pid_task(x: int) -> int:
    with hierarchical_timer("task"):
        time.sleep(0.01)
        return os.getpid()


def failing_worker(n: int) -> None:
    for _ in range(n):
        env_step()
    with hierarchical_timer("doomed"):
        raise RuntimeError("worker failed on purpose")


def stuck_worker(n: int, ready: Any) -> None:
    for _ in range(n):
        env_step()
    time.sleep(1.0)  # let the flusher ship the records (flush_interval is short in the test)
    ready.set()
    time.sleep(600)


def nested_worker(n: int) -> None:
    with hierarchical_timer("spawn_grandchild"):
        child = mp.get_context("spawn").Process(target=worker, args=(n,))
        child.start()
        child.join()
    with hierarchical_timer("own_work"):
        pass


def mlagents_env_worker(conn: Any, steps: int) -> None:
    """Shaped like ML-Agents' SubprocessEnvManager worker: send the timer root with each step,
    then reset the timers."""
    for _ in range(steps):
        conn.recv()
        with hierarchical_timer("worker_step"):
            with hierarchical_timer("env.step"):
                pass
            with hierarchical_timer("_generate_all_results"):
                pass
        conn.send(get_timer_root())
        reset_timers()
    conn.close()


class TorchLikeProcess(mp.context.SpawnProcess):
    """A Process subclass from a custom context, as torch.multiprocessing defines."""

    def run(self) -> None:
        with hierarchical_timer("custom_run"):
            super().run()


class TorchLikeContext(mp.context.SpawnContext):
    Process = TorchLikeProcess  # type: ignore[assignment]


def configuring_worker(n: int) -> None:
    """A worker that calls configure() itself, as some training code does."""
    import otel_rl

    otel_rl.configure(service_name="rollout-worker")
    worker(n)
