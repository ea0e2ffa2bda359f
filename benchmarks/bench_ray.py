"""Ray: added latency per ``.remote()`` call, and the cost of a timed block in a Ray worker.

Run with a Python that has Ray 2.60 (the Ray venv of ``scripts/setup-frameworks.sh``):
``python benchmarks/bench_ray.py [--quick] [--rounds N] [--calls N] [--json FILE]``.
One driver, otel_rl configured
(``spans="all"``, files into a temporary folder), a local Ray instance with 2 CPUs. Variants
are interleaved: every round runs each once, in a shuffled order.

1. Submission latency, inside a timed block on the driver: batches of ``N`` calls of a no-op
   task (``f.remote()``), of a no-op task with one argument (``g.remote(1)``) and of a no-op
   actor method (``a.m.remote()``), timed around the submissions only (the results are
   fetched outside the timing), in wall time, in this process's CPU time and in the
   submitting thread's CPU time (where otel_rl's part runs: the steadiest on a shared
   machine). ``off``: Ray's own methods (otel_rl's submit patches taken out); ``on``:
   patched, each call carrying the caller's context. Each round runs off and on A-B-B-A
   (a drift in the machine's load weighs on both). Reported per measure: medians of rounds,
   the added µs per call (median of the per-round differences) and the per-round ratio
   on/off, each with a 95 % bootstrap interval of the median (`_stats`). Also otel_rl's own
   part alone: the submit wrapper around a no-op stand-in for Ray's ``_remote`` minus the
   stand-in called directly (CPU µs per call), and its share of a plain submission's
   thread CPU. And the round trip: calls made one at a time and waited for
   (``ray.get(f.remote())``, ``N / 4`` a batch), the latency a caller sees with the
   worker's side of the call (taking the carrier off, its caller's stack) included.
2. Per-block cost in a worker: 20,000 empty 1-deep ``with timer("step")`` blocks (after
   2,000 of warm-up), CPU time per block of the thread and of the process, in a Ray actor of
   the run and in a ``fork``ed ``multiprocessing`` worker of the same run. Reported: µs per
   block and the per-round ratio with its interval.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import ray
from _stats import fmt_ci, median_ci

import otel_rl
from otel_rl.timers import hierarchical_timer as timer

BLOCKS = 20_000


def _blocks() -> tuple[float, float]:
    """CPU seconds per timed block: of this thread (the block itself), and of the process
    (otel_rl's background threads too). A short warm-up first (a forked worker has just
    started: its first blocks meet cold caches and its threads' start-up)."""
    for _ in range(BLOCKS // 10):
        with timer("warm_up"):
            pass
    start, own = time.process_time(), time.thread_time()
    for _ in range(BLOCKS):
        with timer("step"):
            pass
    return (time.thread_time() - own) / BLOCKS, (time.process_time() - start) / BLOCKS


@ray.remote
def noop() -> None:
    return None


@ray.remote
def one(x: int) -> None:
    return None


@ray.remote
class Worker:
    def noop(self) -> None:
        return None

    def blocks(self) -> tuple[float, float]:
        return _blocks()


def _forked(queue: Any) -> None:
    queue.put(_blocks())


def _submit(calls: int, target: Any, with_arg: bool) -> tuple[float, float, float]:
    """Seconds per submission: wall, CPU of this process (every thread: Ray's own submit
    threads included) and CPU of the submitting thread (where otel_rl's part runs)."""
    start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    if with_arg:
        refs = [target.remote(1) for _ in range(calls)]
    else:
        refs = [target.remote() for _ in range(calls)]
    elapsed = time.perf_counter() - start
    used, thread = time.process_time() - cpu, time.thread_time() - own
    ray.get(refs)
    return elapsed / calls, used / calls, thread / calls


def _round_trips(calls: int, target: Any) -> tuple[float, float, float]:
    """Seconds per call made one at a time and waited for (``ray.get(f.remote())``: the
    latency a caller sees, the worker's side included): wall, process CPU, thread CPU."""
    start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(calls):
        ray.get(target.remote())
    elapsed = time.perf_counter() - start
    used, thread = time.process_time() - cpu, time.thread_time() - own
    return elapsed / calls, used / calls, thread / calls


#: The measures of a submission, in `_submit`'s order.
METRICS = ("wall", "cpu", "thread")
STEPS = {"task": "`f.remote()`", "arg": "`g.remote(1)`", "actor": "`a.m.remote()`",
         "task rtt": "`ray.get(f.remote())`", "actor rtt": "`ray.get(a.m.remote())`"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200, help="per batch (4 batches a round)")
    parser.add_argument("--json")
    args = parser.parse_args()
    rounds, calls = (3, 100) if args.quick else (args.rounds, args.calls)
    out = tempfile.mkdtemp(prefix="bench-ray-")
    otel_rl.configure(spans="all", output_dir=out)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from otel_rl._internal.ray_support import calls as ray_calls

    patched = {key: owner._remote for key, owner in _owners().items()}
    originals = ray_calls._original

    def use(on: bool) -> None:
        import ray._common.signature as signature

        for key, owner in _owners().items():
            owner._remote = patched[key] if on else originals[key]
        signature.flatten_args = (ray_calls._patched_flatten_args if on
                                  else originals["flatten_args"])

    actor = Worker.remote()
    ray.get(actor.noop.remote())
    results: dict[str, list[float]] = {"block ray": [], "block fork": [],
                                       "block ray cpu": [], "block fork cpu": []}
    for step in STEPS:
        for variant in ("off", "on"):
            for metric in METRICS:
                results[f"{step} {variant} {metric}"] = []
    context = multiprocessing.get_context("fork")
    with timer("bench"):
        for _ in range(2):  # warm-up: worker processes started, functions exported
            ray.get([noop.remote() for _ in range(20)])
            ray.get([one.remote(1) for _ in range(20)])
            ray.get([actor.noop.remote() for _ in range(20)])
        for _ in range(rounds):
            steps = [*STEPS, "blocks"]
            random.shuffle(steps)
            for step in steps:
                if step == "blocks":
                    thread, cpu = ray.get(actor.blocks.remote())
                    results["block ray"].append(thread)
                    results["block ray cpu"].append(cpu)
                    queue = context.Queue()
                    worker = context.Process(target=_forked, args=(queue,))
                    worker.start()
                    thread, cpu = queue.get()
                    results["block fork"].append(thread)
                    results["block fork cpu"].append(cpu)
                    worker.join()
                    continue
                target = {"task": noop, "arg": one, "actor": actor.noop, "task rtt": noop,
                          "actor rtt": actor.noop}[step]
                # A-B-B-A: a drift in the machine's load within the round weighs on both.
                first = random.random() < 0.5
                sums = {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]}
                for on in (first, not first, not first, first):
                    use(on)
                    if step.endswith("rtt"):
                        values = _round_trips(max(calls // 4, 1), target)
                    else:
                        values = _submit(calls, target, step == "arg")
                    for i, value in enumerate(values):
                        sums[on][i] += value / 2
                use(True)
                for on, values in sums.items():
                    for metric, value in zip(METRICS, values, strict=True):
                        results[f"{step} {'on' if on else 'off'} {metric}"].append(value)
        own = _own_part(rounds, actor)
    ray.shutdown()
    otel_rl.shutdown()
    lines, summary = _render(results, own)
    print(f"rounds={rounds} calls/batch={calls} (A-B-B-A, 4 batches a round) blocks={BLOCKS} "
          f"python={sys.version.split()[0]} ray={ray.__version__}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "samples": results, "own_part_us": own}, f,
                      indent=2)
    return 0


def _render(results: dict[str, list[float]],
            own: dict[str, list[float]]) -> tuple[list[str], dict[str, Any]]:
    """The tables (medians of rounds; [95 % bootstrap interval of the median]) and the same
    figures as data."""
    summary: dict[str, Any] = {}
    lines = ["| submission | measure | off (µs) | on (µs) | added µs per call [95 % CI] | "
             "ratio on/off, per round [95 % CI] |", "|---|---|---|---|---|---|"]
    for step, label in STEPS.items():
        for metric in METRICS:
            off = results[f"{step} off {metric}"]
            on = results[f"{step} on {metric}"]
            added = [(a - b) * 1e6 for a, b in zip(on, off, strict=True)]
            ratios = [a / b for a, b in zip(on, off, strict=True) if b]
            summary[f"{step} {metric}"] = {
                "off_us": statistics.median(off) * 1e6, "on_us": statistics.median(on) * 1e6,
                "added_us": median_ci(added), "ratio": median_ci(ratios)}
            name = {"wall": "wall", "cpu": "CPU, process",
                    "thread": "CPU, submitting thread"}[metric]
            lines.append(f"| {label} | {name} | {statistics.median(off) * 1e6:.1f} | "
                         f"{statistics.median(on) * 1e6:.1f} | {fmt_ci(added, 2)} | "
                         f"{fmt_ci(ratios)} |")
    lines += ["", "| otel_rl's own part per call | CPU µs [95 % CI] | share of a plain "
              "submission's thread CPU, per round [95 % CI] |", "|---|---|---|"]
    for name, values in own.items():
        plain = results[f"{'actor' if name == 'actor method' else 'task'} off thread"]
        shares = [v / (p * 1e6) for v, p in zip(values, plain, strict=True) if p]
        summary[f"own {name}"] = {"us": median_ci(values), "share": median_ci(shares)}
        lines.append(f"| {name} | {fmt_ci(values, 2)} | {fmt_ci(shares, 4)} |")
    lines += ["", "| CPU per timed block in a worker | forked (µs) | Ray actor (µs) | "
              "ratio Ray/forked, per round [95 % CI] |", "|---|---|---|---|"]
    for key, name in (("", "thread (the block itself)"), (" cpu", "process (with otel_rl's "
                                                             "threads)")):
        ray_block, fork_block = results[f"block ray{key}"], results[f"block fork{key}"]
        ratios = [a / b for a, b in zip(ray_block, fork_block, strict=True) if b]
        summary[f"block{key}"] = {"ray_us": statistics.median(ray_block) * 1e6,
                                  "fork_us": statistics.median(fork_block) * 1e6,
                                  "ratio": median_ci(ratios)}
        lines.append(f"| `with timer(...)`, 1 deep, CPU of the {name} | "
                     f"{statistics.median(fork_block) * 1e6:.2f} | "
                     f"{statistics.median(ray_block) * 1e6:.2f} | {fmt_ci(ratios)} |")
    return lines, summary


def _own_part(rounds: int, actor: Any) -> dict[str, list[float]]:
    """CPU µs (this thread's) per call of otel_rl's submit wrapper alone (task and actor
    method): around a no-op stand-in for Ray's ``_remote``, minus the stand-in itself; and
    of the patched ``flatten_args`` minus Ray's own (every submission runs both);
    interleaved rounds."""
    from otel_rl._internal.ray_support import calls as ray_calls

    def stand_in(self: Any, args: Any = None, kwargs: Any = None, *rest: Any,
                 **options: Any) -> None:
        return None

    saved = dict(ray_calls._original)
    ray_calls._original.update(task=stand_in, method=stand_in)
    try:
        wrapped = {"task": (ray_calls._submit_wrapper("task"), noop),
                   "actor method": (ray_calls._submit_wrapper("method"), actor.noop)}
    finally:
        ray_calls._original.clear()
        ray_calls._original.update(saved)
    n = 20_000

    def per_call(function: Any, target: Any) -> float:
        start = time.thread_time()
        for _ in range(n):
            function(target, None, None)
        return (time.thread_time() - start) / n * 1e6

    # Ray's argument flattening, patched for the actor-creation argument, runs on every
    # submission too: for a no-argument call, `flatten_args([], [], {})` as Ray calls it.
    flatten = {False: ray_calls._original["flatten_args"], True: ray_calls._patched_flatten_args}

    def per_flatten(function: Any) -> float:
        start = time.thread_time()
        for _ in range(n):
            function([], [], {})
        return (time.thread_time() - start) / n * 1e6

    own: dict[str, list[float]] = {name: [] for name in (*wrapped, "flatten_args")}
    for _ in range(rounds):
        for name in random.sample(list(own), len(own)):
            if name == "flatten_args":
                order = random.sample([False, True], 2)
                timing = {on: per_flatten(flatten[on]) for on in order}
            else:
                function, target = wrapped[name]
                pair = [(False, stand_in), (True, function)]
                random.shuffle(pair)
                timing = {is_wrapped: per_call(f, target) for is_wrapped, f in pair}
            own[name].append(timing[True] - timing[False])
    return own


def _owners() -> dict[str, Any]:
    import ray.actor
    import ray.remote_function

    return {"task": ray.remote_function.RemoteFunction, "method": ray.actor.ActorMethod,
            "actor": ray.actor.ActorClass}


if __name__ == "__main__":
    sys.exit(main())
