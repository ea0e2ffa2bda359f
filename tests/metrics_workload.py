"""A small training-shaped program for the metrics tests (run as a child process, configured
from its environment): an ``update`` block per step in the main process, ``rollout`` blocks in
two forked pool workers, a gauge and two training scalars per step (a reward, and an FPS under
Sample Factory's name), and one slow ``update``.

    python -m tests.metrics_workload STEPS SLOW_STEP
"""

from __future__ import annotations

import multiprocessing
import sys
import time

import otel_rl
from otel_rl._internal.metrics import record_scalar
from otel_rl.timers import hierarchical_timer, set_gauge


def rollout(i: int) -> int:
    with hierarchical_timer("rollout"):
        time.sleep(0.002)
    record_scalar("rollout/items", float(i), i)  # a worker's scalar: reaches the parent's
    return i


def main() -> None:
    steps, slow = int(sys.argv[1]), int(sys.argv[2])
    otel_rl.configure()
    with hierarchical_timer("main_loop"):
        with multiprocessing.get_context("fork").Pool(2) as pool:
            for step in range(steps):
                with hierarchical_timer("update"):
                    time.sleep(0.3 if step == slow else 0.001)
                pool.map(rollout, range(4), chunksize=1)
                set_gauge("reward", float(step))
                record_scalar("reward/reward", step * 1.5, step * 100)
                record_scalar("perf/_fps", 2000.0 + step, step * 100)  # Sample Factory's name
                time.sleep(0.05)
    otel_rl.shutdown()


if __name__ == "__main__":
    main()
