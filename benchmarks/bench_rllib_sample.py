"""What otel_rl adds to RLlib's env runner in place: ``SingleAgentEnvRunner.sample()``, per variant.

Run with the Ray venv's Python (``scripts/setup-frameworks.sh ray``):
``python benchmarks/bench_rllib_sample.py [--rounds 24] [--steps 500]``.

`bench_rllib_block.py` times RLlib's timer blocks in a tight loop; in the real run they cost
more each (benchmarks/README.md, "The real RLlib run"). Here the blocks run where they do in
training: one process, otel_rl configured (``spans="auto"``, files into a temporary folder),
one local env runner per variant (PPO's CartPole config, torch on one thread, made while the
variant's methods are installed), each ``sample(num_timesteps=STEPS)`` plus
``get_metrics()`` timed in thread CPU, variants interleaved in an order rotated every round:

- ``plain``: RLlib's own ``StatsBase.__enter__``/``__exit__`` and ``MetricsLogger._set_key``;
- ``otel_rl``: as this checkout instruments RLlib (the compiled glue, where it is built,
  calling the compiled copy of RLlib's own methods where RLlib's sources are the ones copied:
  `rllib.compiled_own`);
- ``glue, no-op block`` (where the glue is compiled): the same glue with a timer class that
  does nothing, so what the glue costs and what the otel_rl block in it costs are told apart;
- ``otel_rl pure glue``: the pure-Python glue (the path without a compiler).

Prints, per variant, thread CPU per sample call and the added µs per env step and per RLlib
timer block, each with a 95 % bootstrap interval of the median of the per-round difference
(`_stats`). The blocks per step are RLlib's ``StatsBase.__enter__`` calls, counted once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from _stats import fmt_ci
from bench_rllib_inplace import _NoBlock

import otel_rl


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # an RLlib env runner's own setting
    otel_rl.configure(spans="auto", output_dir=tempfile.mkdtemp(prefix="bench-rllib-sample-"))
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    from ray.rllib.utils.metrics.stats.base import StatsBase

    from otel_rl._internal import rllib
    from otel_rl.timers import hierarchical_timer

    enter, exit_, pure_enter, pure_exit = rllib.own_methods(StatsBase)  # (KeyError: not patched)
    set_key = MetricsLogger._set_key
    plain_set_key = getattr(set_key, "__wrapped__", set_key)

    def compiled_with(timer: Any) -> tuple[Any, Any]:
        compiled = rllib.compiled_glue(StatsBase, timer)
        assert compiled is not None
        return compiled

    variants = {"plain": lambda: (enter, exit_, plain_set_key)}
    if rllib.accelerated():
        variants["otel_rl"] = lambda: (*compiled_with(hierarchical_timer), set_key)
        variants["glue, no-op block"] = lambda: (*compiled_with(_NoBlock), set_key)
    variants["otel_rl pure glue"] = lambda: (pure_enter, pure_exit, set_key)
    installed: dict[str, tuple[Any, Any, Any]] = {}

    def install(name: str) -> None:
        if name not in installed:
            installed[name] = variants[name]()
        StatsBase.__enter__, StatsBase.__exit__, MetricsLogger._set_key = installed[name]

    config = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
              .debugging(seed=1))
    runners = {}
    for name in variants:
        install(name)
        runners[name] = runner = SingleAgentEnvRunner(config=config)
        runner.sample(num_timesteps=args.steps, random_actions=False)
        runner.get_metrics()
    install("plain")
    entered = 0

    def counted(self: Any) -> Any:
        nonlocal entered
        entered += 1
        return enter(self)

    StatsBase.__enter__ = counted
    runners["plain"].sample(num_timesteps=args.steps, random_actions=False)
    runners["plain"].get_metrics()
    blocks_per_step = entered / args.steps

    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    with hierarchical_timer("sample"):  # as in an env runner: under the caller's block
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                install(name)
                runner = runners[name]
                start = time.thread_time()
                runner.sample(num_timesteps=args.steps, random_actions=False)
                runner.get_metrics()
                results[name].append((time.thread_time() - start) * 1e3)
    install("otel_rl" if "otel_rl" in variants else "otel_rl pure glue")
    otel_rl.shutdown()
    print(f"RLlib timer blocks per env step: {blocks_per_step:.1f}; {args.steps} steps per "
          f"sample, {args.rounds} rounds")
    print("| variant | thread CPU ms per sample | added µs per step [95 % CI] "
          "| added µs per block [95 % CI] |")
    print("|---|---|---|---|")
    for name, values in results.items():
        added = [a - b for a, b in zip(values, results["plain"], strict=True)]
        per_step = [d * 1e3 / args.steps for d in added]
        per_block = [d / blocks_per_step for d in per_step]
        print(f"| {name} | {statistics.median(values):.1f} | "
              f"{fmt_ci(per_step, 1) if name != 'plain' else ''} | "
              f"{fmt_ci(per_block, 2) if name != 'plain' else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
