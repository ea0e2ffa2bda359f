"""``otel-rl demo``: a small but real RL training shaped like ML-Agents' ``mlagents-learn``.

PPO on a vectorised numpy CartPole, env workers in subprocesses (talking over Pipes and
sending their timer trees back each step, as ML-Agents' SubprocessEnvManager does), a trainer
thread, checkpoints, gauges and metadata, all timed with `otel_rl.timers` exactly the way
ML-Agents times itself. Only numpy is needed beyond the standard library.
"""

from __future__ import annotations

from otel_rl import timers

__all__ = ["timers"]
