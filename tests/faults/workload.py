"""The fault suite's workload: a main process and 2 spawned workers x 4 threads, each thread
running a known number of blocks, so every test knows exactly how many blocks were recorded.

    python -m tests.faults.workload OUT [--endpoint URL] [--blocks N] [--kill-worker I]
                                        [--after-kill N] [--hold S] ...

Blocks: ``main`` (1) + per worker ``worker`` (1) + per thread N x (``step`` + ``inner``).
`expected_blocks` says how many, for the tests.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

import otel_rl
from otel_rl.timers import hierarchical_timer
from tests.faults.helpers import say_ready

WORKERS = 2
THREADS = 4


def expected_blocks(blocks: int, workers: int = WORKERS, threads: int = THREADS) -> int:
    return 1 + workers * (1 + threads * blocks * 2)


def _thread(blocks: int, step_sleep: float = 0.0) -> None:
    for _ in range(blocks):
        with hierarchical_timer("step"):
            with hierarchical_timer("inner"):
                pass
        if step_sleep:
            time.sleep(step_sleep)


def worker(index: int, blocks: int, threads: int, kill: bool, after_kill: int,
           flush_wait: float, hold: float, done: str | None = None,
           step_sleep: float = 0.0) -> None:
    with hierarchical_timer("worker"):
        pool = [threading.Thread(target=_thread, args=(blocks, step_sleep))
                for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if done:  # its blocks have reached the parent (a few flushes): say so
            time.sleep(flush_wait)
            with open(f"{done}.{os.getpid()}", "w") as f:
                f.write("done")
        if kill:
            time.sleep(flush_wait)  # its records and a snapshot reach the parent first
            _thread(after_kill)  # recorded after its last report: lost with it
            os.kill(os.getpid(), signal.SIGKILL)
        if hold:
            time.sleep(hold)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--endpoint")
    parser.add_argument("--protocol", default="http/protobuf")
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--kill-worker", type=int, default=-1)
    parser.add_argument("--after-kill", type=int, default=0)
    parser.add_argument("--flush", type=float, default=0.2)
    parser.add_argument("--shutdown-timeout", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--max-buffer", type=int, default=100_000)
    parser.add_argument("--hold", type=float, default=0.0, help="workers wait this long at the end")
    parser.add_argument("--ready", help="file to create once the workers run")
    parser.add_argument("--timers-interval", type=float, help="periodic timers.json every S")
    parser.add_argument("--kill-at-once", action="store_true",
                        help="the killed worker does not wait for a flush first")
    parser.add_argument("--zero-code", action="store_true",
                        help="under `otel-rl run`: settings from the environment, no configure()")
    parser.add_argument("--main-steps", type=int, default=0,
                        help="the main process's own threads (--threads) run this many steps")
    parser.add_argument("--workers-done", help="each worker creates <this>.<pid> once flushed")
    parser.add_argument("--step-sleep", type=float, default=0.0,
                        help="workers sleep this long after each step (busy for a while)")
    parser.add_argument("--count-if-killed", action="store_true",
                        help="configure(count_if_killed=True): a watcher counts a killed main")
    args = parser.parse_args()
    settings: dict[str, object] = dict(
        output_dir=args.out, spans="all", flush_interval=args.flush, propagate=True,
        shutdown_timeout=args.shutdown_timeout, max_buffer=args.max_buffer,
        timeout=args.timeout)
    if args.timers_interval:
        settings.update(timers_interval=args.timers_interval)
    if args.count_if_killed:
        settings.update(count_if_killed=True)
    if args.endpoint:
        settings.update(endpoint=args.endpoint, protocol=args.protocol)
    if not args.zero_code:
        otel_rl.configure(**settings)  # type: ignore[arg-type]
    ctx = mp.get_context("spawn")
    with hierarchical_timer("main"):
        procs = [ctx.Process(target=worker, args=(i, args.blocks, args.threads,
                                                  i == args.kill_worker, args.after_kill,
                                                  0.0 if args.kill_at_once
                                                  else args.flush * 5 + 0.5, args.hold,
                                                  args.workers_done, args.step_sleep))
                 for i in range(args.workers)]
        for p in procs:
            p.start()
        if args.main_steps:
            if args.workers_done:  # the main's own steps come after the workers' reached it
                import glob

                while len(glob.glob(f"{args.workers_done}.*")) < args.workers:
                    time.sleep(0.02)
            pool = [threading.Thread(target=_thread, args=(args.main_steps, args.step_sleep))
                    for _ in range(args.threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        if args.ready:
            say_ready(f"{args.ready}.main", str(os.getpid()))
            say_ready(args.ready, " ".join(str(p.pid) for p in procs))
        for p in procs:
            p.join()
    started = time.monotonic()
    otel_rl.shutdown()
    print(f"workload: shutdown took {time.monotonic() - started:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
