"""Ray: added latency per ``.remote()`` call, and the cost of a timed block in a Ray worker.

Run with a Python that has Ray 2.60 (the Ray venv of ``scripts/setup-frameworks.sh``):
``python benchmarks/bench_ray.py [--quick] [--json FILE]``. One driver, otel_rl configured
(``spans="all"``, files into a temporary folder), a local Ray instance with 2 CPUs. Variants
are interleaved: every round runs each once, in a shuffled order.

1. Submission latency, inside a timed block on the driver: ``N`` calls of a no-op task
   (``f.remote()``), of a no-op task with one argument (``g.remote(1)``) and of a no-op
   actor method (``a.m.remote()``), timed around the
   submissions only (the results are fetched outside the timing), in wall time and in this
   process's CPU time (steadier on a shared machine). ``off``: Ray's own methods
   (otel_rl's submit patches taken out); ``on``: patched, each call carrying the caller's
   context. Reported: µs per call (median of rounds) and the ratio on/off.
   Also the spread of the per-round ratios (each round's on/off pair), and otel_rl's own part
   alone, the steadiest figure on a loaded machine: the submit wrapper around a no-op
   stand-in for Ray's ``_remote`` minus the stand-in called directly (CPU µs per call).
2. Per-block cost in a worker: 20,000 empty 1-deep ``with timer("step")`` blocks, CPU time
   (``time.process_time``) per block, in a Ray actor of the run and in a ``fork``ed
   ``multiprocessing`` worker of the same run. Reported: µs per block and the ratio.
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

import otel_rl
from otel_rl.timers import hierarchical_timer as timer

BLOCKS = 20_000


def _blocks() -> float:
    start = time.process_time()
    for _ in range(BLOCKS):
        with timer("step"):
            pass
    return (time.process_time() - start) / BLOCKS


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

    def blocks(self) -> float:
        return _blocks()


def _forked(queue: Any) -> None:
    queue.put(_blocks())


def _submit(calls: int, target: Any, with_arg: bool) -> tuple[float, float]:
    """Wall and CPU (this process, every thread: Ray's own submit threads included) seconds
    per submission."""
    start, cpu = time.perf_counter(), time.process_time()
    if with_arg:
        refs = [target.remote(1) for _ in range(calls)]
    else:
        refs = [target.remote() for _ in range(calls)]
    elapsed, used = time.perf_counter() - start, time.process_time() - cpu
    ray.get(refs)
    return elapsed / calls, used / calls


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    rounds, calls = (3, 100) if args.quick else (9, 400)
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
    results: dict[str, list[float]] = {k: [] for k in (
        "task off", "task on", "arg off", "arg on", "actor off", "actor on", "block ray",
        "block fork", "task off cpu", "task on cpu", "arg off cpu", "arg on cpu",
        "actor off cpu", "actor on cpu")}
    context = multiprocessing.get_context("fork")
    with timer("bench"):
        for _ in range(2):  # warm-up: worker processes started, functions exported
            ray.get([noop.remote() for _ in range(20)])
        for _ in range(rounds):
            steps = ["task", "arg", "actor", "blocks"]
            random.shuffle(steps)
            for step in steps:
                if step == "blocks":
                    results["block ray"].append(ray.get(actor.blocks.remote()))
                    queue = context.Queue()
                    worker = context.Process(target=_forked, args=(queue,))
                    worker.start()
                    results["block fork"].append(queue.get())
                    worker.join()
                    continue
                target = {"task": noop, "arg": one, "actor": actor.noop}[step]
                for on in random.sample([False, True], 2):
                    use(on)
                    wall, cpu = _submit(calls, target, step == "arg")
                    results[f"{step} {'on' if on else 'off'}"].append(wall)
                    results[f"{step} {'on' if on else 'off'} cpu"].append(cpu)
                use(True)
        own = _own_part(rounds, actor)
    ray.shutdown()
    otel_rl.shutdown()
    med = {k: statistics.median(v) * 1e6 for k, v in results.items()}
    lines = [
        "| measure | off / fork (µs) | on / Ray (µs) | ratio | added (µs) |",
        "|---|---|---|---|---|",
    ]
    for name, off, on in (("`f.remote()` task submission", "task off", "task on"),
                          ("`g.remote(1)` task submission", "arg off", "arg on"),
                          ("`a.m.remote()` actor call submission", "actor off", "actor on"),
                          ("`f.remote()` submission, CPU", "task off cpu", "task on cpu"),
                          ("`g.remote(1)` submission, CPU", "arg off cpu", "arg on cpu"),
                          ("`a.m.remote()` submission, CPU", "actor off cpu", "actor on cpu"),
                          ("CPU per timed block, worker", "block fork", "block ray")):
        lines.append(f"| {name} | {med[off]:.1f} | {med[on]:.1f} | {med[on] / med[off]:.3f}x "
                     f"| {med[on] - med[off]:+.1f} |")
    lines.append("")
    lines.append("| per-round ratio on/off | median | min | max |")
    lines.append("|---|---|---|---|")
    spreads: dict[str, list[float]] = {}
    for step in ("task", "arg", "actor"):
        for kind in ("", " cpu"):
            ratios = [on / off for on, off in zip(results[f"{step} on{kind}"],
                                                  results[f"{step} off{kind}"], strict=True)]
            spreads[f"{step}{kind}"] = ratios
            lines.append(f"| {step}{kind or ' wall'} | {statistics.median(ratios):.3f} | "
                         f"{min(ratios):.3f} | {max(ratios):.3f} |")
    lines.append("")
    lines.append("| otel_rl's own part per call (CPU) | median (µs) | min | max |")
    lines.append("|---|---|---|---|")
    for name, values in own.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | "
                     f"{max(values):.2f} |")
    print(f"rounds={rounds} calls/round={calls} blocks={BLOCKS} python={sys.version.split()[0]} "
          f"ray={ray.__version__}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians_us": med, "samples": results, "round_ratios": spreads,
                       "own_part_us": own}, f, indent=2)
    return 0


def _own_part(rounds: int, actor: Any) -> dict[str, list[float]]:
    """CPU µs per call of otel_rl's submit wrapper alone (task and actor method): around a
    no-op stand-in for Ray's ``_remote``, minus the stand-in itself; interleaved rounds."""
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
        start = time.process_time()
        for _ in range(n):
            function(target, None, None)
        return (time.process_time() - start) / n * 1e6

    own: dict[str, list[float]] = {name: [] for name in wrapped}
    for _ in range(rounds):
        for name in random.sample(list(wrapped), len(wrapped)):
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
