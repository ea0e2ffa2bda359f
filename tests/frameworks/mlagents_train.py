"""Train ML-Agents 1.1.0 PPO on its Python `SimpleEnvironment`, through `mlagents-learn`'s own
code path (`learn.run_cli` -> `run_training` -> `TrainerController`), with a
`SubprocessEnvManager` of N env workers and a threaded trainer. Run in the ML-Agents venv:

    python mlagents_train.py RESULTS_DIR [--steps N] [--envs N] [--seed N]

The only thing replaced is the environment factory (no Unity player here): each env worker
builds a `SimpleEnvironment` whose `step` is timed like `UnityEnvironment.step` (`@timed`), so
the workers have blocks of their own, as they have with a real Unity environment. ML-Agents
writes its own `RESULTS_DIR/<run id>/run_logs/timers.json`; this script also writes
`get_timer_tree()` of one env worker (taken inside the worker) to `worker_timer_tree.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mlagents.plugins.trainer_type import register_trainer_plugins
from mlagents.trainers import learn
from mlagents.trainers.settings import RunOptions
from mlagents_envs.timers import get_timer_tree, timed
from mlagents_simple_env import SimpleEnvironment

BEHAVIOR = "Simple"


class TimedSimpleEnvironment(SimpleEnvironment):
    """`SimpleEnvironment` with `UnityEnvironment`'s timed step (and the one attribute of
    `UnityEnvironment` that ML-Agents' env worker reads)."""

    academy_capabilities = None

    def __init__(self, worker_id: int, tree_file: str) -> None:
        super().__init__([BEHAVIOR], action_sizes=(1, 0))
        self.worker_id = worker_id
        self.tree_file = tree_file
        self.steps = 0

    @timed
    def step(self) -> None:
        super().step()
        self.steps += 1
        if self.worker_id == 0 and self.steps == 1:
            # The worker's in-process tree (before ML-Agents first resets it),
            # exactly as get_timer_tree() returns it inside the worker.
            tree = get_timer_tree()
            tree.get("metadata", {}).pop("end_time_seconds", None)
            with open(self.tree_file, "w", encoding="utf-8") as f:
                json.dump(tree, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results_dir")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-id", default="simple")
    args = parser.parse_args()
    tree_file = os.path.join(os.path.abspath(args.results_dir), "worker_timer_tree.json")

    def factory(worker_id: int, side_channels: list) -> TimedSimpleEnvironment:  # type: ignore[type-arg]
        return TimedSimpleEnvironment(worker_id, tree_file)

    learn.create_environment_factory = lambda *a, **k: factory
    register_trainer_plugins()  # what mlagents-learn's command-line parsing does first
    options = RunOptions.from_dict({
        "behaviors": {BEHAVIOR: {
            "trainer_type": "ppo",
            "hyperparameters": {"batch_size": 64, "buffer_size": 512, "learning_rate": 3e-3,
                                "num_epoch": 3},
            "network_settings": {"hidden_units": 32, "num_layers": 1},
            "max_steps": args.steps, "summary_freq": 1000, "threaded": True,
            "checkpoint_interval": 100000,
        }},
        # env_path is never opened (the factory is replaced); ML-Agents wants one for num_envs > 1.
        "env_settings": {"env_path": "SimpleEnvironment", "num_envs": args.envs,
                         "seed": args.seed},
        "checkpoint_settings": {"run_id": args.run_id, "results_dir": args.results_dir,
                                "force": True},
        "torch_settings": {"device": "cpu"},
    })
    learn.run_cli(options)


if __name__ == "__main__":
    main()
