"""``otel-rl demo``: the CartPole physics, the numpy PPO, and real training runs end to end.

Training runs go through real subprocesses (``python -m otel_rl demo ...``) so their env worker
processes, threads and telemetry never mix with the test process's.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import otel_rl
from otel_rl._internal.cli import main
from otel_rl._internal.demo.env import CartPoleParams, VecCartPole
from otel_rl._internal.demo.env_manager import (
    EnvironmentStep,
    SubprocessEnvManager,
    WorkerFailedError,
)
from otel_rl._internal.demo.policy import (
    MLP,
    Policy,
    PPOHyperParams,
    PPOOptimizer,
    gae,
    ppo_policy_loss,
    value_loss_and_grads,
)
from otel_rl._internal.demo.trainer import AgentProcessor, PPOTrainer, Trajectory
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from tests.signals import default_signals

REPO = Path(__file__).resolve().parents[1]

needs_configure = pytest.mark.skipif(
    not hasattr(otel_rl, "configure"),
    reason="needs otel_rl.configure()/shutdown() (the lead's otel_rl/__init__.py)",
)
needs_tree_cli = pytest.mark.skipif(
    not (REPO / "otel_rl/_internal/cli/tree.py").exists()
    or not (REPO / "otel_rl/_internal/treebuild.py").exists(),
    reason="needs `otel-rl tree` (otel_rl/_internal/cli/tree.py and treebuild.py)",
)

PROGRESS = re.compile(
    r"^CartPole\. Step: (\d+)\. Time Elapsed: ([\d.]+) s\. Mean Reward: ([\d.]+)\. "
    r"Std of Reward: ([\d.]+)\. Training\.$",
    re.MULTILINE,
)


def _cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Files only: a developer's OTLP endpoint or otel_rl settings must not leak into runs.
    for name in list(env):
        if name.startswith(("OTEL_EXPORTER_OTLP", "OTEL_RL_")):
            del env[name]
    return env


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_rl", *args],
        cwd=REPO, env=_cli_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )


def _run_python(code: str, timeout: float = 120) -> Any:
    """Run `code` in a fresh interpreter; it prints one JSON document, returned parsed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _walk(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    for name, child in node.get("children", {}).items():
        yield (*path, name), child
        yield from _walk(child, (*path, name))


# --- the environment --------------------------------------------------------------------


def _classic_cartpole_step(state: list[float], push_right: bool) -> list[float]:
    """One Euler step of the cart-pole equations as written in Florian (2007), eq. 21-22."""
    g, mc, mp, half_len, tau = 9.8, 1.0, 0.1, 0.5, 0.02
    x, x_dot, th, th_dot = state
    force = 10.0 if push_right else -10.0
    th_acc = (g * math.sin(th) + math.cos(th) * ((-force - mp * half_len * th_dot**2 * math.sin(th)) / (mc + mp))) / (
        half_len * (4.0 / 3.0 - mp * math.cos(th) ** 2 / (mc + mp))
    )
    x_acc = (force + mp * half_len * (th_dot**2 * math.sin(th) - th_acc * math.cos(th))) / (mc + mp)
    return [x + tau * x_dot, x_dot + tau * x_acc, th + tau * th_dot, th_dot + tau * th_acc]


def test_cartpole_step_follows_the_classic_equations() -> None:
    env = VecCartPole(num_envs=2, seed=0)
    env.reset()
    states = [[0.1, -0.2, 0.05, 0.3], [-1.0, 0.5, -0.1, -0.7]]
    env.state = np.array(states)
    step = env.step(np.array([1, 0]))
    for i, (state, right) in enumerate(zip(states, (True, False), strict=True)):
        np.testing.assert_allclose(step.obs[i], _classic_cartpole_step(state, right), rtol=1e-12)
    assert step.reward.tolist() == [1.0, 1.0]
    assert not step.terminated.any() and not step.truncated.any()


def test_cartpole_ends_a_fallen_episode_and_resets_that_env_only() -> None:
    env = VecCartPole(num_envs=2, seed=0)
    env.reset()
    # Env 0 is about to tip past 12 degrees; env 1 is upright.
    env.state = np.array([[0.0, 0.0, 0.2090, 1.0], [0.0, 0.0, 0.0, 0.0]])
    step = env.step(np.array([1, 1]))
    assert step.terminated.tolist() == [True, False]
    assert step.final_obs[0, 2] > CartPoleParams().theta_threshold
    assert np.all(np.abs(step.obs[0]) <= 0.05)  # a fresh episode's start state
    assert step.obs[1, 0] == 0.0 and step.obs[1, 1] != 0.0  # env 1 just moved on
    assert step.episodes.returns == [1.0] and step.episodes.lengths == [1]


def test_cartpole_truncates_at_the_step_limit() -> None:
    env = VecCartPole(num_envs=3, seed=5, params=CartPoleParams(max_episode_steps=4))
    env.reset()
    flags = []
    for _ in range(4):
        step = env.step(np.array([0, 1, 0]))
        flags.append((step.terminated.any(), step.truncated.tolist()))
    assert flags[:3] == [(False, [False] * 3)] * 3
    assert flags[3] == (False, [True] * 3)
    assert step.episodes.lengths == [4, 4, 4]


def test_cartpole_with_the_same_seed_replays_the_same_episodes() -> None:
    def rollout(seed: int) -> np.ndarray:
        env = VecCartPole(num_envs=4, seed=seed)
        obs = [env.reset()]
        for t in range(60):
            obs.append(env.step(np.full(4, t % 2)).obs)
        return np.array(obs)

    np.testing.assert_array_equal(rollout(7), rollout(7))
    assert not np.array_equal(rollout(7), rollout(8))


# --- the numpy PPO ------------------------------------------------------------------------


def _numeric_grads(loss: Any, params: dict[str, np.ndarray], eps: float = 1e-6) -> dict[str, np.ndarray]:
    grads = {}
    for key, value in params.items():
        g = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            old = value[idx]
            value[idx] = old + eps
            up = loss()
            value[idx] = old - eps
            down = loss()
            value[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads[key] = g
    return grads


def test_ppo_policy_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(0)
    params = MLP(4, 8, 2, rng).params
    obs = rng.normal(size=(32, 4))
    actions = rng.integers(0, 2, size=32)
    adv = rng.normal(size=32)
    logits, _ = MLP.forward(params, obs)
    logp = logits[np.arange(32), actions] - np.log(np.exp(logits).sum(axis=1))
    # Ratios spread over both sides of the clip range, none close to its edges (kinks).
    log_ratio = rng.choice([-0.6, -0.05, 0.0, 0.1, 0.5], size=32)
    old = logp - log_ratio

    def loss() -> float:
        return ppo_policy_loss(params, obs, actions, old, adv, 0.2, 0.01)[0]

    _, _, grads = ppo_policy_loss(params, obs, actions, old, adv, 0.2, 0.01)
    for key, expected in _numeric_grads(loss, params).items():
        np.testing.assert_allclose(grads[key], expected, rtol=1e-5, atol=1e-8)


def test_value_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(1)
    params = MLP(4, 8, 1, rng).params
    obs, returns = rng.normal(size=(16, 4)), rng.normal(size=16) * 5

    _, grads = value_loss_and_grads(params, obs, returns)
    numeric = _numeric_grads(lambda: value_loss_and_grads(params, obs, returns)[0], params)
    for key, expected in numeric.items():
        np.testing.assert_allclose(grads[key], expected, rtol=1e-5, atol=1e-8)


def test_gae_stops_at_episode_ends_and_bootstraps_the_last_step() -> None:
    rewards = np.array([[1.0], [1.0], [1.0]])
    values = np.array([[0.5], [0.4], [0.3]])
    dones = np.array([[0.0], [1.0], [0.0]])
    adv, ret = gae(rewards, values, dones, last_values=np.array([2.0]), gamma=0.9, lambd=0.8)
    d2 = 1.0 + 0.9 * 2.0 - 0.3  # last step bootstraps from last_values
    d1 = 1.0 - 0.4  # episode ended: no value after it
    d0 = 1.0 + 0.9 * 0.4 - 0.5
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.9 * 0.8 * d1, d1, d2])
    np.testing.assert_allclose(ret, adv + values)


