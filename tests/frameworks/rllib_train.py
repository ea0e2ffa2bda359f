"""RLlib 2.60 PPO on CartPole (new API stack): 2 env runners, a Learner actor, a few
iterations. Run in the Ray venv, plain or under ``otel-rl run``:

    python rllib_train.py RESULTS_JSON [ITERATIONS [NUM_LEARNERS]]

(``NUM_LEARNERS`` 1 by default: a Learner actor; 0 is RLlib's default, the driver's own.)

Prints RLlib's own ``pretty_print`` of each iteration's results dict (RLlib's printed output)
and writes, per iteration, the results dict's key paths (nested dicts flattened to
``a/b/c``), RLlib's own counters and each ``algo.train()``'s wall time to RESULTS_JSON
(``iterations``), with the CPU seconds of the driver, env runners and learners at the end
(``cpu_s``) and once the algorithm is built (``cpu_built_s``: training alone is the difference).

With ``RLLIB_TRAIN_COLLECT=1`` (``benchmarks/bench_rllib.py``'s default) every RLlib process
runs a full garbage collection once the algorithm is built, before ``cpu_built_s``: training
then starts from a collected heap, plain or not (see ``collect_everywhere``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import Any

import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.tune.logger import pretty_print


def key_paths(value: Any, prefix: str = "") -> list[str]:
    if not isinstance(value, dict):
        return [prefix]
    paths = []
    for key, child in value.items():
        paths += key_paths(child, f"{prefix}/{key}" if prefix else str(key))
    return paths


def main() -> None:
    out, iterations = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2)
        .learners(num_learners=int(sys.argv[3]) if len(sys.argv) > 3 else 1)
        .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=2)
        .debugging(seed=1)
    )
    algo = config.build_algo()
    if os.environ.get("RLLIB_TRAIN_COLLECT") == "1":
        collect_everywhere(algo)
    built = _cpu(algo)  # start-up done: what training itself costs is the difference
    results = []
    for _ in range(iterations):
        start = time.perf_counter()
        result = algo.train()
        seconds = time.perf_counter() - start
        print(pretty_print(result), flush=True)
        results.append({
            "paths": sorted(key_paths(result)),
            "timers": sorted(result["timers"]),
            "iteration": result["training_iteration"],
            "env_steps": result["env_runners"]["num_env_steps_sampled_lifetime"],
            "seconds": seconds,  # of this algo.train() call (benchmarks/bench_rllib.py)
        })
    cpu = _cpu(algo)
    algo.stop()
    ray.shutdown()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"iterations": results, "cpu_s": cpu, "cpu_built_s": built}, f)


def collect_everywhere(algo: Any) -> None:
    """A full collection in the driver, the env runners and the Learners. A full collection
    comes when the objects kept since the last one reach a quarter of the heap, so a process
    that made more objects before training (otel_rl's own start-up) meets it earlier: in this
    run ~190 ms in the driver at iteration 2-3 under ``otel-rl run``, at ~45 in a plain run.
    In a short benchmark that falls in one variant's measured iterations only."""
    gc.collect()
    algo.env_runner_group.foreach_env_runner(lambda runner: gc.collect(),
                                             local_env_runner=False)
    for ref in algo.learner_group.foreach_learner(lambda learner: gc.collect()):
        ref.get()


def _cpu(algo: Any) -> dict[str, Any]:
    """CPU seconds of RLlib's processes so far, every thread (benchmarks/bench_rllib.py)."""
    return {"driver": time.process_time(),
            "env_runners": algo.env_runner_group.foreach_env_runner(
                lambda runner: time.process_time(), local_env_runner=False),
            "learners": [r.get() for r in algo.learner_group.foreach_learner(
                lambda learner: time.process_time())]}


if __name__ == "__main__":
    main()
