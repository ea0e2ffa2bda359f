"""Where the CPU of the real RLlib run goes, plain vs under ``otel-rl run``: per process and
per otel_rl component, fixed cost split from per-iteration cost.

    python benchmarks/profile_rllib.py [--iterations 5,20] [--rounds 1] [--rate 0|100]
                                       [--variants plain,otel_rl,spans_off,disabled]
                                       [--json FILE]

Runs ``tests/frameworks/rllib_train.py`` (RLlib 2.60 PPO CartPole, new API stack, 2 env
runners, a Learner actor; the venv of ``scripts/setup-frameworks.sh ray``) with this
checkout first on ``PYTHONPATH`` (``--before DIR``: also a variant with otel_rl from DIR) (nothing is installed into the venv; Ray's workers inherit
it from raylet, which the driver starts). Per run, every process of the tree (driver, raylet,
GCS, Ray's agents, every Ray worker: env runners, Learner, otel_rl's collector, idle pooled
workers) is polled for CPU from ``/proc`` (`profile_sf.ProcWatch`), grouped by role (a Ray
worker by its process title, ``ray::<Class>...``). With ``--rate`` > 0 each run is also under
``py-spy record --subprocesses`` and the otel_rl share of each process is split by component
(`profile_sf.parse_raw`). Two lengths of training: the difference between them, divided by
the difference in iterations, is the per-iteration CPU; the rest is fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from typing import Any

from bench_sample_factory import VARIANTS
from profile_sf import ProcWatch, parse_raw

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(REPO, "tests", "frameworks", "rllib_train.py")
VENV = os.path.expanduser("~/.cache/otel-rl/venvs/ray-2.60.0-client-torch-2.5.1-py3.11")


def role(cmd: str) -> str:
    if "otel_rl run" in cmd or "otel-rl run" in cmd:
        return "otel-rl CLI"
    if "rllib_train.py" in cmd:
        return "driver"
    for name in ("gcs_server", "raylet", "dashboard_agent", "runtime_env/agent", "log_monitor",
                 "monitor.py", "dashboard.py"):
        if name in cmd:
            return name
    m = re.match(r"ray::([A-Za-z_]+)", cmd)
    if m:
        name = m.group(1)
        if "Collector" in name or name == "Collector":
            return "otel_rl collector"
        return "ray::" + name
    if "default_worker.py" in cmd:
        return "ray::worker (starting)"
    return "other: " + cmd[:40]


def one_run(variant: str, iterations: int, rate: int, workdir: str, src: str = REPO
            ) -> dict[str, Any]:
    python = os.path.join(VENV, "bin", "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_"))}
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONPATH"] = src
    env.update(VARIANTS.get(variant, {}))  # spans_off, disabled
    results = os.path.join(workdir, f"{variant}-{iterations}.json")
    out = os.path.join(workdir, f"otel-{variant}")
    shutil.rmtree(out, ignore_errors=True)
    argv = [python, SCRIPT, results, str(iterations)]
    if variant != "plain":
        argv = [python, "-m", "otel_rl", "run", "--output", out, "--", "python", *argv[1:]]
    raw = os.path.join(workdir, f"{variant}-{iterations}.raw")
    if rate:
        spy = shutil.which("py-spy") or "py-spy"
        argv = [spy, "record", "--subprocesses", "--nonblocking", "-r", str(rate), "-f", "raw",
                "-o", raw, "--", *argv]
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    watch = ProcWatch(proc.pid)
    start = time.perf_counter()
    log = proc.communicate(timeout=1800)[0].decode(errors="replace")
    wall = time.perf_counter() - start
    watch.stop()
    checks = []
    if proc.returncode != 0 or not os.path.exists(results):
        checks.append(f"{variant}: exit {proc.returncode}: {log[-400:]!r}")
    train = {}
    if os.path.exists(results):
        with open(results, encoding="utf-8") as f:
            data = json.load(f)
        end, built = data["cpu_s"], data["cpu_built_s"]
        train = {"driver": end["driver"] - built["driver"],
                 "env_runners": sum(end["env_runners"]) - sum(built["env_runners"]),
                 "learners": sum(end["learners"]) - sum(built["learners"])}
    samples = parse_raw(raw) if rate and os.path.exists(raw) else {}
    by_role: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    functions: dict[str, float] = defaultdict(float)
    for pid, cpu in watch.cpu.items():
        cmd = watch.cmd.get(pid, "")
        if (rate and pid == proc.pid) or "py-spy" in cmd.split(" ", 1)[0]:
            continue
        name = role(cmd)
        counts[name] += 1
        by_role[name]["cpu_s"] += cpu
        sampled = samples.get(pid)
        if sampled and sampled["samples"]:
            for where, n in sampled["functions"].items():
                functions[f"{name}: {where}"] += cpu * n / sampled["samples"]
            for owner, n in sampled["components"].items():
                by_role[name][owner] += cpu * n / sampled["samples"]
    return {"variant": variant, "iterations": iterations, "wall_s": wall, "checks": checks,
            "train_cpu_s": train, "processes": dict(counts),
            "roles": {k: dict(v) for k, v in by_role.items()},
            "cpu_s": sum(v["cpu_s"] for v in by_role.values()),
            "functions": dict(sorted(functions.items(), key=lambda kv: -kv[1])[:30]),
            "load_before": os.getloadavg()[0]}


def render(runs: list[dict[str, Any]]) -> str:
    lines = []
    for run in runs:
        lines.append(f"\n== {run['variant']} {run['iterations']} it: all {run['cpu_s']:.2f} s"
                     f" wall {run['wall_s']:.1f} s load {run['load_before']:.1f}"
                     f" training {run['train_cpu_s']} {run['checks'] or ''}")
        for name, row in sorted(run["roles"].items(), key=lambda kv: -kv[1]["cpu_s"]):
            parts = ", ".join(f"{k.removeprefix('otel_rl: ')} {v:.2f}"
                              for k, v in sorted(row.items(), key=lambda kv: -kv[1])
                              if k.startswith("otel_rl") and v >= 0.01)
            lines.append(f"  {name} x{run['processes'][name]}: {row['cpu_s']:.2f} {parts}")
        for where, s in run["functions"].items():
            if s >= 0.02:
                lines.append(f"    {s:.2f} {where}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", default="5,20")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rate", type=int, default=0)
    parser.add_argument("--variants", default="plain,otel_rl")
    parser.add_argument("--json")
    parser.add_argument("--keep", help="keep the runs' files (py-spy's raw stacks) here")
    parser.add_argument("--before", metavar="DIR",
                        help="also a variant 'before': otel_rl from DIR (git archive REV otel_rl)")
    args = parser.parse_args()
    lengths = [int(n) for n in args.iterations.split(",")]
    variants = args.variants.split(",") + (["before"] if args.before else [])
    runs = []
    with tempfile.TemporaryDirectory(prefix="otel-rl-profile-rllib-") as tmp:
        workdir = args.keep or tmp
        os.makedirs(workdir, exist_ok=True)
        for _ in range(args.rounds):
            order = [(v, n) for n in lengths for v in variants]
            random.shuffle(order)
            for variant, n in order:
                run = one_run(variant, n, args.rate, workdir,
                              args.before if variant == "before" else REPO)
                runs.append(run)
                print(render([run]), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=1)
    # Training CPU per process (RLlib's own processes), medians per (variant, length).
    for n in lengths:
        for variant in variants:
            rows = [r["train_cpu_s"] for r in runs
                    if r["variant"] == variant and r["iterations"] == n and r["train_cpu_s"]]
            if rows:
                parts = ", ".join(
                    f"{k} {statistics.median(row[k] for row in rows):.3f}"
                    f" ({min(row[k] for row in rows):.3f}-{max(row[k] for row in rows):.3f})"
                    for k in rows[0])
                print(f"{variant} {n} it, training CPU s: {parts}")
    # Per iteration vs fixed, medians per (variant, length).
    for variant in variants:
        med = {n: statistics.median(r["cpu_s"] for r in runs
                                    if r["variant"] == variant and r["iterations"] == n)
               for n in lengths}
        if len(lengths) == 2:
            a, b = lengths
            per = (med[b] - med[a]) / (b - a)
            print(f"{variant}: per iteration {per:.3f} s, fixed {med[a] - a * per:.2f} s"
                  f" (all processes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
