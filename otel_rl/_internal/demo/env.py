"""A vectorised CartPole in numpy: N independent carts stepped at once, reset automatically.

The dynamics are the classic cart-pole of Barto, Sutton & Anderson (1983) with the corrected
pole equation of Florian (2007), integrated with explicit Euler at 50 Hz, the same constants
and termination rules as the widely used ``CartPole-v1`` (a pole that tips past 12 degrees or
a cart that leaves +/-2.4 m ends the episode; 500 steps truncate it; reward 1 per step).

Example::

    env = VecCartPole(num_envs=8, seed=0)
    obs = env.reset()
    step = env.step(np.zeros(8, dtype=np.int64))
    step.obs.shape  # (8, 4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["CartPoleParams", "EpisodeStats", "VecCartPole", "VecStep"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

OBS_SIZE = 4
NUM_ACTIONS = 2


@dataclass(frozen=True, slots=True)
class CartPoleParams:
    """Physical constants and episode limits; the defaults are the classic ones."""

    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02  # seconds per step
    theta_threshold: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_episode_steps: int = 500


@dataclass(slots=True)
class EpisodeStats:
    """Returns and lengths of the episodes that ended during one step, in env order."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


@dataclass(slots=True)
class VecStep:
    """The outcome of one step of every env.

    ``obs`` is the observation to act on next: for an env whose episode just ended it is
    already the first observation of the new episode, and the last observation of the old
    one is in ``final_obs`` (needed to bootstrap a truncated episode's value).
    """

    obs: FloatArray
    reward: FloatArray
    terminated: BoolArray
    truncated: BoolArray
    final_obs: FloatArray
    episodes: EpisodeStats


def cartpole_derivatives(state: FloatArray, force: FloatArray, p: CartPoleParams) -> FloatArray:
    """Accelerations (x'', theta'') of each cart for the given states ``[x, x', th, th']``."""
    theta, theta_dot = state[..., 2], state[..., 3]
    cos_t, sin_t = np.cos(theta), np.sin(theta)
    total_mass = p.masspole + p.masscart
    polemass_length = p.masspole * p.length
    temp = (force + polemass_length * theta_dot**2 * sin_t) / total_mass
    theta_acc = (p.gravity * sin_t - cos_t * temp) / (
        p.length * (4.0 / 3.0 - p.masspole * cos_t**2 / total_mass)
    )
    x_acc = temp - polemass_length * theta_acc * cos_t / total_mass
    return np.stack([x_acc, theta_acc], axis=-1)


class VecCartPole:
    """`num_envs` CartPoles stepped together; each resets itself when its episode ends.

    Seeded: the same seed gives the same initial states and resets, whatever the caller does
    between steps.
    """

    def __init__(self, num_envs: int, seed: int, params: CartPoleParams | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.params = params or CartPoleParams()
        self._rng = np.random.default_rng(seed)
        self.state: FloatArray = np.zeros((num_envs, OBS_SIZE))
        self._ep_return: FloatArray = np.zeros(num_envs)
        self._ep_length: IntArray = np.zeros(num_envs, dtype=np.int64)

    def reset(self) -> FloatArray:
        """Start a fresh episode in every env and return the observations."""
        self.state = self._initial_states(self.num_envs)
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        return self.state.copy()

    def step(self, actions: IntArray) -> VecStep:
        """Push each cart left (action 0) or right (action 1) for one time step."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, got shape {actions.shape}")
        p = self.params
        force = np.where(actions == 1, p.force_mag, -p.force_mag)
        acc = cartpole_derivatives(self.state, force, p)
        x, x_dot, theta, theta_dot = self.state.T
        # Explicit Euler: positions move with the old velocities, as in the classic code.
        new_state = np.stack(
            [
                x + p.tau * x_dot,
                x_dot + p.tau * acc[:, 0],
                theta + p.tau * theta_dot,
                theta_dot + p.tau * acc[:, 1],
            ],
            axis=1,
        )
        terminated = (np.abs(new_state[:, 0]) > p.x_threshold) | (
            np.abs(new_state[:, 2]) > p.theta_threshold
        )
        reward = np.ones(self.num_envs)
        self._ep_return += reward
        self._ep_length += 1
        truncated = (self._ep_length >= p.max_episode_steps) & ~terminated
        done = terminated | truncated
        final_obs = new_state.copy()
        episodes = EpisodeStats()
        if done.any():
            idx = np.flatnonzero(done)
            episodes.returns = [float(r) for r in self._ep_return[idx]]
            episodes.lengths = [int(n) for n in self._ep_length[idx]]
            new_state[idx] = self._initial_states(len(idx))
            self._ep_return[idx] = 0.0
            self._ep_length[idx] = 0
        self.state = new_state
        return VecStep(new_state.copy(), reward, terminated, truncated, final_obs, episodes)

    def _initial_states(self, n: int) -> FloatArray:
        return self._rng.uniform(-0.05, 0.05, size=(n, OBS_SIZE))
