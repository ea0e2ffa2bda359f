"""Trajectories in, policy updates and checkpoints out — the trainer side of the demo.

`AgentProcessor` (main thread) cuts the stream of env steps into fixed-length trajectories,
as ML-Agents' AgentProcessor does with ``time_horizon``. `PPOTrainer` (its own thread) takes
them from a queue, computes advantages, updates the policy, publishes a frozen copy of the
new policy on a queue for the main thread, and saves ``.npz`` checkpoints.
"""

from __future__ import annotations

import io
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from otel_rl._internal import atomic
from otel_rl._internal.demo import timers
from otel_rl._internal.demo.env import FloatArray, IntArray
from otel_rl._internal.demo.env_manager import EnvironmentStep
from otel_rl._internal.demo.policy import Policy, PPOOptimizer, gae

__all__ = ["AgentProcessor", "PPOTrainer", "TrainerThread", "Trajectory"]


@dataclass(slots=True)
class Trajectory:
    """``time_horizon`` consecutive steps of every env; arrays are ``[T, N, ...]``."""

    obs: FloatArray
    actions: IntArray
    log_probs: FloatArray
    rewards: FloatArray
    terminated: FloatArray  # 1.0 where the episode ended by failing
    truncated: FloatArray  # 1.0 where the episode hit the step limit
    final_obs: FloatArray  # last observation of an ended episode (valid where done)
    next_obs: FloatArray  # [N, 4]: the observation after the last step

    @property
    def num_steps(self) -> int:
        """Env steps in this trajectory (steps x envs)."""
        return int(self.actions.size)


class AgentProcessor:
    """Buffers env steps and emits a `Trajectory` every `time_horizon` steps."""

    def __init__(self, time_horizon: int, trajectory_queue: queue.Queue[Trajectory | None]) -> None:
        self.time_horizon = time_horizon
        self.trajectory_queue = trajectory_queue
        self._steps: list[EnvironmentStep] = []
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []

    @timers.timed
    def add_experiences(self, step: EnvironmentStep) -> int:
        """Record one step of every env; returns how many env steps that was."""
        self._steps.append(step)
        self.episode_returns.extend(step.result.episodes.returns)
        self.episode_lengths.extend(step.result.episodes.lengths)
        if len(self._steps) >= self.time_horizon:
            self.trajectory_queue.put(self._make_trajectory())
            self._steps = []
        return len(step.actions)

    def _make_trajectory(self) -> Trajectory:
        steps = self._steps
        return Trajectory(
            obs=np.stack([s.obs for s in steps]),
            actions=np.stack([s.actions for s in steps]),
            log_probs=np.stack([s.log_probs for s in steps]),
            rewards=np.stack([s.result.reward for s in steps]),
            terminated=np.stack([s.result.terminated for s in steps]).astype(np.float64),
            truncated=np.stack([s.result.truncated for s in steps]).astype(np.float64),
            final_obs=np.stack([s.result.final_obs for s in steps]),
            next_obs=steps[-1].result.obs,
        )

    def pop_episode_stats(self) -> tuple[list[float], list[int]]:
        """Returns and lengths of the episodes finished since the last call."""
        stats = (self.episode_returns, self.episode_lengths)
        self.episode_returns, self.episode_lengths = [], []
        return stats


class PPOTrainer:
    """Turns trajectories into PPO updates; saves checkpoints every `checkpoint_interval` steps."""

    behavior_name = "CartPole"

    def __init__(self, optimizer: PPOOptimizer, run_dir: Path, checkpoint_interval: int) -> None:
        self.optimizer = optimizer
        self.run_dir = run_dir
        self.checkpoint_interval = checkpoint_interval
        self.step = 0
        self._next_checkpoint = checkpoint_interval
        self.policy_queue: queue.Queue[Policy] = queue.Queue()
        self.checkpoints: list[Path] = []

    def advance(self, trajectory: Trajectory) -> None:
        """Learn from one trajectory: one PPO update, a new published policy, maybe a save."""
        batch = self._process_trajectory(trajectory)
        self._update_policy(*batch)
        self.step += trajectory.num_steps
        if self.step >= self._next_checkpoint:
            self._checkpoint()
            while self._next_checkpoint <= self.step:
                self._next_checkpoint += self.checkpoint_interval

    @timers.timed
    def _process_trajectory(
        self, t: Trajectory
    ) -> tuple[FloatArray, IntArray, FloatArray, FloatArray, FloatArray]:
        """Value estimates and GAE advantages, flattened into one batch of samples."""
        hp = self.optimizer.hp
        values = self.optimizer.values(t.obs)
        # A truncated episode did not fail: credit the value of where it stopped.
        rewards = t.rewards + hp.gamma * t.truncated * self.optimizer.values(t.final_obs)
        dones = np.maximum(t.terminated, t.truncated)
        advantages, returns = gae(rewards, values, dones, self.optimizer.values(t.next_obs),
                                  hp.gamma, hp.lambd)
        return (
            t.obs.reshape(-1, t.obs.shape[-1]),
            t.actions.reshape(-1),
            t.log_probs.reshape(-1),
            advantages.reshape(-1),
            returns.reshape(-1),
        )

    @timers.timed
    def _update_policy(self, obs: FloatArray, actions: IntArray, log_probs: FloatArray,
                       advantages: FloatArray, returns: FloatArray) -> None:
        stats = self.optimizer.update(obs, actions, log_probs, advantages, returns)
        # Gauge names as ML-Agents' GaugeWriter spells its stats.
        timers.set_gauge("Policy.Entropy.mean", stats.entropy)
        timers.set_gauge("Losses.PolicyLoss.mean", stats.policy_loss)
        timers.set_gauge("Losses.ValueLoss.mean", stats.value_loss)
        self.policy_queue.put(self.optimizer.snapshot())

    def _checkpoint(self) -> None:
        path = self.run_dir / self.behavior_name / f"{self.behavior_name}-{self.step}.npz"
        self.save_model(path)
        self.checkpoints.append(path)

    @timers.timed
    def save_model(self, path: Path) -> Path:
        """Write both networks and the step count to `path` (.npz), atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # Any: numpy's stub would otherwise check every key against savez's allow_pickle.
        arrays: dict[str, Any] = dict(self.optimizer.state_dict())
        arrays["step"] = np.array(self.step)
        arrays["policy_version"] = np.array(self.optimizer.version)
        # Written whole or not at all: a crash never leaves a half-written checkpoint behind.
        data = io.BytesIO()
        np.savez(data, **arrays)
        atomic.write_bytes(path, data.getvalue())
        return path


class TrainerThread:
    """Runs `PPOTrainer.advance` on its own thread until it receives the end marker (None).

    Trajectories already queued are all learned from before the thread stops, so a seeded run
    ends with the same model every time. An exception stops the thread and is kept in `error`.
    """

    def __init__(self, trainer: PPOTrainer, trajectory_queue: queue.Queue[Trajectory | None]) -> None:
        self.trainer = trainer
        self.trajectory_queue = trajectory_queue
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="trainer-CartPole", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                trajectory = self.trajectory_queue.get()
                if trajectory is None:
                    return
                with timers.hierarchical_timer("trainer_advance"):
                    self.trainer.advance(trajectory)
        except BaseException as exc:  # kept for the main thread, which re-raises it
            self.error = exc

    def stop(self, timeout: float) -> bool:
        """Let the thread finish what is queued, then end it; False if it did not in time."""
        self.trajectory_queue.put(None)
        self.thread.join(timeout)
        return not self.thread.is_alive()
