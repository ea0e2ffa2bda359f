"""`run_training`: setup, a TrainerController loop, gauges and progress — mlagents-learn's shape.

The main thread acts and steps the env workers (`TrainerController.advance`), a trainer thread
learns (`PPOTrainer`), and the two meet through queues: trajectories one way, frozen policies
the other. To keep a seeded run reproducible while still overlapping acting and learning,
trajectory ``r`` is always collected with exactly the policy learned from trajectories
``0 .. r - 1 - max_policy_lag`` (ML-Agents instead takes whatever policy is newest).

Example::

    result = run_training(TrainingOptions(run_dir=Path("results/demo"), max_steps=20_000))
    result.summaries[-1].mean_reward
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from otel_rl._internal.demo import timers
from otel_rl._internal.demo.env import NUM_ACTIONS, OBS_SIZE
from otel_rl._internal.demo.env_manager import SubprocessEnvManager
from otel_rl._internal.demo.policy import Policy, PPOHyperParams, PPOOptimizer
from otel_rl._internal.demo.trainer import AgentProcessor, PPOTrainer, TrainerThread, Trajectory

__all__ = ["Summary", "TrainerController", "TrainingOptions", "TrainingResult", "run_training"]

#: Seconds the main thread waits for the trainer thread to publish a policy or to finish.
_TRAINER_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class TrainingOptions:
    """Everything one training run needs. Steps count env steps summed over all envs."""

    run_dir: Path
    run_id: str = "demo"
    max_steps: int = 60_000
    workers: int = 2
    envs_per_worker: int = 8
    seed: int = 0
    checkpoint_interval: int = 20_000
    summary_freq: int = 5_000
    time_horizon: int = 128
    max_policy_lag: int = 1
    start_method: str | None = None
    hyperparams: PPOHyperParams = field(default_factory=PPOHyperParams)


@dataclass(frozen=True, slots=True)
class Summary:
    """One progress line's numbers: episodes that ended since the previous summary."""

    step: int
    elapsed: float
    episodes: int
    mean_reward: float
    std_reward: float
    mean_length: float


@dataclass(slots=True)
class TrainingResult:
    """What a run produced: its progress, checkpoint files and final model."""

    steps: int = 0
    summaries: list[Summary] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    final_model: Path | None = None


