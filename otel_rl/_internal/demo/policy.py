"""A small PPO in pure numpy: a softmax policy MLP, a value MLP, Adam, GAE.

Two separate one-hidden-layer tanh networks (policy logits, state value), each with its own
Adam. Gradients are written out by hand; the policy loss is PPO's clipped surrogate minus an
entropy bonus. The acting side (`Policy`) is a frozen copy of the policy weights, so the
trainer thread can keep updating while the main thread acts with the last published copy.

Example::

    opt = PPOOptimizer(obs_size=4, num_actions=2, hp=PPOHyperParams(), seed=0)
    policy = opt.snapshot()
    actions, log_probs = policy.get_action(obs, np.random.default_rng(0))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from otel_rl._internal.demo import timers

__all__ = [
    "MLP",
    "Adam",
    "PPOHyperParams",
    "PPOOptimizer",
    "Policy",
    "UpdateStats",
    "gae",
    "ppo_policy_loss",
    "value_loss_and_grads",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Params = dict[str, FloatArray]


@dataclass(frozen=True, slots=True)
class PPOHyperParams:
    """PPO settings; the defaults learn CartPole in a few tens of thousands of steps."""

    hidden: int = 64
    learning_rate: float = 2.5e-3
    epochs: int = 4
    minibatch_size: int = 256
    clip: float = 0.2
    gamma: float = 0.99
    lambd: float = 0.95
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """Means over one update's minibatches, reported as ML-Agents' ``Losses.*`` stats."""

    policy_loss: float
    value_loss: float
    entropy: float


class MLP:
    """``tanh(x @ W1 + b1) @ W2 + b2`` with a hand-written backward pass."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int, rng: np.random.Generator,
                 out_scale: float = 1.0) -> None:
        # Scaled normal init; a small output layer keeps the first policy close to uniform.
        self.params: Params = {
            "W1": rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_in, n_hidden)),
            "b1": np.zeros(n_hidden),
            "W2": rng.normal(0.0, out_scale / np.sqrt(n_hidden), (n_hidden, n_out)),
            "b2": np.zeros(n_out),
        }

    @staticmethod
    def forward(params: Params, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Outputs and the hidden activations (the cache `backward` needs)."""
        h = np.tanh(x @ params["W1"] + params["b1"])
        return h @ params["W2"] + params["b2"], h

    @staticmethod
    def backward(params: Params, x: FloatArray, h: FloatArray, d_out: FloatArray) -> Params:
        """Gradients of the loss w.r.t. every parameter, given d(loss)/d(outputs)."""
        d_h = (d_out @ params["W2"].T) * (1.0 - h * h)
        return {
            "W1": x.T @ d_h,
            "b1": d_h.sum(axis=0),
            "W2": h.T @ d_out,
            "b2": d_out.sum(axis=0),
        }


class Adam:
    """Adam (Kingma & Ba) over a dict of arrays, updated in place."""

    def __init__(self, params: Params, lr: float, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8) -> None:
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.t = 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: Params, grads: Params) -> None:
        """Move `params` one step against `grads`."""
        self.t += 1
        bias1 = 1.0 - self.beta1**self.t
        bias2 = 1.0 - self.beta2**self.t
        for k, g in grads.items():
            self.m[k] = self.beta1 * self.m[k] + (1.0 - self.beta1) * g
            self.v[k] = self.beta2 * self.v[k] + (1.0 - self.beta2) * g * g
            params[k] -= self.lr * (self.m[k] / bias1) / (np.sqrt(self.v[k] / bias2) + self.eps)


def log_softmax(logits: FloatArray) -> FloatArray:
    """Row-wise log-probabilities, stable for large logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out: FloatArray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def gae(rewards: FloatArray, values: FloatArray, dones: FloatArray, last_values: FloatArray,
        gamma: float, lambd: float) -> tuple[FloatArray, FloatArray]:
    """Generalised advantage estimates and value targets for ``[T, N]`` arrays.

    ``dones[t]`` is 1 where the episode ended at step t (the value after it is not used);
    ``last_values`` is the value of the observation after the last step.
    """
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    next_adv = np.zeros_like(last_values)
    next_values = last_values
    for t in range(steps - 1, -1, -1):
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        next_adv = delta + gamma * lambd * not_done * next_adv
        advantages[t] = next_adv
        next_values = values[t]
    return advantages, advantages + values


def ppo_policy_loss(params: Params, obs: FloatArray, actions: IntArray, old_log_probs: FloatArray,
                    advantages: FloatArray, clip: float,
                    entropy_coef: float) -> tuple[float, float, Params]:
    """PPO's clipped-surrogate loss minus the entropy bonus, its mean entropy, and gradients.

    ``loss = -mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A)) - entropy_coef * mean(H)``
    where ``r`` is the probability ratio of the taken action against `old_log_probs`.
    """
    b = len(obs)
    rows = np.arange(b)
    logits, h = MLP.forward(params, obs)
    logp_all = log_softmax(logits)
    probs = np.exp(logp_all)
    ratio = np.exp(logp_all[rows, actions] - old_log_probs)
    unclipped = ratio * advantages
    clipped = np.clip(ratio, 1.0 - clip, 1.0 + clip) * advantages
    entropy = -(probs * logp_all).sum(axis=1)
    loss = float(-np.minimum(unclipped, clipped).mean() - entropy_coef * entropy.mean())
    # d(-min(...))/d(log r): only where the unclipped term is the smaller one does the ratio
    # move the objective; d(log p_a)/dz = onehot(a) - p.
    d_logp = np.where(unclipped <= clipped, -unclipped, 0.0) / b
    onehot = np.zeros_like(probs)
    onehot[rows, actions] = 1.0
    d_logits = d_logp[:, None] * (onehot - probs)
    # dH/dz_j = -p_j (log p_j + H), and the loss subtracts entropy_coef * mean(H).
    d_logits += entropy_coef / b * probs * (logp_all + entropy[:, None])
    return loss, float(entropy.mean()), MLP.backward(params, obs, h, d_logits)


def value_loss_and_grads(params: Params, obs: FloatArray,
                         returns: FloatArray) -> tuple[float, Params]:
    """Half the mean squared error of the value net against `returns`, and its gradients."""
    out, h = MLP.forward(params, obs)
    err = out[:, 0] - returns
    loss = 0.5 * float((err * err).mean())
    return loss, MLP.backward(params, obs, h, (err / len(obs))[:, None])


class Policy:
    """The acting side: a frozen copy of the policy weights and the update it came from."""

    def __init__(self, params: Params, version: int) -> None:
        self.params = params
        self.version = version

    @timers.timed
    def get_action(self, obs: FloatArray, rng: np.random.Generator) -> tuple[IntArray, FloatArray]:
        """Sample one action per observation; returns the actions and their log-probabilities."""
        logits, _ = MLP.forward(self.params, obs)
        logp = log_softmax(logits)
        probs = np.exp(logp)
        # Inverse-CDF sampling of each row, one uniform draw per row.
        u = rng.random(len(obs))
        actions = (probs.cumsum(axis=1) < u[:, None]).sum(axis=1).astype(np.int64)
        actions = np.minimum(actions, probs.shape[1] - 1)
        return actions, logp[np.arange(len(obs)), actions]


class PPOOptimizer:
    """Owns the live networks and their Adam states; `update` runs PPO epochs on a batch."""

    def __init__(self, obs_size: int, num_actions: int, hp: PPOHyperParams, seed: int) -> None:
        self.hp = hp
        self.rng = np.random.default_rng(seed)
        self.policy_net = MLP(obs_size, hp.hidden, num_actions, self.rng, out_scale=0.01)
        self.value_net = MLP(obs_size, hp.hidden, 1, self.rng)
        self.policy_adam = Adam(self.policy_net.params, hp.learning_rate)
        self.value_adam = Adam(self.value_net.params, hp.learning_rate)
        self.version = 0

    def snapshot(self) -> Policy:
        """A frozen copy of the current policy weights, safe to hand to another thread."""
        return Policy({k: v.copy() for k, v in self.policy_net.params.items()}, self.version)

    def values(self, obs: FloatArray) -> FloatArray:
        """State values for a batch of observations of any leading shape."""
        flat = obs.reshape(-1, obs.shape[-1])
        return MLP.forward(self.value_net.params, flat)[0][:, 0].reshape(obs.shape[:-1])

    @timers.timed
    def update(self, obs: FloatArray, actions: IntArray, old_log_probs: FloatArray,
               advantages: FloatArray, returns: FloatArray) -> UpdateStats:
        """Run `hp.epochs` passes of clipped-PPO minibatch steps over one batch."""
        hp = self.hp
        n = len(obs)
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        sums = np.zeros(3)
        batches = 0
        for _ in range(hp.epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, hp.minibatch_size):
                idx = order[start : start + hp.minibatch_size]
                sums += self._minibatch_step(
                    obs[idx], actions[idx], old_log_probs[idx], adv[idx], returns[idx]
                )
                batches += 1
        self.version += 1
        mean = sums / max(1, batches)
        return UpdateStats(float(mean[0]), float(mean[1]), float(mean[2]))

    def _minibatch_step(self, obs: FloatArray, actions: IntArray, old_logp: FloatArray,
                        adv: FloatArray, returns: FloatArray) -> FloatArray:
        hp = self.hp
        loss, entropy, grads = ppo_policy_loss(
            self.policy_net.params, obs, actions, old_logp, adv, hp.clip, hp.entropy_coef
        )
        self._apply(self.policy_net, self.policy_adam, grads)
        value_loss, grads = value_loss_and_grads(self.value_net.params, obs, returns)
        self._apply(self.value_net, self.value_adam, grads)
        # Reported like ML-Agents' "Losses/Policy Loss": the surrogate without the bonus.
        return np.array([loss + hp.entropy_coef * entropy, value_loss, entropy])

    def _apply(self, net: MLP, adam: Adam, grads: Params) -> None:
        # Global-norm clipping keeps a rare huge advantage from wrecking the small nets.
        norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))
        if norm > self.hp.max_grad_norm:
            grads = {k: g * (self.hp.max_grad_norm / norm) for k, g in grads.items()}
        adam.step(net.params, grads)

    def state_dict(self) -> dict[str, FloatArray]:
        """Every array needed to resume: both networks' weights (prefixed by network)."""
        out = {f"policy/{k}": v.copy() for k, v in self.policy_net.params.items()}
        out.update({f"value/{k}": v.copy() for k, v in self.value_net.params.items()})
        return out
