"""Ray: what a worker process costs to start, by the way it joins the run.

Run with a Python that has Ray 2.60 (the Ray venv of ``scripts/setup-frameworks.sh``):
``python benchmarks/bench_ray_join.py [--quick] [--rounds N] [--json FILE]``.
Each run is a fresh driver process (this interpreter) starting a local Ray instance with 2
CPUs and 2 actors, and each actor's first call returns its process's CPU seconds so far: the
worker's start-up (Ray's, and otel_rl's where it joins; a worker Ray starts through its
``setup_worker.py`` keeps its pid, so that share is counted too). Variants, interleaved in a
shuffled order every round:

- ``plain``: no otel_rl, no runtime_env;
- ``plain, runtime_env``: no otel_rl, the job given ``{"env_vars": {"X": "1"}}`` (what any job
  runtime_env costs a worker in Ray itself);
- ``otel_rl``: ``otel_rl.configure()`` first, no runtime_env: the run's hook in the raylet's
  environment (docs/DESIGN.md, "The hook in raylet's environment");
- ``otel_rl, runtime_env``: the same with the job's runtime_env as above, so the hook goes the
  job's way (in its runtime_env), as before the twenty-fifth session for every job;
- ``plain, argument`` and ``otel_rl, argument``: as ``plain`` and ``otel_rl``, the actors
  created with an argument, as every framework's are (RLlib's env runners and Learner get
  their config). The first argument a worker process deserializes makes Ray build the job's
  serialization context, which imports numpy, pyarrow, pydantic and starlette (~0.1 s of
  CPU on a calm machine). A no-argument actor created under otel_rl still has one (its
  caller's context travels in a keyword argument), so ``otel_rl`` and ``otel_rl, runtime_env``
  charge that to otel_rl, where ``otel_rl, argument`` shows the join alone.

Reported: the median per actor (min-max over rounds, each run's two actors averaged) and the
median of the per-round differences against its baseline (``plain``; ``plain, argument`` for
``otel_rl, argument``), with a 95 % bootstrap interval.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from _report import failed_checks_lines, finish
from _stats import fmt_ci

#: Each variant and the variant its difference is taken against.
VARIANTS = {"plain": None, "plain, runtime_env": "plain", "otel_rl": "plain",
            "otel_rl, runtime_env": "plain", "plain, argument": None,
            "otel_rl, argument": "plain, argument"}

DRIVER = """
import json, os, sys, time
variant, out = sys.argv[1], sys.argv[2]
if variant.startswith("otel_rl"):
    import otel_rl
    otel_rl.configure(output_dir=out)
import ray

@ray.remote
class Worker:
    def __init__(self, config=None):
        self.config = config

    def cpu(self):
        return time.process_time()

env = {"env_vars": {"X": "1"}} if variant.endswith("runtime_env") else None
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
args = ({"lr": 0.001},) if variant.endswith("argument") else ()
workers = [Worker.remote(*args) for _ in range(2)]
print("CPU " + json.dumps(ray.get([w.cpu.remote() for w in workers])), flush=True)
ray.shutdown()
"""


def one_run(variant: str, checks: list[str]) -> float:
    """The mean CPU seconds of the run's two actors at their first call (a failed run: NaN,
    and a line in `checks`). Under otel_rl the run must also have written its timers.json."""
    with tempfile.TemporaryDirectory(prefix="bench-ray-join-") as out:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAY_"))}
        done = subprocess.run([sys.executable, "-c", DRIVER, variant, out], env=env,
                              capture_output=True, text=True, timeout=600, cwd=out)
        wrote = os.path.exists(os.path.join(out, "timers.json"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("CPU ")]
    if done.returncode != 0 or not lines:
        checks.append(f"{variant}: exit status {done.returncode}: {done.stderr[-300:]!r}")
        return float("nan")
    if variant.startswith("otel_rl") and not wrote:
        checks.append(f"{variant}: no timers.json")
    return statistics.fmean(json.loads(lines[-1][4:]))


def render(data: dict[str, Any]) -> str:
    results: dict[str, list[float]] = data["cpu_s"]
    lines = [*failed_checks_lines(data),
             f"Ray worker start-up by the way it joins: {data['rounds']} rounds, 2 actors a "
             "run, each actor's process CPU at its first call (median, min–max; difference "
             "against its baseline: median of the per-round differences [95 % CI])", "",
             "| variant | CPU s per worker | − baseline, s |", "|---|---|---|"]
    for variant in VARIANTS:
        values = results[variant]
        cell = ""
        baseline = VARIANTS[variant]
        if baseline is not None:
            diffs = [a - b for a, b in zip(values, results[baseline], strict=True)]
            cell = fmt_ci(diffs)
        lines.append(f"| {variant} | {statistics.median(values):.3f} ({min(values):.3f}–"
                     f"{max(values):.3f}) | {cell} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0, help="of the variant order per round")
    parser.add_argument("--json")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    order = random.Random(args.seed)
    results: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    checks: dict[str, list[str]] = {variant: [] for variant in VARIANTS}
    for n in range(rounds):
        variants = list(VARIANTS)
        order.shuffle(variants)
        for variant in variants:
            results[variant].append(one_run(variant, checks[variant]))
        print(f"  round {n + 1}/{rounds} done ({' | '.join(variants)})", file=sys.stderr)
    data: dict[str, Any] = {"rounds": rounds, "cpu_s": results,
                            "summary": {v: {"checks": checks[v]} for v in VARIANTS}}
    return finish(data, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
