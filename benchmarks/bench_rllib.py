"""The real RLlib PPO run with and without otel_rl: training iterations per second.

    python benchmarks/bench_rllib.py [--rounds N] [--iterations N] [--quick] [--json FILE]
                                     [--also spans_off,disabled] [--against REV,...]
                                     [--no-collect] [--side-by-side]

RLlib 2.60 PPO on CartPole (new API stack, 2 env runners, a Learner actor, 400 env steps per
iteration; ``tests/frameworks/rllib_train.py``), in the venv ``scripts/setup-frameworks.sh
ray`` builds, with this checkout's otel_rl installed there by a plain ``pip install``. Each
round runs both variants in a shuffled order: plain, and under ``otel-rl run`` (default
settings: the ``auto`` span policy, files in a temporary folder). Measured per run: the wall
time of each ``algo.train()`` call; iterations/s = iterations / their summed time, the first
iteration left out (warm-up); and the CPU seconds (every thread) of the driver, the env runners
and the Learner at the end of training, and per iteration of training alone (at the end minus
once the algorithm is built), the steadier figures on a shared machine (Ray's own daemons
are not counted); and the CPU seconds of every process
of the run, counted in a cgroup of its own (`_cpu.TreeCpu`: the driver, Ray's daemons and
workers, and under ``otel-rl run`` the CLI). Ray's start and the algorithm's
build are not counted (they are the same code either way, and their time is noise here).
Once the algorithm is built, every RLlib process runs a full garbage collection, in both
variants (``rllib_train.collect_everywhere``, which says why; ``--no-collect``: not).
Reported: medians (min-max) and the ratio of medians otel_rl / plain with its 95 % interval
(rounds resampled whole), plus the spread of the per-round ratios and their median with a 95 %
bootstrap interval (`_stats`). Checks: every run exits 0 and trains every iteration; the
otel_rl run writes timers.json with the env runners' ``sample`` blocks under
``env_runner_sampling_timer``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from _report import failed_checks_lines, finish
from _stats import against_rows, ratio_rows, summarize_rounds
from bench_sample_factory import (
    TREE,
    against,
    also,
    interleaved,
    launcher,
    side_by_side_lines,
    variants_argument,
    venv_python,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(REPO, "tests", "frameworks", "rllib_train.py")
#: The figures of a run, in the tables' order.
KEYS = ("it_per_s", "train_cpu_s", "cpu_s", "tree_cpu_s", "wall_s")
SAMPLING = ("training_iteration", "training_step", "env_runner_sampling_timer", "sample")


def _sampling_under_the_driver(timers_json: str) -> bool:
    with open(timers_json, encoding="utf-8") as f:
        node = json.load(f)
    for name in SAMPLING:
        node = (node.get("children") or {}).get(name)
        if node is None:
            return False
    return bool(node.get("is_parallel"))


def one_run(python: str, variant: str, iterations: int, workdir: str,
            collect: bool) -> dict[str, Any]:
    bindir = os.path.dirname(python)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "OTEL_", "RLLIB_TRAIN_"))}
    if collect:
        env["RLLIB_TRAIN_COLLECT"] = "1"
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    results = os.path.join(workdir, f"{variant}.json")
    out = os.path.join(workdir, f"otel-{variant}")
    shutil.rmtree(out, ignore_errors=True)
    argv = [python, SCRIPT, results, str(iterations)]
    if variant != "plain":
        argv = [*launcher(python, variant, out, env), "python", SCRIPT, results,
                str(iterations)]
    done, tree_cpu, wall = TREE.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                                    stdin=subprocess.DEVNULL, timeout=1800)
    checks = []
    rows: list[dict[str, Any]] = []
    cpu_s = train_cpu = 0.0
    if done.returncode != 0:
        checks.append(f"{variant}: exit status {done.returncode}: {done.stderr[-300:]!r}")
    elif os.path.exists(results):
        with open(results, encoding="utf-8") as f:
            data = json.load(f)
        rows = data["iterations"]
        cpu = data["cpu_s"]
        cpu_s = cpu["driver"] + sum(cpu["env_runners"]) + sum(cpu["learners"])
        built = data.get("cpu_built_s")
        if built and rows:  # training alone, per iteration
            train_cpu = (cpu_s - built["driver"] - sum(built["env_runners"])
                         - sum(built["learners"])) / len(rows)
    if len(rows) != iterations:
        checks.append(f"{variant}: trained {len(rows)} of {iterations} iterations")
    if variant == "otel_rl" and done.returncode == 0:
        timers = os.path.join(out, "timers.json")
        if not os.path.exists(timers):
            checks.append("otel_rl: no timers.json")
        elif not _sampling_under_the_driver(timers):
            checks.append("otel_rl: the env runners' sample blocks are not under "
                          "env_runner_sampling_timer")
    timed = [row["seconds"] for row in rows[1:]]
    return {"it_per_s": len(timed) / sum(timed) if timed else 0.0, "cpu_s": cpu_s,
            "train_cpu_s": train_cpu, "tree_cpu_s": tree_cpu, "wall_s": wall, "checks": checks}


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    ratios = {"otel_rl": results["ratios"], **results.get("variant_ratios", {})}
    names = {"plain": "plain", "otel_rl": "under `otel-rl run` (auto)",
             "spans_off": "under `otel-rl run`, `spans=off`",
             "disabled": "under `otel-rl run`, `disabled`"}
    lines = [f"RLlib 2.60 PPO CartPole, 2 env runners + a Learner actor, {results['iterations']} "
             f"iterations (first left out), {results['rounds']} interleaved rounds "
             f"(median, min–max){'' if results.get('collect', False) else ', no collection'}",
             "",
             f"CPU of every process counted by {results.get('cpu_method', '-')}.",
             *side_by_side_lines(results), "",
             "| | iterations/s (algo.train()) | CPU s per iteration, training alone | "
             "CPU s: driver + env runners + learner | CPU s: every process of the run | "
             "wall s, whole run |",
             "|---|---|---|---|---|---|"]
    for variant in s:
        cells = [f"{s[variant][k]['median']:.{d}f} ({s[variant][k]['min']:.{d}f}–"
                 f"{s[variant][k]['max']:.{d}f})" for k, d in (("it_per_s", 3),
                                                              ("train_cpu_s", 3),
                                                              ("cpu_s", 1),
                                                              ("tree_cpu_s", 1),
                                                              ("wall_s", 1))]
        lines.append(f"| {names.get(variant, variant)} | " + " | ".join(cells) + " |")
    return "\n".join([*failed_checks_lines(results), *lines, *ratio_rows(ratios, KEYS),
                      *against_rows(results, KEYS)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5 iterations")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--seed", type=int, default=0, help="of the variant order per round")
    parser.add_argument("--no-collect", dest="collect", action="store_false",
                        help="no full garbage collection once the algorithm is built")
    variants_argument(parser)
    args = parser.parse_args()
    rounds, iterations = (3, 5) if args.quick else (args.rounds, args.iterations)
    python = venv_python("ray")
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-rllib-") as workdir:
        others = also(args.also) + against(args.against, python, workdir)
        runs = interleaved(rounds, args.seed,
                           lambda variant: one_run(python, variant, iterations, workdir,
                                                   args.collect),
                           rate="it/s", others=others, key="it_per_s",
                           side_by_side=args.side_by_side)
    results = {"rounds": rounds, "iterations": iterations, "collect": args.collect,
               "side_by_side": args.side_by_side,
               "cpu_method": TREE.method, "runs": runs,
               **summarize_rounds(runs, KEYS)}
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
