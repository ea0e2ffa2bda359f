"""The real ML-Agents run with and without otel_rl: steps per second and CPU of all processes.

    python benchmarks/bench_mlagents.py [--rounds N] [--steps N] [--envs N] [--quick] [--json FILE]
                                        [--also VARIANT,...] [--against REV,...] [--side-by-side]

ML-Agents 1.1.0 PPO through ``mlagents-learn``'s own code path (``tests/frameworks/
mlagents_train.py``: ``learn.run_cli``, a ``SubprocessEnvManager`` of 2 env worker processes,
a threaded trainer, torch on CPU; the environment is ML-Agents' Python ``SimpleEnvironment``
with ``UnityEnvironment.step``'s ``@timed``), in the venv ``scripts/setup-frameworks.sh
mlagents`` builds, with this checkout's otel_rl installed there by a plain ``pip install``.
Each round runs both variants in a shuffled order: plain, and under ``otel-rl run`` (default
settings: ``auto``, files in a temporary folder). Measured per run: steps per second of
training (the steps asked for over ML-Agents' own ``TrainerController.start_learning`` total
in its ``run_logs/timers.json``, written by ML-Agents in both variants) and the user + system
CPU seconds of every process of the run (``RUSAGE_CHILDREN``: the trainer, its env workers
and, under ``otel-rl run``, the CLI). Reported as `bench_sample_factory.py` does: medians
(min-max), the ratio of medians otel_rl / plain and the per-round spread. Checks: every run
exits 0 and writes ML-Agents' timers.json; the otel_rl run also writes otel_rl's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from _report import finish
from _stats import summarize_rounds
from bench_sample_factory import (
    KEYS,
    TREE,
    against,
    also,
    interleaved,
    measured,
    table,
    variants_argument,
    venv_python,
)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(HERE), "tests", "frameworks", "mlagents_train.py")


def _learning_seconds(results_dir: str) -> float | None:
    """ML-Agents' own ``TrainerController.start_learning`` total, from its timers.json."""
    try:
        with open(os.path.join(results_dir, "simple", "run_logs", "timers.json"),
                  encoding="utf-8") as f:
            tree = json.load(f)
        return float(tree["children"]["TrainerController.start_learning"]["total"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def one_run(python: str, variant: str, steps: int, envs: int, workdir: str) -> dict[str, Any]:
    results_dir = os.path.join(workdir, f"results-{variant}")
    command = [TRAIN, results_dir, "--steps", str(steps), "--envs", str(envs)]
    done, cpu, wall = measured(python, command, variant, workdir)
    checks = []
    if done.returncode != 0:
        checks.append(f"{variant}: exit status {done.returncode}: "
                      f"{(done.stdout + done.stderr)[-300:]!r}")
    learning = _learning_seconds(results_dir)
    if learning is None:
        checks.append(f"{variant}: no TrainerController.start_learning in ML-Agents' timers.json")
    if variant == "otel_rl" and not os.path.exists(os.path.join(workdir, "otel-otel_rl",
                                                                "timers.json")):
        checks.append("otel_rl: no timers.json")
    return {"fps": steps / learning if learning else 0.0, "cpu_s": cpu, "wall_s": wall,
            "checks": checks}


def render(results: dict[str, Any]) -> str:
    return table(results, f"ML-Agents 1.1.0 PPO (`mlagents-learn`'s code path), "
                 f"{results['steps']} steps, {results['envs']} env worker processes, "
                 f"{results['rounds']} interleaved rounds (median, min–max)",
                 "steps/s (ML-Agents' start_learning)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3,000 steps")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--seed", type=int, default=0, help="of the variant order per round")
    variants_argument(parser)
    args = parser.parse_args()
    others = also(args.also)
    rounds, steps = (2, 3000) if args.quick else (args.rounds, args.steps)
    python = venv_python("mlagents")
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-mlagents-") as workdir:
        others += against(args.against, python, workdir)
        runs = interleaved(rounds, args.seed,
                           lambda variant: one_run(python, variant, steps, args.envs, workdir),
                           rate="steps/s", others=others, side_by_side=args.side_by_side)
    results = {"rounds": rounds, "steps": steps, "envs": args.envs, "cpu_method": TREE.method,
               "side_by_side": args.side_by_side,
               "runs": runs,
               **summarize_rounds(runs, KEYS)}
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