def test_ppo_updates_raise_the_return_on_a_fixed_seed(tmp_path: Path) -> None:
    env = VecCartPole(num_envs=16, seed=3)
    optimizer = PPOOptimizer(4, 2, PPOHyperParams(), seed=3)
    trajectories: queue.Queue[Trajectory | None] = queue.Queue()
    processor = AgentProcessor(time_horizon=128, trajectory_queue=trajectories)
    trainer = PPOTrainer(optimizer, tmp_path, checkpoint_interval=10**9)
    rng = np.random.default_rng(3)
    obs = env.reset()
    mean_returns = []
    for _ in range(12):
        policy = optimizer.snapshot()
        for _ in range(128):
            actions, log_probs = policy.get_action(obs, rng)
            result = env.step(actions)
            processor.add_experiences(EnvironmentStep(obs, actions, log_probs, policy.version, result))
            obs = result.obs
        returns, _ = processor.pop_episode_stats()
        mean_returns.append(float(np.mean(returns)))
        trajectory = trajectories.get_nowait()
        assert trajectory is not None
        trainer.advance(trajectory)
    assert optimizer.version == 12
    assert mean_returns[0] < 30  # a near-uniform random policy: ~22 steps on CartPole
    assert np.mean(mean_returns[-2:]) > 2 * mean_returns[0], mean_returns


