"""Env workers in subprocesses, driven over Pipes, timed the way ML-Agents times them.

Like ML-Agents' ``SubprocessEnvManager``: each worker process owns an environment (here a
`VecCartPole` of several carts), receives commands over a Pipe, times its own work with
``hierarchical_timer`` / ``@timed``, and sends its timer root back with every step result,
then resets its timers. The parent merges those roots under ``workers`` / ``worker_root``
flagged ``is_parallel``. One deliberate difference: the parent waits for every worker each
step (ML-Agents takes whichever answers first), so a seeded run is reproducible.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, cast

import numpy as np

from otel_rl._internal.demo import timers
from otel_rl._internal.demo.env import (
    EpisodeStats,
    FloatArray,
    IntArray,
    VecCartPole,
    VecStep,
)
from otel_rl._internal.demo.policy import Policy

__all__ = ["EnvironmentStep", "SubprocessEnvManager", "WorkerFailedError", "worker"]

_RESET, _STEP, _CLOSE, _ERROR = "reset", "step", "close", "error"

#: Seconds to wait for a worker to answer or to exit before calling it stuck.
_RESPONSE_TIMEOUT = 60.0
_JOIN_TIMEOUT = 5.0


class WorkerFailedError(RuntimeError):
    """An env worker died or stopped answering; training cannot go on."""


@dataclass(slots=True)
class EnvironmentStep:
    """One step of every env across all workers, with what the policy did before it."""

    obs: FloatArray  # the observations the actions were chosen on, [num_envs, 4]
    actions: IntArray
    log_probs: FloatArray
    policy_version: int
    result: VecStep


@timers.timed
def _generate_all_results(step: VecStep) -> VecStep:
    """What a worker sends back: the step with compact dtypes (it is pickled every step)."""
    step.terminated = step.terminated.astype(np.bool_, copy=False)
    step.truncated = step.truncated.astype(np.bool_, copy=False)
    return step


def worker(conn: Connection, num_envs: int, seed: int) -> None:
    """The env worker process: serve reset/step/close commands until told to close."""
    # A forked child starts with a copy of the parent's timer stack (mid-block); start clean
    # so the first tree sent back holds only this worker's own blocks.
    timers.reset_timers()
    env = VecCartPole(num_envs, seed)
    try:
        while True:
            command, payload = conn.recv()
            if command == _STEP:
                with timers.hierarchical_timer("worker_step"):
                    with timers.hierarchical_timer("env.step"):
                        step = env.step(payload)
                    result = _generate_all_results(step)
                conn.send((_STEP, result, timers.get_timer_root()))
                # The parent now owns these timings; start the next step from zero.
                timers.reset_timers()
            elif command == _RESET:
                with timers.hierarchical_timer("env.reset"):
                    obs = env.reset()
                conn.send((_RESET, obs, None))
            elif command == _CLOSE:
                break
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        # The parent went away or is shutting down (Ctrl-C reaches the whole group).
        pass
    except Exception as exc:
        # Tell the parent why, rather than leaving it to find a closed pipe.
        try:
            conn.send((_ERROR, f"{type(exc).__name__}: {exc}", None))
        except OSError:
            pass
    finally:
        conn.close()


class _EnvWorker:
    __slots__ = ("conn", "process", "worker_id")

    def __init__(self, process: Any, conn: Connection, worker_id: int) -> None:
        self.process = process
        self.conn = conn
        self.worker_id = worker_id


class SubprocessEnvManager:
    """`num_workers` processes, each stepping `envs_per_worker` CartPoles in lockstep.

    The policy lives in the parent: `get_steps` picks actions for every env with the current
    policy, ships each worker its slice, and returns the combined result.
    """

    def __init__(self, num_workers: int, envs_per_worker: int, seed: int,
                 start_method: str | None = None) -> None:
        self.envs_per_worker = envs_per_worker
        self.num_envs = num_workers * envs_per_worker
        self._ctx = multiprocessing.get_context(start_method)
        self._rng = np.random.default_rng([seed, 1])
        self._policy: Policy | None = None
        self._last_obs: FloatArray | None = None
        self.workers: list[_EnvWorker] = []
        try:
            for worker_id in range(num_workers):
                self.workers.append(self._create_worker(worker_id, seed))
        except BaseException:
            self.close()
            raise

    def _create_worker(self, worker_id: int, seed: int) -> _EnvWorker:
        parent_conn, child_conn = self._ctx.Pipe()
        # Distinct, reproducible streams per worker: the seed sequence mixes in the worker id.
        worker_seed = int(np.random.SeedSequence([seed, 2, worker_id]).generate_state(1)[0])
        # typeshed's BaseContext lacks Process, which every concrete context has.
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker,
            args=(child_conn, self.envs_per_worker, worker_seed),
            name=f"env-worker-{worker_id}",
            daemon=True,
        )
        process.start()
        child_conn.close()  # the child holds its own end now
        return _EnvWorker(process, parent_conn, worker_id)

    def set_policy(self, policy: Policy) -> None:
        """Act with `policy` from the next step on."""
        self._policy = policy

    @property
    def policy_version(self) -> int:
        """The version of the policy currently acting (-1 before one is set)."""
        return -1 if self._policy is None else self._policy.version

    @timers.timed
    def reset(self) -> FloatArray:
        """Reset every env; returns the first observations of all envs, in worker order."""
        for w in self.workers:
            self._send(w, _RESET, None)
        self._last_obs = np.concatenate([self._receive(w, _RESET)[0] for w in self.workers])
        return self._last_obs

    def get_steps(self) -> EnvironmentStep:
        """Choose actions for every env, step all workers, and collect the results."""
        if self._policy is None or self._last_obs is None:
            raise RuntimeError("set_policy() and reset() must come before get_steps()")
        obs = self._last_obs
        actions, log_probs = self._queue_steps(obs)
        results = self._step()
        step = self._postprocess_steps(results)
        self._last_obs = step.obs
        return EnvironmentStep(obs, actions, log_probs, self.policy_version, step)

    @timers.timed
    def _queue_steps(self, obs: FloatArray) -> tuple[IntArray, FloatArray]:
        assert self._policy is not None
        actions, log_probs = self._policy.get_action(obs, self._rng)
        n = self.envs_per_worker
        for w in self.workers:
            self._send(w, _STEP, actions[w.worker_id * n : (w.worker_id + 1) * n])
        return actions, log_probs

    @timers.timed
    def _step(self) -> list[tuple[VecStep, Any]]:
        """Wait for every worker's answer, taking them in whatever order they arrive."""
        by_conn = {w.conn: w for w in self.workers}
        answers: dict[int, tuple[VecStep, Any]] = {}
        pending = list(by_conn)
        while pending:
            ready = wait(pending, timeout=_RESPONSE_TIMEOUT)
            if not ready:
                raise WorkerFailedError(
                    f"no answer from env workers in {_RESPONSE_TIMEOUT:.0f} s"
                )
            for ready_conn in ready:
                conn = cast(Connection, ready_conn)  # wait() returns what it was given
                w = by_conn[conn]
                answers[w.worker_id] = self._receive(w, _STEP)
                pending.remove(conn)
        return [answers[w.worker_id] for w in self.workers]

    def _postprocess_steps(self, results: list[tuple[VecStep, Any]]) -> VecStep:
        timer_nodes = [root for _, root in results if root is not None]
        if timer_nodes:
            # Each worker's tree joins ours as a parallel branch, as ML-Agents merges them.
            with timers.hierarchical_timer("workers") as main_timer_node:
                for worker_timer_node in timer_nodes:
                    main_timer_node.merge(
                        worker_timer_node, root_name="worker_root", is_parallel=True
                    )
        steps = [step for step, _ in results]
        returns: list[float] = []
        lengths: list[int] = []
        for s in steps:
            returns.extend(s.episodes.returns)
            lengths.extend(s.episodes.lengths)
        return VecStep(
            obs=np.concatenate([s.obs for s in steps]),
            reward=np.concatenate([s.reward for s in steps]),
            terminated=np.concatenate([s.terminated for s in steps]),
            truncated=np.concatenate([s.truncated for s in steps]),
            final_obs=np.concatenate([s.final_obs for s in steps]),
            episodes=EpisodeStats(returns, lengths),
        )

    def _send(self, w: _EnvWorker, command: str, payload: Any) -> None:
        try:
            w.conn.send((command, payload))
        except OSError as exc:  # BrokenPipeError and friends: the worker is gone
            raise self._exited(w) from exc

    def _receive(self, w: _EnvWorker, expected: str) -> tuple[Any, Any]:
        try:
            command, payload, timer_root = w.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._exited(w) from exc
        if command == _ERROR:
            raise WorkerFailedError(f"env worker {w.worker_id} failed: {payload}")
        if command != expected:
            raise WorkerFailedError(f"env worker {w.worker_id} answered {command!r} to {expected!r}")
        return payload, timer_root

    @staticmethod
    def _exited(w: _EnvWorker) -> WorkerFailedError:
        w.process.join(0.5)
        return WorkerFailedError(
            f"env worker {w.worker_id} exited unexpectedly (exit code {w.process.exitcode})"
        )

    def close(self) -> None:
        """Ask every worker to stop, then make sure it has (terminate after a grace period)."""
        for w in self.workers:
            try:
                w.conn.send((_CLOSE, None))
            except (BrokenPipeError, OSError):
                pass
        for w in self.workers:
            w.process.join(_JOIN_TIMEOUT)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(_JOIN_TIMEOUT)
            w.conn.close()
        self.workers = []
