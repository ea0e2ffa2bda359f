"""The cost of ``fork()`` after ``otel_rl.configure()``: otel_rl's threads are stopped (joined)
before each fork and started again after it in the parent (`otel_rl._internal.threads`).

Each variant runs in a fresh interpreter and forks `--forks` children one after another; each
child exits at once (``os._exit(0)``). Measured in the parent around ``os.fork()`` alone (the
stop, the fork, the restart) and around the whole round trip (fork + ``waitpid``):

- ``plain``: otel_rl imported, not configured: no thread (the baseline; the same imports, so
  the same memory to copy: a fork's own cost grows with the process's size);
- ``off``: ``configure(propagate=False)``: the flush thread is stopped and restarted;
- ``relay``: ``configure()`` (propagate): each child becomes a worker of the run, so the
  parent also stops and restarts its relay thread, and makes a carrier per fork.

Run ``python benchmarks/bench_fork.py [--forks N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, sys, time
variant, forks = sys.argv[1], int(sys.argv[2])
import otel_rl, otel_rl.timers
if variant != "plain":
    otel_rl.configure(output_dir=sys.argv[3], propagate=variant == "relay")
fork_ms, trip_ms = [], []
for _ in range(forks):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    t1 = time.perf_counter()
    os.waitpid(pid, 0)
    t2 = time.perf_counter()
    fork_ms.append((t1 - t0) * 1e3)
    trip_ms.append((t2 - t0) * 1e3)
if variant != "plain":
    otel_rl.shutdown()
print(json.dumps({"fork_ms": fork_ms, "trip_ms": trip_ms}))
"""


def run(variant: str, forks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        done = subprocess.run([sys.executable, "-c", CHILD, variant, str(forks), out],
                              capture_output=True, text=True, env=env, check=True)
    data = json.loads(done.stdout)
    return {"fork_ms": statistics.median(data["fork_ms"]),
            "trip_ms": statistics.median(data["trip_ms"]),
            "fork_p90_ms": statistics.quantiles(data["fork_ms"], n=10)[-1]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forks", type=int, default=200, help="forks per variant")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    results = {variant: run(variant, args.forks) for variant in ("plain", "off", "relay")}
    base = results["plain"]["fork_ms"]
    print(f"Python {sys.version.split()[0]}, {args.forks} forks per variant (medians)")
    print("| variant | os.fork() ms | p90 ms | fork + waitpid ms | os.fork() - plain ms |")
    print("|---|---|---|---|---|")
    for variant, r in results.items():
        print(f"| {variant} | {r['fork_ms']:.3f} | {r['fork_p90_ms']:.3f} | {r['trip_ms']:.3f} "
              f"| {r['fork_ms'] - base:+.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