# --- the ML-Agents-shaped training, in a fresh interpreter --------------------------------

_TRAIN = """
import json, sys, tempfile
from pathlib import Path
from otel_rl import timers
from otel_rl._internal.demo.training import TrainingOptions, run_training
import numpy as np

def train(seed):
    timers.reset_timers()
    with tempfile.TemporaryDirectory() as d:
        r = run_training(TrainingOptions(run_dir=Path(d), max_steps={steps}, seed=seed,
                                         summary_freq=1024, checkpoint_interval=4096),
                         log=lambda line: None)
        model = dict(np.load(r.final_model))
    return r, model
"""


def test_training_merges_worker_and_trainer_trees_the_mlagents_way() -> None:
    tree = _run_python(_TRAIN.format(steps=3000) + "train(0)\nprint(json.dumps(timers.get_timer_tree()))")
    nodes = dict(_walk(tree))
    iterations = math.ceil(3000 / 16)
    advance = ("TrainerController.start_learning", "TrainerController.advance")
    assert nodes[advance]["count"] == iterations
    worker_root = nodes[(*advance, "env_step", "workers", "worker_root")]
    assert worker_root["is_parallel"] is True
    assert worker_root["count"] == 2 * iterations  # each worker's root, every step
    worker_step = worker_root["children"]["worker_step"]
    assert worker_step["is_parallel"] is True and worker_step["count"] == 2 * iterations
    assert set(worker_step["children"]) == {"env.step", "_generate_all_results"}
    trainer = nodes[("TrainerController.start_learning", "trainer_threads", "thread_root", "trainer_advance")]
    assert trainer["is_parallel"] is True
    assert trainer["count"] == (iterations // 128)  # one PPO update per 128-step trajectory
    assert ("run_training.setup",) in nodes
    assert {"Policy.Entropy.mean", "Environment.CumulativeReward.mean"} <= set(tree["gauges"])


def test_training_with_the_same_seed_trains_the_same_model() -> None:
    code = _TRAIN.format(steps=4500) + """
a, ma = train(4)
b, mb = train(4)
c, mc = train(5)
same = all(np.array_equal(ma[k], mb[k]) for k in ma)
differs = any(not np.array_equal(ma[k], mc[k]) for k in ma)
print(json.dumps([same, differs, [s.mean_reward for s in a.summaries], [s.mean_reward for s in b.summaries]]))
"""
    same, differs, rewards_a, rewards_b = _run_python(code)
    assert same and differs
    assert rewards_a == rewards_b and len(rewards_a) >= 3


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "-5"], "--steps must be a positive number"),
        (["--steps", "0"], "--steps must be a positive number"),
        (["--workers", "0"], "--workers must be between 1 and"),
        (["--seed", "-1"], "--seed must be zero or positive"),
        (["--checkpoint-interval", "0"], "--checkpoint-interval must be a positive"),
        (["--run-id", ".."], "--run-id must be a plain folder name"),
        (["--run-id", "a/b"], "--run-id must be a plain folder name"),
    ],
)
def test_demo_rejects_bad_options_in_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--output", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("otel-rl demo: " + message) and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


def test_demo_rejects_an_output_dir_it_cannot_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["demo", "--output", str(blocker)]) == 2
    assert capsys.readouterr().err == f"otel-rl demo: --output {blocker} is not a directory\n"
    assert main(["demo", "--output", str(blocker / "below")]) == 5  # unavailable
    err = capsys.readouterr().err
    assert err.startswith(f"otel-rl demo: cannot write to --output {blocker / 'below'}: ")
    assert err.count("\n") == 1


