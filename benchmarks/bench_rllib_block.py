"""What otel_rl adds to one RLlib timer block (``with metrics.log_time(key):``), per variant.

Run with the Ray venv's Python (``scripts/setup-frameworks.sh ray``):
``python benchmarks/bench_rllib_block.py [--rounds 8] [--blocks 20000]``.

otel_rl configured (``spans="all"``, files into a temporary folder), a ``MetricsLogger``, and
RLlib's shape of an env runner's step: a pipeline timer with four connector timers inside,
inside an open otel_rl block. Thread CPU per block, variants interleaved (order reversed
every other round), medians of rounds and the added µs per block with a 95 % bootstrap
interval of the per-round difference (`_stats`):

- ``plain``: RLlib's own ``log_time``, ``_set_key``, ``StatsBase.__enter__``/``__exit__``;
- ``otel_rl pure glue``: as this checkout instruments RLlib on the pure-Python path;
- ``otel_rl``: as this checkout instruments RLlib (the compiled glue, where it is built; it
  calls the compiled copy of RLlib's own ``__enter__``/``__exit__`` where RLlib's sources are
  the ones copied, `rllib.compiled_own`, and ``log_time`` is the compiled copy of RLlib's,
  `rllib.compiled_log_time`);
- ``otel_rl, RLlib's log_time in Python``: the same with RLlib's own ``log_time`` (what
  ``otel_rl`` was in the sixteenth session);
- ``otel_rl, RLlib's own in Python``: the compiled glue calling RLlib's Python methods, and
  RLlib's ``log_time`` (what ``otel_rl`` was before both copies: otel_rl's own cost per block,
  apart from the copies' saving).

Each variant has its own logger, made while its methods are installed (how a stats object
was named can change what RLlib's own code costs on it: on Python 3.11+ reading an object's
``__dict__`` makes its attribute reads slower). To compare revisions, run this file with each
revision first on ``PYTHONPATH`` (``git archive REV otel_rl | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

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

    enter, exit_, pure_enter, pure_exit = rllib.own_methods(StatsBase)  # (KeyError: not patched)
    set_key = MetricsLogger._set_key
    own_log_time, copied_log_time = rllib._loggers[MetricsLogger]
    plain_methods = (enter, exit_, own_log_time, set_key.__wrapped__)
    pure_methods = (pure_enter, pure_exit, own_log_time, set_key)
    copied = rllib._compiled_own.get(StatsBase)

    def compiled(own: Any, log_time: Any) -> tuple[Any, ...]:
        """The compiled glue calling `own` (the compiled copy of RLlib's methods, or None:
        RLlib's Python ones), with `log_time`. The glue finds what it calls through the
        class, so it is installed again at each switch."""
        if own is None:
            rllib._compiled_own.pop(StatsBase, None)
        else:
            rllib._compiled_own[StatsBase] = own
        glue = rllib.compiled_glue(StatsBase, hierarchical_timer)
        assert glue is not None
        return (*glue, log_time, set_key)

    #: variant -> what installs its (enter, exit, log_time, _set_key)
    variants: dict[str, Callable[[], tuple[Any, ...]]] = {
        "plain": lambda: plain_methods, "otel_rl pure glue": lambda: pure_methods}
    if rllib.accelerated():
        variants["otel_rl"] = lambda: compiled(copied, copied_log_time or own_log_time)
        if copied_log_time is not None:
            variants["otel_rl, RLlib's log_time in Python"] = lambda: compiled(copied,
                                                                              own_log_time)
        if copied is not None:
            variants["otel_rl, RLlib's own in Python"] = lambda: compiled(None, own_log_time)

    def install(name: str) -> None:
        (StatsBase.__enter__, StatsBase.__exit__, MetricsLogger.log_time,
         MetricsLogger._set_key) = variants[name]()

    pipeline = ("env_to_module_connector", "timers", "connector_pipeline_timer")
    keys = [("env_to_module_connector", "timers", "connectors", f"c{i}") for i in range(4)]
    loggers = {}
    for name in variants:
        install(name)
        loggers[name] = logger = MetricsLogger()
        for key in (pipeline, *keys):
            with logger.log_time(key):
                pass
    n = args.blocks // 5

    def loop(logger: Any) -> float:
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
            install(name)
            results[name].append(loop(loggers[name]))
    install(list(variants)[-1])
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
