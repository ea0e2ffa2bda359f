"""The real Sample Factory run with and without otel_rl: FPS and CPU seconds of all processes.

    python benchmarks/bench_sample_factory.py [--rounds N] [--steps N] [--quick] [--json FILE]
                                              [--also VARIANT,...] [--against REV,...]
                                              [--side-by-side]

Sample Factory 2.1.1 APPO on CartPole (``python -m sf_examples.train_gym_env``, 2 rollout
workers x 8 envs, CPU), in the venv ``scripts/setup-frameworks.sh sf`` builds, with this
checkout's otel_rl installed there by a plain ``pip install``. Each round runs both variants
in a shuffled order: plain, and under ``otel-rl run`` (default settings: the ``auto`` span
policy, files in a temporary folder). Measured per run: Sample Factory's own final FPS
(``Collected {0: N}, FPS: X``) and the CPU seconds of every process of the run, counted in a
cgroup of its own (`_cpu.TreeCpu`: the runner, its workers and, under ``otel-rl run``, the CLI).
Reported: medians (min-max) and the ratio of medians otel_rl / plain, with the spread of the
per-round ratios, a 95 % interval of the ratio (rounds resampled whole: `_stats.py`) and the
median of the per-round ratios. Checks: every run exits 0 and collects at least the steps
asked for; the otel_rl run writes timers.json with the components.

``--against REV``: one more variant, ``otel_rl@REV``: under ``otel-rl run`` with otel_rl as
of that git revision (extracted and built for the venv's Python, first on PYTHONPATH), so
a change is told apart from the machine's drift in the same rounds (``otel_rl /
otel_rl@REV`` rows; also in bench_mlagents.py and bench_rllib.py).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _cpu import TreeCpu
from _report import built_package_at_revision, failed_checks_lines, finish
from _stats import against_rows, ratio_rows, summarize_rounds

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
_LOCKS: list[Any] = []
#: Variants under ``otel-rl run`` and the settings they add (besides ``plain``).
VARIANTS = {"otel_rl": {}, "spans_off": {"OTEL_RL_SPANS": "off"},
            "disabled": {"OTEL_RL_DISABLED": "true"}}
#: Variants of otel_rl as of an earlier git revision (``--against REV``: ``otel_rl@REV``, default
#: settings) -> the folder holding that otel_rl (`_report.built_package_at_revision`).
REVISIONS: dict[str, str] = {}
#: What a real run measures, each round's row (this bench's and ML-Agents'; RLlib's has its own).
KEYS = ("fps", "cpu_s", "wall_s")
#: Measures each run's whole process tree.
TREE = TreeCpu()
#: What ``--side-by-side`` measures and does not.
SIDE_BY_SIDE = ("every variant of a round shares the machine's same moment, so the CPU ratios "
                "lose the drift between runs; the variants compete for the cores, so the rates "
                "are not a single run's")
COLLECTED = re.compile(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)")


def framework_python(target: str) -> str:
    """The Python of the framework venv `target` (`scripts/setup-frameworks.sh` builds it if
    missing), as it is: nothing installed into it."""
    out = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup-frameworks.sh"), target],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def venv_python(target: str = "sf") -> str:
    """The Python of the framework venv `target`, with this checkout's otel_rl installed."""
    python = framework_python(target)
    # The tests in tests/frameworks/ take the same lock: nobody reinstalls otel_rl meanwhile.
    lock = open(os.path.join(os.path.dirname(os.path.dirname(python)), ".otel-rl-tests.lock"),
                "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    _LOCKS.append(lock)
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "uninstall", "-y", "otel-rl"], capture_output=True)
    with tempfile.TemporaryDirectory(prefix="otel-rl-src-") as src:
        listed = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True)
        for rel in filter(None, listed.stdout.decode().split("\0")):
            if (rel.startswith("otel_rl/") or "/" not in rel) and os.path.isfile(
                    os.path.join(REPO, rel)):
                os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
                with open(os.path.join(REPO, rel), "rb") as f, open(os.path.join(src, rel),
                                                                     "wb") as g:
                    g.write(f.read())
        subprocess.run([*pip, "install", src], check=True)
    return python