def test_demo_refuses_to_overwrite_a_run_folder_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "demo" / "keep.txt"
    kept.parent.mkdir()
    kept.write_text("earlier run")
    assert main(["demo", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert kept.read_text() == "earlier run"


# --- whole runs through the CLI ------------------------------------------------------------

SEEDED_STEPS = 30_000


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One seeded demo run over a stale run folder (so --force is exercised too)."""
    if not hasattr(otel_rl, "configure"):
        pytest.skip("needs otel_rl.configure()/shutdown() (the lead's otel_rl/__init__.py)")
    output = tmp_path_factory.mktemp("results")
    stale = output / "seeded" / "stale.txt"
    stale.parent.mkdir()
    stale.write_text("from an earlier run")
    done = _run_cli(
        "demo", "--workers", "2", "--steps", str(SEEDED_STEPS), "--seed", "1",
        "--output", str(output), "--run-id", "seeded", "--checkpoint-interval", "10000", "--force",
    )
    assert done.returncode == 0, done.stderr
    return done, output / "seeded"


@needs_configure
def test_demo_prints_mlagents_style_progress(seeded_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, run_dir = seeded_run
    lines = PROGRESS.findall(done.stdout)
    assert len(lines) == SEEDED_STEPS // 5000
    steps = [int(step) for step, *_ in lines]
    assert steps == sorted(steps) and steps[-1] >= SEEDED_STEPS - 16
    assert f"Report:      {run_dir / 'run_logs' / 'report.html'}" in done.stdout


@needs_configure
def test_demo_reward_rises_over_a_seeded_run(seeded_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    rewards = [float(m[2]) for m in PROGRESS.findall(seeded_run[0].stdout)]
    assert rewards[0] < 35, rewards  # random play
    assert rewards[-1] > rewards[0] + 40, rewards


@needs_configure
def test_demo_saves_real_checkpoints_and_replaces_the_old_run(
    seeded_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, run_dir = seeded_run
    assert not (run_dir / "stale.txt").exists()
    checkpoints = sorted((run_dir / "CartPole").glob("CartPole-*.npz"))
    assert len(checkpoints) == 2  # every 10000 steps of the 14 x 2048 steps learned
    for path in [*checkpoints, run_dir / "CartPole.npz"]:
        with np.load(path) as model:
            assert model["policy/W1"].shape == (4, 64)
            assert int(model["step"]) >= 10_000
            assert np.isfinite(model["policy/W2"]).all()


@needs_configure
def test_demo_timers_json_holds_the_mlagents_blocks_and_gauges(
    seeded_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    tree = json.loads((seeded_run[1] / "run_logs" / "timers.json").read_text())
    nodes = dict(_walk(tree))
    assert ("run_training.setup",) in nodes
    advance = nodes[("TrainerController.start_learning", "TrainerController.advance")]
    assert advance["count"] == math.ceil(SEEDED_STEPS / 16)
    assert "env_step" in advance["children"]
    for gauge in ("Environment.CumulativeReward.mean", "Environment.EpisodeLength.mean",
                  "Policy.Entropy.mean"):
        assert tree["gauges"][gauge]["count"] >= 1
    assert tree["gauges"]["Environment.CumulativeReward.mean"]["max"] > 60
    assert tree["metadata"]["seed"] == "1" and tree["metadata"]["workers"] == "2"
    assert tree["metadata"]["run_id"] == "seeded"


@needs_configure
def test_demo_whole_run_tree_has_every_worker_step_in_parallel(
    seeded_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    tree = json.loads((seeded_run[1] / "run_logs" / "timers.json").read_text())
    iterations = math.ceil(SEEDED_STEPS / 16)
    worker_steps = [n for path, n in _walk(tree) if path[-1] == "worker_step"]
    # The whole-run tree gathers the workers' own blocks (not the hand-merged copies):
    # every step of both workers exactly once, flagged as parallel.
    assert sum(n["count"] for n in worker_steps) == 2 * iterations
    assert all(n.get("is_parallel") for n in worker_steps)
    updates = [n for path, n in _walk(tree) if path[-1] == "PPOOptimizer.update"]
    assert sum(n["count"] for n in updates) == SEEDED_STEPS // 2048
    assert all(n.get("is_parallel") for n in updates)


@needs_configure
@pytest.mark.chromium
def test_demo_html_report_renders_in_chromium(
    seeded_run: tuple[subprocess.CompletedProcess[str], Path], chromium_driver: Any,
) -> None:
    from selenium.webdriver.common.by import By

    report = seeded_run[1] / "run_logs" / "report.html"
    chromium_driver.get(report.as_uri())
    errors = [e for e in chromium_driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert chromium_driver.find_element(By.ID, "title").text == "otel-rl demo"
    assert "Environment.CumulativeReward.mean" in chromium_driver.find_element(By.ID, "gauges-section").text
    assert "TrainerController.advance" in chromium_driver.find_element(By.TAG_NAME, "body").text


@needs_configure
@needs_tree_cli
def test_demo_spans_file_rebuilds_the_same_tree_counts(tmp_path: Path) -> None:
    done = _run_cli("demo", "--steps", "3000", "--spans", "all", "--quiet",
                    "--output", str(tmp_path), "--run-id", "spans")
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "spans" / "run_logs"
    rebuilt_path = tmp_path / "rebuilt.json"
    done = _run_cli("tree", str(logs / "spans.otlp.jsonl"), "-o", str(rebuilt_path))
    assert done.returncode == 0, done.stderr
    written = {path: n["count"] for path, n in _walk(json.loads((logs / "timers.json").read_text()))}
    rebuilt = {path: n["count"] for path, n in _walk(json.loads(rebuilt_path.read_text()))}
    assert rebuilt == written
    assert written[("TrainerController.start_learning", "TrainerController.advance")] == math.ceil(3000 / 16)


# --- env workers that fail ------------------------------------------------------------------


class _WrongSizePolicy(Policy):
    """Acts for one env too few, so the last worker's env rejects its actions."""

    def get_action(self, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        actions, log_probs = super().get_action(obs, rng)
        return actions[:-1], log_probs[:-1]


def _manager_with_policy(policy: Policy) -> SubprocessEnvManager:
    # spawn: the workers start from a clean interpreter, not a copy of this test process.
    manager = SubprocessEnvManager(num_workers=2, envs_per_worker=2, seed=0, start_method="spawn")
    manager.set_policy(policy)
    manager.reset()
    return manager


def test_env_worker_errors_reach_the_parent_with_their_reason() -> None:
    params = PPOOptimizer(4, 2, PPOHyperParams(hidden=4), seed=0).snapshot().params
    manager = _manager_with_policy(_WrongSizePolicy(params, version=0))
    try:
        with pytest.raises(WorkerFailedError, match=r"env worker 1 failed: ValueError: expected 2 actions"):
            manager.get_steps()
    finally:
        manager.close()
    assert manager.workers == []


def test_a_killed_env_worker_stops_training_instead_of_hanging() -> None:
    manager = _manager_with_policy(PPOOptimizer(4, 2, PPOHyperParams(hidden=4), seed=0).snapshot())
    try:
        assert manager.get_steps().result.obs.shape == (4, 4)
        victim = manager.workers[0].process
        victim.kill()
        victim.join(5)
        with pytest.raises(WorkerFailedError, match=r"env worker 0 exited unexpectedly \(exit code -9\)"):
            manager.get_steps()
    finally:
        manager.close()


@needs_configure
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_demo_gathers_worker_timings_with_every_start_method(method: str, tmp_path: Path) -> None:
    done = _run_cli("demo", "--steps", "2000", "--start-method", method, "--spans", "off",
                    "--quiet", "--output", str(tmp_path))
    assert done.returncode == 0, done.stderr
    tree = json.loads((tmp_path / "demo" / "run_logs" / "timers.json").read_text())
    worker_steps = [n for path, n in _walk(tree) if path[-1] == "worker_step"]
    assert sum(n["count"] for n in worker_steps) == 2 * math.ceil(2000 / 16)
    assert tree["metadata"]["start_method"] == method
    # --spans off: no block spans; the run span, worker markers and the aggregate (exact tree).
    spans = read_otlp_json_file(tmp_path / "demo" / "run_logs" / "spans.otlp.jsonl")
    assert {s.attributes.get("otel_rl.kind") for s in spans} == {"run", "process", "aggregate"}


@needs_configure
def test_demo_stops_cleanly_on_ctrl_c_and_keeps_its_model_and_timers(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl", "demo", "--steps", "100000000", "--output", str(tmp_path)],
        cwd=REPO, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
        preexec_fn=default_signals,  # SIGINT as a terminal's job has it, however pytest runs
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # training is under way once progress is printed
        assert PROGRESS.match(first.rstrip("\n")), first
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: to the trainer and its workers
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and err.endswith("otel-rl demo: interrupted\n"), err
    run_dir = tmp_path / "demo"
    with np.load(run_dir / "CartPole.npz") as model:
        assert int(model["step"]) > 0
    tree = json.loads((run_dir / "run_logs" / "timers.json").read_text())
    assert tree["children"]["TrainerController.start_learning"]["count"] == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the env workers exit too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("env worker processes outlived the interrupted demo")
