"""What RLlib's timer blocks cost otel_rl inside the real env runners, switched per iteration.

``python benchmarks/bench_rllib_inplace.py [--iterations 60] [--variants plain,otel_rl,no_op]``

`bench_rllib.py` compares whole runs, plain and under ``otel-rl run``; between two runs the
env runners' CPU per iteration differs by several ms from noise alone (two env runners of
one run differ as much). Here one run under ``otel-rl run`` (the Ray venv of
``scripts/setup-frameworks.sh ray``, this checkout installed there as `bench_rllib.py` does;
PPO on CartPole, 2 env runners, a Learner actor, 400 env steps per iteration) switches, in
the env runner processes themselves, what ``StatsBase.__enter__``/``__exit__`` are before
each training iteration, in an order reversed every other cycle:

- ``plain``: RLlib's own methods (everything else of otel_rl stays: the joined worker, its
  flushes and pushes, the per-call context);
- ``otel_rl``: the glue as this checkout installs it (compiled where it is built, calling the
  compiled copy of RLlib's own methods where RLlib's sources are the ones copied:
  `rllib.compiled_own`);
- ``no_op``: the same glue around a timer class that does nothing (where the glue is
  compiled): the glue's own part.

It reports the CPU of the env runners' main thread (where RLlib samples) per iteration,
mean of the two env runners, as the median over the iterations of each variant, and the
added ms per iteration (the difference of the medians, with a 95 % bootstrap interval of it:
iterations of different variants are not paired) and µs per RLlib block (blocks per
iteration counted by RLlib's ``StatsBase.__enter__`` calls in one iteration).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


class _NoBlock:
    """A timer that does nothing."""

    __slots__ = ()

    def __init__(self, name: str) -> None:
        pass

    def __enter__(self) -> _NoBlock:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _install(variant: str) -> int:
    """In an env runner: RLlib's stats methods for `variant`; RLlib's block count so far."""
    from ray.rllib.utils.metrics.stats.base import StatsBase

    from otel_rl._internal import rllib
    from otel_rl.timers import hierarchical_timer

    enter, exit_, pure_enter, pure_exit = rllib.own_methods(StatsBase)
    glue: Any = {"otel_rl": hierarchical_timer, "no_op": _NoBlock}.get(variant)
    if variant == "counted":
        # Ray ships this function by value with a fresh copy of its globals at every call, so
        # the count lives in a module of the worker process.
        state = sys.modules[__name__].__dict__
        state.setdefault("_entered", 0)

        def counted(self: Any) -> Any:
            state["_entered"] += 1
            return enter(self)

        StatsBase.__enter__, StatsBase.__exit__ = counted, exit_
    elif glue is None:
        StatsBase.__enter__, StatsBase.__exit__ = enter, exit_
    elif rllib.accelerated() and (compiled := rllib.compiled_glue(StatsBase, glue)):
        StatsBase.__enter__, StatsBase.__exit__ = compiled
    elif variant == "otel_rl":
        StatsBase.__enter__, StatsBase.__exit__ = pure_enter, pure_exit
    else:  # the pure glue knows only otel_rl's timer
        raise RuntimeError(f"variant {variant!r} needs the compiled glue")
    return int(sys.modules[__name__].__dict__.get("_entered", 0))


def _main_thread_cpu(_: Any) -> float:
    return time.thread_time()  # a foreach call runs on the actor's main thread


def child(iterations: int, variants: list[str], out: str) -> None:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    algo = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
            .learners(num_learners=1)
            .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=2)
            .debugging(seed=1)).build_algo()
    runners = algo.env_runner_group

    def each(fn: Any) -> list[Any]:
        return list(runners.foreach_env_runner(fn, local_env_runner=False))

    for _ in range(3):  # warm-up
        algo.train()
    before = each(lambda r: _install("counted"))
    algo.train()
    after = each(lambda r: _install("counted"))
    blocks = statistics.mean(b - a for a, b in zip(before, after, strict=True))
    ms: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(iterations):
        cycle, at = divmod(i, len(variants))
        variant = (variants if cycle % 2 == 0 else variants[::-1])[at]
        each(lambda r, v=variant: _install(v))
        start = each(_main_thread_cpu)
        algo.train()
        end = each(_main_thread_cpu)
        ms[variant].append(statistics.mean(b - a for a, b in zip(start, end, strict=True)) * 1e3)
    each(lambda r: _install("otel_rl"))
    algo.stop()
    ray.shutdown()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"blocks_per_iteration": blocks, "ms": ms}, f)


def _difference(values: list[float], base: list[float]) -> str:
    """The difference of the medians of `values` and `base`, with its 95 % bootstrap
    interval (both resampled, seeded)."""
    rng = random.Random(0)
    diffs = sorted(statistics.median(rng.choices(values, k=len(values)))
                   - statistics.median(rng.choices(base, k=len(base))) for _ in range(4000))
    middle = statistics.median(values) - statistics.median(base)
    return f"{middle:.2f} [{diffs[100]:.2f}–{diffs[3899]:.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--variants", default="plain,otel_rl,no_op")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = args.variants.split(",")
    if args.child:
        child(args.iterations, variants, args.child)
        return 0
    sys.path.insert(0, HERE)
    from bench_sample_factory import venv_python

    python = venv_python("ray")
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-rllib-inplace-") as work:
        out = os.path.join(work, "result.json")
        run = subprocess.run(
            [os.path.join(os.path.dirname(python), "otel-rl"), "run", "--output",
             os.path.join(work, "run"), "--", python, os.path.abspath(__file__),
             "--iterations", str(args.iterations), "--variants", args.variants, "--child", out],
            capture_output=True, text=True, cwd=work)
        if run.returncode != 0 or not os.path.exists(out):
            print(f"bench_rllib_inplace: the run failed (exit {run.returncode}):\n"
                  f"{run.stderr[-3000:]}", file=sys.stderr)
            return 1
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    blocks, ms = result["blocks_per_iteration"], result["ms"]
    base = statistics.median(ms["plain"])
    print(f"RLlib timer blocks per env runner per iteration: {blocks:.0f}; "
          f"{args.iterations} iterations")
    print("| variant | env runner main thread, ms CPU / iteration (median, n) "
          "| added ms / iteration [95 % CI] | added µs / block |")
    print("|---|---|---|---|")
    for name, values in ms.items():
        row = f"| {name} | {statistics.median(values):.1f} ({len(values)}) |"
        if name == "plain":
            print(row + " | |")
            continue
        added = statistics.median(values) - base
        print(f"{row} {_difference(values, ms['plain'])} | {added * 1e3 / blocks:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
