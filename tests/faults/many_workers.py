"""Many forked workers (more than the 128 the killed main's mirror first had room for), for
the killed-main test: each records `BEFORE` step blocks, flushes them to the main process,
records `AFTER` more that stay in its buffer (no periodic flush), says so, and waits to be
killed with the main process, which has written what it received to its spans file.

    python -m tests.faults.many_workers OUT READY WORKERS
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import otel_rl
from otel_rl.timers import hierarchical_timer
from tests.faults.helpers import say_ready

BEFORE, AFTER = 3, 2


def worker(ready: str) -> None:
    for _ in range(BEFORE):
        with hierarchical_timer("step"):
            pass
    otel_rl.force_flush()
    for _ in range(AFTER):
        with hierarchical_timer("late"):
            pass
    with open(f"{ready}.{os.getpid()}", "w") as f:
        f.write("ready")
    time.sleep(120)


def main() -> None:
    out, ready, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    otel_rl.configure(output_dir=out, spans="all", flush_interval=3600, count_if_killed=True)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=worker, args=(ready,)) for _ in range(count)]
    for p in procs:
        p.start()
    while sum(1 for p in procs if os.path.exists(f"{ready}.{p.pid}")) < count:
        time.sleep(0.05)
    time.sleep(1.0)  # the relay reads what the workers sent
    otel_rl.force_flush()
    say_ready(f"{ready}.pids", " ".join(str(p.pid) for p in procs))
    say_ready(ready, str(os.getpid()))
    time.sleep(120)


if __name__ == "__main__":
    main()