class TrainerController:
    """Drives training: step the envs, feed the trainer, swap in new policies, report."""

    def __init__(self, options: TrainingOptions, trainer: PPOTrainer,
                 log: Callable[[str], None]) -> None:
        self.options = options
        self.trainer = trainer
        self.log = log
        self.trajectory_queue: queue.Queue[Trajectory | None] = queue.Queue()
        self.agent_processor = AgentProcessor(options.time_horizon, self.trajectory_queue)
        self.trainer_thread = TrainerThread(trainer, self.trajectory_queue)
        self.result = TrainingResult()
        self._iteration = 0
        self._next_summary = options.summary_freq
        self._start_time = 0.0  # set when learning starts

    @timers.timed
    def start_learning(self, env_manager: SubprocessEnvManager) -> None:
        """Train until `max_steps`; always stop the trainer thread and save the model."""
        stopped = False
        try:
            self._reset_env(env_manager)
            self._start_time = time.perf_counter()
            self.trainer_thread.start()
            while self.result.steps < self.options.max_steps:
                self.result.steps += self.advance(env_manager)
                if self.result.steps >= self._next_summary:
                    self._write_summary()
                    while self._next_summary <= self.result.steps:
                        self._next_summary += self.options.summary_freq
            stopped = self.join_threads()
            self._raise_trainer_error()
        except BaseException:
            if not stopped and self.trainer_thread.thread.is_alive():
                stopped = self.join_threads()
            raise
        finally:
            # Like mlagents-learn, an interrupted run still leaves a usable model behind, but
            # only once the trainer thread no longer touches the weights.
            if stopped and self.trainer_thread.error is None:
                self._save_models()

    def _reset_env(self, env_manager: SubprocessEnvManager) -> None:
        env_manager.set_policy(self.trainer.optimizer.snapshot())
        env_manager.reset()

    @timers.timed
    def advance(self, env_manager: SubprocessEnvManager) -> int:
        """One step of every env; returns the number of env steps taken."""
        if self._iteration % self.options.time_horizon == 0:
            self._refresh_policy(env_manager)
        with timers.hierarchical_timer("env_step"):
            step = env_manager.get_steps()
            num_steps = self.agent_processor.add_experiences(step)
        self._iteration += 1
        return num_steps

    def _refresh_policy(self, env_manager: SubprocessEnvManager) -> None:
        trajectory = self._iteration // self.options.time_horizon
        target = max(0, trajectory - self.options.max_policy_lag)
        if env_manager.policy_version >= target:
            return
        with timers.hierarchical_timer("wait_for_policy"):
            while env_manager.policy_version < target:
                env_manager.set_policy(self._next_policy())

    def _next_policy(self) -> Policy:
        deadline = time.monotonic() + _TRAINER_TIMEOUT
        while True:
            try:
                return self.trainer.policy_queue.get(timeout=0.2)
            except queue.Empty:
                self._raise_trainer_error()
                if not self.trainer_thread.thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the trainer thread stopped publishing policies") from None

    def _raise_trainer_error(self) -> None:
        if self.trainer_thread.error is not None:
            raise RuntimeError("the trainer thread failed") from self.trainer_thread.error

    def _write_summary(self) -> None:
        returns, lengths = self.agent_processor.pop_episode_stats()
        elapsed = time.perf_counter() - self._start_time
        step = self.result.steps
        name = self.trainer.behavior_name
        if not returns:
            self.log(f"{name}. Step: {step}. Time Elapsed: {elapsed:.1f} s. "
                     "No episode ended since the last summary. Training.")
            return
        summary = Summary(step, elapsed, len(returns), float(np.mean(returns)),
                          float(np.std(returns)), float(np.mean(lengths)))
        self.result.summaries.append(summary)
        # Gauge names as ML-Agents' GaugeWriter spells "Environment/Cumulative Reward" etc.
        timers.set_gauge("Environment.CumulativeReward.mean", summary.mean_reward)
        timers.set_gauge("Environment.EpisodeLength.mean", summary.mean_length)
        self.log(f"{name}. Step: {step}. Time Elapsed: {elapsed:.1f} s. "
                 f"Mean Reward: {summary.mean_reward:.1f}. "
                 f"Std of Reward: {summary.std_reward:.1f}. Training.")

    def join_threads(self) -> bool:
        """Stop the trainer thread and fold its timers and gauges into this thread's.

        Returns False if the thread did not finish in time.
        """
        stopped = self.trainer_thread.stop(_TRAINER_TIMEOUT)
        # As ML-Agents does: the thread's tree joins ours as a parallel branch.
        with timers.hierarchical_timer("trainer_threads") as main_timer_node:
            stack = timers.get_timer_stack_for_thread(self.trainer_thread.thread)
            if stack is not None:
                main_timer_node.merge(stack.root, root_name="thread_root", is_parallel=True)
                timers.merge_gauges(stack.gauges)
        return stopped

    def _save_models(self) -> None:
        name = self.trainer.behavior_name
        self.result.final_model = self.trainer.save_model(self.options.run_dir / f"{name}.npz")
        self.result.checkpoints = list(self.trainer.checkpoints)


def run_training(options: TrainingOptions,
                 log: Callable[[str], None] = print) -> TrainingResult:
    """Train PPO on CartPole with env workers in subprocesses; returns what it produced.

    Writes checkpoints under ``options.run_dir``; the timers are left for the caller
    (``otel_rl.shutdown()`` writes ``timers.json``).
    """
    with timers.hierarchical_timer("run_training.setup"):
        for key, value in (
            ("run_id", options.run_id),
            ("seed", options.seed),
            ("workers", options.workers),
            ("envs_per_worker", options.envs_per_worker),
            ("max_steps", options.max_steps),
            ("time_horizon", options.time_horizon),
            ("start_method", options.start_method or "default"),
        ):
            timers.add_metadata(key, str(value))
        env_manager = SubprocessEnvManager(
            options.workers, options.envs_per_worker, options.seed, options.start_method
        )
        optimizer = PPOOptimizer(OBS_SIZE, NUM_ACTIONS, options.hyperparams, options.seed)
        trainer = PPOTrainer(optimizer, options.run_dir, options.checkpoint_interval)
        controller = TrainerController(options, trainer, log)
    try:
        controller.start_learning(env_manager)
    finally:
        env_manager.close()
    return controller.result