def measured(python: str, command: list[str], variant: str, workdir: str
             ) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``python *command`` (plain, or under ``otel-rl run --output WORKDIR/otel-VARIANT``
    with the variant's settings, `VARIANTS`) in `workdir`: the finished process, the CPU
    seconds of all its processes (`_cpu.TreeCpu`), the wall time until it ended."""
    bindir = os.path.dirname(python)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_"))}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    argv = [python, *command]
    if variant != "plain":
        argv = [*launcher(python, variant, os.path.join(workdir, f"otel-{variant}"), env),
                "python", *command]
    return TREE.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                    stdin=subprocess.DEVNULL, timeout=1800)


def launcher(python: str, variant: str, out: str, env: dict[str, str]) -> list[str]:
    """``otel-rl run --output OUT --`` as `variant` runs it, its settings added to `env`: the
    venv's installed otel_rl, or (a `REVISIONS` variant) that revision's, first on PYTHONPATH
    (so in every process of the program: they inherit it)."""
    if variant in REVISIONS:
        env["PYTHONPATH"] = REVISIONS[variant]
        return [python, "-m", "otel_rl", "run", "--output", out, "--"]
    env.update(VARIANTS[variant])
    return [os.path.join(os.path.dirname(python), "otel-rl"), "run", "--output", out, "--"]


def one_run(python: str, variant: str, steps: int, workdir: str) -> dict[str, Any]:
    command = ["-m", "sf_examples.train_gym_env", "--env=CartPole-v1", "--algo=APPO",
               "--num_workers=2", "--num_envs_per_worker=8", "--device=cpu",
               f"--train_for_env_steps={steps}", f"--experiment={variant}",
               f"--train_dir={workdir}/train", "--with_wandb=False", "--save_every_sec=100000",
               "--restart_behavior=overwrite"]
    done, cpu, wall = measured(python, command, variant, workdir)
    log = done.stdout + done.stderr
    match = COLLECTED.findall(log)
    checks = []
    if done.returncode != 0:
        checks.append(f"{variant}: exit status {done.returncode}: {log[-300:]!r}")
    if not match or int(match[-1][0]) < steps:
        checks.append(f"{variant}: did not collect {steps} steps")
    if variant == "otel_rl" and not os.path.exists(os.path.join(workdir, "otel-otel_rl",
                                                                "timers.json")):
        checks.append("otel_rl: no timers.json")
    return {"fps": float(match[-1][1]) if match else 0.0, "cpu_s": cpu, "wall_s": wall,
            "checks": checks}


def table(results: dict[str, Any], title: str, fps_label: str) -> str:
    """The plain / otel_rl table of a real run's results (shared by the framework benches)."""
    s = results["summary"]
    ratios = {"otel_rl": results["ratios"], **results.get("variant_ratios", {})}
    names = {"plain": "plain", "otel_rl": "under `otel-rl run` (auto)",
             "spans_off": "under `otel-rl run`, `spans=off`",
             "disabled": "under `otel-rl run`, `disabled`"}
    lines = [title, "", f"CPU counted by {results.get('cpu_method', 'RUSAGE_CHILDREN')}.",
             *side_by_side_lines(results), "",
             f"| | {fps_label} | CPU s, all processes | wall s |", "|---|---|---|---|"]
    for variant in s:
        cells = [f"{s[variant][k]['median']:.{d}f} ({s[variant][k]['min']:.{d}f}–"
                 f"{s[variant][k]['max']:.{d}f})" for k, d in (("fps", 0), ("cpu_s", 1),
                                                              ("wall_s", 1))]
        lines.append(f"| {names.get(variant, variant)} | " + " | ".join(cells) + " |")
    return "\n".join([*failed_checks_lines(results), *lines, *ratio_rows(ratios, KEYS),
                      *against_rows(results, KEYS)])


def side_by_side_lines(results: dict[str, Any]) -> list[str]:
    """The line a table gets when its rounds ran their variants at once."""
    if not results.get("side_by_side"):
        return []
    return ["", f"Each round's variants ran side by side, at the same time: {SIDE_BY_SIDE}."]


def render(results: dict[str, Any]) -> str:
    return table(results, f"Sample Factory 2.1.1 APPO CartPole, {results['steps']} env steps, "
                 f"2 rollout workers × 8 envs, {results['rounds']} interleaved rounds (median, "
                 "min–max)", "FPS (Sample Factory's)")


def interleaved(rounds: int, seed: int, run: Callable[[str], dict[str, Any]],
                rate: str = "FPS", others: Sequence[str] = (),
                key: str = "fps", side_by_side: bool = False) -> dict[str, list[dict[str, Any]]]:
    """`rounds` rounds of `run(variant)`: plain, otel_rl and `others` in a shuffled order each
    round (each run's `rate` printed from its row's `key`). `side_by_side`: a round's runs at
    once instead, started in that order (see `SIDE_BY_SIDE`)."""
    order = random.Random(seed)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in ("plain", "otel_rl", *others)}
    for i in range(rounds):
        variants = list(runs)
        order.shuffle(variants)
        if side_by_side:
            with ThreadPoolExecutor(len(variants)) as pool:
                rows = dict(zip(variants, pool.map(run, variants), strict=True))
        else:
            rows = {variant: run(variant) for variant in variants}
        for variant, row in rows.items():
            runs[variant].append(row)
            print(f"round {i + 1}/{rounds} {variant:9s} {rate} {row[key]:8.1f}  CPU "
                  f"{row['cpu_s']:6.1f} s  wall {row['wall_s']:5.1f} s", flush=True)
    return runs


