"""A worker's own worker SIGKILLed (issue 16): main -> child -> grandchild, all spawned; the
grandchild records `BLOCKS` steps, waits for its report to reach the child, records `AFTER`
more and kills itself. ``python -m tests.faults.nested_workload OUT``."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time

import otel_rl
from otel_rl.timers import hierarchical_timer

BLOCKS, AFTER = 100, 20
#: main, child, grandchild blocks (`grand` stays open: the child cuts it short).
EXPECTED = 1 + 1 + 1 + 2 * (BLOCKS + AFTER)


def _steps(n: int) -> None:
    for _ in range(n):
        with hierarchical_timer("step"):
            with hierarchical_timer("inner"):
                pass


def grandchild() -> None:
    with hierarchical_timer("grand"):
        _steps(BLOCKS)
        time.sleep(1.5)  # its records and a report reach the child first
        _steps(AFTER)
        os.kill(os.getpid(), signal.SIGKILL)


def child() -> None:
    with hierarchical_timer("child"):
        p = mp.get_context("spawn").Process(target=grandchild)
        p.start()
        p.join()


def main() -> None:
    otel_rl.configure(output_dir=sys.argv[1], spans="all", propagate=True, flush_interval=0.2)
    with hierarchical_timer("main"):
        p = mp.get_context("spawn").Process(target=child)
        p.start()
        p.join()
    otel_rl.shutdown()


if __name__ == "__main__":
    main()
