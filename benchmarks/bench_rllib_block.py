"""What otel_rl adds to one RLlib timer block (``with metrics.log_time(key):``), per variant.

Run with the Ray venv's Python (``scripts/setup-frameworks.sh ray``):
``python benchmarks/bench_rllib_block.py [--rounds 8] [--blocks 20000]``.

otel_rl configured (``spans="all"``, files into a temporary folder), a ``MetricsLogger``, and
RLlib's shape of an env runner's step: a pipeline timer with four connector timers inside,
inside an open otel_rl block. Thread CPU per block, variants interleaved (order reversed
every other round), medians of rounds and the added µs per block with a 95 % bootstrap
interval of the per-round difference (`_stats`):

- ``plain``: RLlib's own ``log_time``, ``StatsBase.__enter__``/``__exit__``;
- ``named per call``: otel_rl's blocks, the stats object named by a ``log_time`` wrapper;
- ``named once``: otel_rl's blocks, the stats object named when the logger stores it
  (``_set_key``; what otel_rl installs on RLlib 2.60).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from _stats import fmt_ci

import otel_rl


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=20_000)
    args = parser.parse_args()
    otel_rl.configure(spans="all", output_dir=tempfile.mkdtemp(prefix="bench-rllib-block-"))
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    from ray.rllib.utils.metrics.stats.base import StatsBase

    from otel_rl._internal import rllib
    from otel_rl.timers import hierarchical_timer

    enter, exit_, set_key = StatsBase.__enter__, StatsBase.__exit__, MetricsLogger._set_key
    assert hasattr(set_key, "__wrapped__"), "RLlib is not instrumented here"
    plain_log_time = MetricsLogger.log_time
    variants = {
        "plain": (enter.__wrapped__, exit_.__wrapped__, plain_log_time),
        "named per call": (enter, exit_, rllib._patched_log_time(plain_log_time)),
        "named once": (enter, exit_, plain_log_time),
    }
    logger = MetricsLogger()
    pipeline = ("env_to_module_connector", "timers", "connector_pipeline_timer")
    keys = [("env_to_module_connector", "timers", "connectors", f"c{i}") for i in range(4)]
    n = args.blocks // 5

    def loop() -> float:
        start = time.thread_time()
        with hierarchical_timer("sample"):
            for _ in range(n):
                with logger.log_time(pipeline):
                    for key in keys:
                        with logger.log_time(key):
                            pass
        return (time.thread_time() - start) / (n * 5) * 1e6

    results: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 else list(reversed(variants))
        for name in order:
            StatsBase.__enter__, StatsBase.__exit__, MetricsLogger.log_time = variants[name]
            results[name].append(loop())
    StatsBase.__enter__, StatsBase.__exit__, MetricsLogger.log_time = variants["named once"]
    otel_rl.shutdown()
    print("| variant | thread CPU µs per block | added µs vs plain [95 % CI] |")
    print("|---|---|---|")
    for name, values in results.items():
        added = [a - b for a, b in zip(values, results["plain"], strict=True)]
        print(f"| {name} | {statistics.median(values):.2f} | "
              f"{fmt_ci(added, 2) if name != 'plain' else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
