"""What ML-Agents' per-step timer exchange costs with otel_rl's timers and with ML-Agents' own.

    python benchmarks/bench_step_exchange.py [--rounds 15] [--steps 20000] [--quick | --smoke]
                                             [--json FILE]

ML-Agents' `SubprocessEnvManager` does this every env step (`mlagents.trainers.
subprocess_env_manager`): the env worker times the step, sends its stack's root to the parent
(``get_timer_root()``, pickled through a multiprocessing queue) and calls ``reset_timers()``;
the parent unpickles it and merges it under ``workers`` (``merge(root,
root_name="worker_root", is_parallel=True)``). Here both sides run in ONE process (the worker
side on a `TimerStack` of its own, as the worker's thread stack would be), per step:

    with t("UnityEnvironment.step", worker):          # the worker
        with t("TimedSimpleEnvironment.step", worker):
            pass
    data = pickle.dumps(get_timer_root(worker)); reset_timers(worker)
    root = pickle.loads(data)                         # the parent
    with t("workers") as node:
        node.merge(root, root_name="worker_root", is_parallel=True)

The anchor is `mlagents_envs.timers`; otel_rl's module runs configured as under ``otel-rl run``
(defaults, files in a temporary folder). Each round runs both in a shuffled order; process CPU
per step (all threads: otel_rl's flush thread included). Check: each variant's tree holds every
step's worker blocks under ``workers/worker_root``.
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import failed_checks_lines, finish
from _stats import fmt_ci


def run_steps(t: ModuleType, steps: int) -> float:
    """CPU seconds of `steps` exchanges with timers module `t`."""
    worker = t.TimerStack()
    timer = t.hierarchical_timer
    started = time.process_time()
    for _ in range(steps):
        with timer("UnityEnvironment.step", worker):
            with timer("TimedSimpleEnvironment.step", worker):
                pass
        data = pickle.dumps(t.get_timer_root(worker))
        t.reset_timers(worker)
        root = pickle.loads(data)
        with timer("workers") as node:
            node.merge(root, root_name="worker_root", is_parallel=True)
    return time.process_time() - started


def merged_steps(t: ModuleType) -> int:
    node = t.get_timer_tree()["children"]["workers"]["children"]["worker_root"]
    return int(node["children"]["UnityEnvironment.step"]["count"])


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [*failed_checks_lines(results),
             f"ML-Agents' per-step timer exchange (worker: 2 blocks, root pickled, reset; "
             f"parent: unpickle, merge under `workers`), {results['steps']:,} steps × "
             f"{results['rounds']} interleaved rounds, one process", "",
             "| | CPU µs per step, median (min–max) | × ML-Agents |", "|---|---|---|"]
    for name, label in (("mlagents", "anchor: ML-Agents `mlagents_envs.timers`"),
                        ("otel_rl", "otel_rl (as under `otel-rl run`)")):
        row = s[name]
        lines.append(f"| {label} | {row['median']:.2f} ({row['min']:.2f}–{row['max']:.2f}) | "
                     f"{row['median'] / s['mlagents']['median']:.3f}× |")
    lines.append(f"\nPer-round ratio otel_rl / ML-Agents, median [95 % CI]: "
                 f"{fmt_ci(results['ratios'])}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="5 rounds of 5,000 steps")
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 500 steps")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rounds, steps = ((2, 500) if args.smoke else (5, 5_000) if args.quick
                     else (args.rounds, args.steps))

    from mlagents_envs import timers as mlagents

    import otel_rl
    from otel_rl import timers as ours

    otel_rl.configure(output_dir=tempfile.mkdtemp(prefix="bench-step-exchange-"))
    modules = {"mlagents": mlagents, "otel_rl": ours}
    for module in modules.values():  # warm-up: first nodes made, code paths taken
        run_steps(module, 200)
    per_step: dict[str, list[float]] = {name: [] for name in modules}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(modules)
        rng.shuffle(order)
        for name in order:
            per_step[name].append(run_steps(modules[name], steps) / steps * 1e6)
    expected = rounds * steps + 200
    merged = {name: merged_steps(module) for name, module in modules.items()}
    otel_rl.shutdown()
    summary = {name: {"median": statistics.median(v), "min": min(v), "max": max(v),
                      "checks": [f"{name}: {merged[name]} steps merged under workers, expected "
                                 f"{expected}"] if merged[name] != expected else []}
               for name, v in per_step.items()}
    ratios = [o / m for o, m in zip(per_step["otel_rl"], per_step["mlagents"], strict=True)]
    results = {"rounds": rounds, "steps": steps, "per_step_us": per_step, "summary": summary,
               "ratios": ratios}
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