def variants_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--also", default="", metavar="VARIANT,...",
                        help="more variants beside plain and otel_rl: "
                             + ", ".join(v for v in VARIANTS if v != "otel_rl"))
    parser.add_argument("--against", default="", metavar="REV,...",
                        help="more variants: otel_rl as of these git revisions (otel_rl@REV, "
                             "default settings), compared with this checkout's in the same "
                             "rounds")
    parser.add_argument("--side-by-side", action="store_true",
                        help="run each round's variants at the same time (" + SIDE_BY_SIDE + ")")


def also(value: str) -> list[str]:
    names = [v for v in value.split(",") if v]
    for name in names:
        if name not in VARIANTS or name == "otel_rl":
            sys.exit(f"--also: unknown variant {name!r}")
    return names


def against(value: str, python: str, into: str) -> list[str]:
    """The ``otel_rl@REV`` variants of ``--against`` (`REVISIONS`), each revision's otel_rl
    extracted into a folder under `into` and built for `python`."""
    names = []
    for rev in filter(None, value.split(",")):
        folder = os.path.join(into, f"otel_rl-{len(names)}")
        os.makedirs(folder)
        runs = built_package_at_revision(rev, folder, python)
        if runs is None:
            sys.exit(f"--against: git cannot give otel_rl at {rev!r}")
        print(f"otel_rl@{rev}: {runs}", flush=True)
        REVISIONS[f"otel_rl@{rev}"] = folder
        names.append(f"otel_rl@{rev}")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60000)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 30,000 steps")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--seed", type=int, default=0, help="of the variant order per round")
    variants_argument(parser)
    args = parser.parse_args()
    rounds, steps = (3, 30000) if args.quick else (args.rounds, args.steps)
    others = also(args.also)
    python = venv_python()
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-sf-") as workdir:
        others += against(args.against, python, workdir)
        runs = interleaved(rounds, args.seed,
                           lambda variant: one_run(python, variant, steps, workdir),
                           others=others, side_by_side=args.side_by_side)
    results = {"rounds": rounds, "steps": steps, "cpu_method": TREE.method, "runs": runs,
               "side_by_side": args.side_by_side,
               **summarize_rounds(runs, KEYS)}
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
