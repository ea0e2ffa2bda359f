"""What the ``.remote()`` submission gap is made of: one piece added at a time.

Run with the Ray venv's Python (``scripts/setup-frameworks.sh ray``):
``python benchmarks/bench_ray_submit.py [--rounds 10] [--calls 2000] [--json FILE]``.

One driver, otel_rl configured (``spans="all"``, files into a temporary folder), a local
Ray with 2 CPUs, inside a timed block. For a no-op task without an argument (``f.remote()``)
and with one (``g.remote(1)``), batches of ``--calls`` submissions are timed in the
submitting thread's CPU (``time.thread_time``; the results are fetched outside the timing),
each variant twice per round, A-B-C-D-D-C-B-A, the order rotated from round to round (every
variant takes every place), after an untimed batch:

- ``off``: Ray's own ``RemoteFunction._remote`` (otel_rl's submit patches taken out);
- ``wrapper``: otel_rl's submit wrapper, the call carrying nothing (no open block's
  carrier: the cost of the wrapping function and its checks);
- ``name``: Ray's own ``_remote`` given a task name as long as the carrier's, made once (what
  the longer name costs Ray: its options handling and the task spec's serialization);
- ``on``: otel_rl's submit wrapper, the call carrying the caller's context.

Two modes (``--mode``):

- ``gated`` (default): while the batches are submitted, an actor holds both of Ray's CPUs, so
  no task runs: the submitting thread is measured alone, not beside the workers running the
  calls it just made (on 2 cores their work, and the extra work a carried context gives them,
  shows up in the submitting thread's CPU time). After each round the pending calls are
  cancelled and the actor killed (outside the timing);
- ``loaded``: the calls run as they are submitted (the first form of this bench).

Reported: µs per call over the round's calls (median of rounds), the per-round difference to
``off`` with a 95 % bootstrap interval of its median (`_stats`), and that difference over
``off`` as a percentage (the per-round ratio, its median and interval).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import ray
import ray.remote_function
from _stats import fmt_ci

import otel_rl
from otel_rl.timers import hierarchical_timer as timer


@ray.remote
def noop() -> None:
    return None


@ray.remote
def one(x: int) -> None:
    return None


@ray.remote(num_cpus=2)
class Gate:
    """Holds both CPUs while it lives: the tasks submitted meanwhile wait, none runs."""

    def ready(self) -> bool:
        return True


VARIANTS = ("off", "wrapper", "name", "on")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--mode", choices=("gated", "loaded"), default="gated")
    parser.add_argument("--json")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="bench-ray-submit-")
    otel_rl.configure(spans="all", output_dir=out)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from otel_rl._internal.ray_support import calls as ray_calls

    owner = ray.remote_function.RemoteFunction  # type: ignore[attr-defined]
    patched, original = owner._remote, ray_calls._original["task"]
    with timer("bench"):
        carrier = ray_calls.carrier_for_call()
        assert carrier is not None, "otel_rl does not propagate here"
        long_name = f"noop{ray_calls.MARK}{carrier}"

        def named(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
            options["name"] = long_name
            return original(self, args, kwargs, **options)

        def empty() -> None:
            ray_calls._made.internal = 1  # `calls.internal`: the wrapper finds no carrier

        def full() -> None:
            ray_calls._made.internal = 0

        setups = {"off": (original, full), "wrapper": (patched, empty),
                  "name": (named, full), "on": (patched, full)}
        results: dict[str, list[float]] = {f"{t} {v}": [] for t in ("f", "g")
                                           for v in VARIANTS}
        for target in (noop, one):  # warm-up: workers started, functions exported
            ray.get([target.remote(1) if target is one else target.remote()
                     for _ in range(200)])
        for r in range(args.rounds):
            gate = pending = None
            if args.mode == "gated":
                gate = Gate.remote()  # type: ignore[attr-defined]
                ray.get(gate.ready.remote())
                pending = []
            for name, target in (("f", noop), ("g", one)):
                # Each variant in each place over the rounds (rotated), A-B-C-D-D-C-B-A;
                # first an untimed batch (what the round's first submissions set going).
                first = list(VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)])
                order = first + list(reversed(first))
                warm = [target.remote(1) if target is one else target.remote()
                        for _ in range(args.calls // 2)]
                if pending is None:
                    ray.get(warm)
                else:
                    pending += warm
                per: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for variant in order:
                    function, setup = setups[variant]
                    owner._remote = function
                    setup()
                    half = args.calls // 2
                    start = time.thread_time()
                    if target is one:
                        refs = [target.remote(1) for _ in range(half)]
                    else:
                        refs = [target.remote() for _ in range(half)]
                    per[variant].append((time.thread_time() - start) / half * 1e6)
                    owner._remote = patched
                    full()
                    if pending is None:
                        ray.get(refs)
                    else:
                        pending += refs
                for variant in VARIANTS:
                    results[f"{name} {variant}"].append(sum(per[variant]) / 2)
            if gate is not None and pending is not None:
                for ref in pending:  # never run: cancelled while the gate holds the CPUs
                    ray.cancel(ref)
                ray.kill(gate)
                for ref in pending:
                    try:
                        ray.get(ref)
                    except Exception:  # cancelled
                        pass
    ray.shutdown()
    otel_rl.shutdown()
    lines = [f"{args.mode}, {args.rounds} rounds x {args.calls} calls",
             "| call | variant | thread CPU µs per call | added µs vs off [95 % CI] "
             "| added % of off [95 % CI] |",
             "|---|---|---|---|---|"]
    for name, label in (("f", "`f.remote()`"), ("g", "`g.remote(1)`")):
        off = results[f"{name} off"]
        for variant in VARIANTS:
            values = results[f"{name} {variant}"]
            added = [a - b for a, b in zip(values, off, strict=True)]
            percent = [100 * (a / b - 1) for a, b in zip(values, off, strict=True)]
            lines.append(f"| {label} | {variant} | {statistics.median(values):.2f} | "
                         f"{fmt_ci(added, 2) if variant != 'off' else ''} | "
                         f"{fmt_ci(percent, 1) if variant != 'off' else ''} |")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"mode": args.mode, "rounds": args.rounds, "calls": args.calls,
                       "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
