"""RLlib 2.60 PPO on CartPole run by Ray Tune (``tune.Tuner(PPO, ...)``): the Algorithm lives
in the trial's actor, not in the driver, with its local Learner (``num_learners=0``) and one
remote env runner. Run in the Ray venv under ``otel-rl run``:

    python rllib_tune.py ITERATIONS

The driver times the whole of ``tuner.fit()`` in a ``tuning`` block (ML-Agents' API served by
otel_rl); prints ``RESULT {"iterations": N}``.
"""

from __future__ import annotations

import json
import sys
import tempfile

import ray
from ray import tune
from ray.rllib.algorithms.ppo import PPO, PPOConfig

from otel_rl.timers import hierarchical_timer


def main() -> None:
    iterations = int(sys.argv[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=1)
              .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)
              .debugging(seed=1))
    with hierarchical_timer("tuning"):
        tuner = tune.Tuner(PPO, param_space=config, run_config=tune.RunConfig(
            stop={"training_iteration": iterations}, storage_path=tempfile.mkdtemp(),
            verbose=0))
        results = tuner.fit()
    ray.shutdown()
    print("RESULT " + json.dumps({"iterations": results[0].metrics["training_iteration"]}))


if __name__ == "__main__":
    main()
