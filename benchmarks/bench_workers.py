"""Worker processes: CPU per timed block in the worker, and start-up cost per worker.

Each variant starts 4 ``spawn`` workers; each worker times 20,000 **1-deep** empty blocks
(``with timer("step"): pass``). Variants, interleaved in one parent process (every round runs
each variant once, in a shuffled order):

- ``plain``: a worker with no timers at all (the start-up baseline);
- ``mlagents``: ML-Agents' ``hierarchical_timer`` in the workers (the anchor); the exit path
  pickles ``get_timer_tree()`` for the parent, as ML-Agents' env workers do;
- ``otel_rl``: the parent runs ``otel_rl.configure(spans="all", endpoint=<receiver>,
  output_dir=<tmp>)``; workers auto-join through ``spawn`` and relay their records to the
  parent, which exports them; the exit path is ``otel_rl.shutdown()`` in the worker;
- ``otel_sdk``: each worker runs its own ``TracerProvider`` + ``BatchSpanProcessor`` +
  ``OTLPSpanExporter`` (HTTP) to the receiver; the exit path is ``provider.shutdown()``.

Measured in each worker: ``time.process_time()`` (all of the worker's threads) around the
loop, and around its exit path (the final flush). Start-up: the parent starts the workers one
after another and, for each, takes the time from ``Process.start()`` until the worker is ready
to enter its first block (imports and set-up done); the worker also reports its own CPU time up
to that point (interpreter start-up, imports, unpickling, otel_rl's worker configuration).
Both are compared with the ``plain`` worker. Then all 4 run their loops at once.

Checks: every span reaches the receiver, and the parent's ``timers.json`` counts 4 x 20,000
``step`` blocks under the block that started the workers.

Run ``python benchmarks/bench_workers.py [--quick] [--json FILE]``; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from _receiver import ReceiverProcess
from _report import failed_checks_lines, finish
from bench_core import environment, markdown_table

VARIANTS = (
    ("plain", "plain worker, no timers (baseline)"),
    ("mlagents", "anchor: ML-Agents `hierarchical_timer`"),
    ("otel_rl", "otel_rl, parent `spans=all`, workers relay to the parent"),
    ("otel_sdk", "OTel SDK in each worker (BatchSpanProcessor + OTLP/HTTP)"),
)
#: Targets: CPU per block within 1.5x ML-Agents; start-up under 20 ms per worker.
TARGET_CPU_RATIO = 1.5
TARGET_STARTUP_MS = 20.0


# --- the worker (runs in the spawn child; imports what its variant needs, nothing at the top) ---

def worker_main(variant: str, index: int, blocks: int, endpoint: str, results: Any,
                go: Any) -> None:
    exit_path: Callable[[], Any] = lambda: None  # noqa: E731
    timer: Callable[[str], Any] | None = None
    if variant == "mlagents":
        from mlagents_envs.timers import get_timer_tree
        from mlagents_envs.timers import hierarchical_timer as mlagents_timer

        timer = mlagents_timer

        def exit_path() -> Any:
            return pickle.dumps(get_timer_tree())
    elif variant == "otel_rl":
        import otel_rl
        from otel_rl.timers import hierarchical_timer

        timer = hierarchical_timer

        def exit_path() -> Any:
            return otel_rl.shutdown(60.0)
    elif variant == "otel_sdk":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(shutdown_on_exit=False)
        # A queue for every span: the SDK would drop silently past its default 2048.
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"),
            max_queue_size=max(2048, blocks + 16)))
        timer = provider.get_tracer("bench").start_as_current_span
        exit_path = provider.shutdown
    results.put(("ready", index, time.monotonic_ns(), time.process_time_ns()))
    go.wait()
    c0 = time.process_time_ns()
    if timer is not None:
        for _ in range(blocks):
            with timer("step"):
                pass
    c1 = time.process_time_ns()
    exit_path()
    c2 = time.process_time_ns()
    results.put(("done", index, c1 - c0, c2 - c1))


# --- one round of one variant (in the parent) ---------------------------------------------------

def _children_cpu_ns() -> int:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((usage.ru_utime + usage.ru_stime) * 1e9)


def run_variant(variant: str, workers: int, blocks: int,
                receiver: ReceiverProcess) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    tmp = tempfile.mkdtemp(prefix="otel-rl-bench-")
    before = receiver.spans()
    checks: list[str] = []
    parent: Any = None
    otel_rl: Any = None
    if variant == "otel_rl":
        import otel_rl
        from otel_rl.timers import hierarchical_timer

        otel_rl.configure(spans="all", endpoint=receiver.http_endpoint, protocol="http/protobuf",
                          output_dir=tmp, max_buffer=max(500_000, 2 * workers * blocks),
                          shutdown_timeout=120.0)
        parent = hierarchical_timer("workers")
        parent.__enter__()
    try:
        children0 = _children_cpu_ns()
        parent_c0 = time.process_time_ns()
        procs, startup_ns, ready_cpu_ns = [], [], []
        for i in range(workers):
            p = ctx.Process(target=worker_main, name=f"bench-worker-{i}",
                            args=(variant, i, blocks, receiver.http_endpoint, results, go))
            t0 = time.monotonic_ns()
            p.start()
            procs.append(p)
            kind, index, t_ready, cpu_ready = results.get(timeout=120)
            assert (kind, index) == ("ready", i)
            startup_ns.append(t_ready - t0)
            ready_cpu_ns.append(cpu_ready)
        go.set()
        done = [results.get(timeout=300) for _ in range(workers)]
        for p in procs:
            p.join(120)
            if p.exitcode != 0:
                checks.append(f"{variant}: worker {p.name} exited with {p.exitcode}")
        children_cpu = _children_cpu_ns() - children0
    finally:
        if parent is not None:
            parent.__exit__(None, None, None)
            otel_rl.shutdown(120.0)
    parent_cpu = time.process_time_ns() - parent_c0
    result: dict[str, Any] = {
        "startup_ns": startup_ns, "ready_cpu_ns": ready_cpu_ns,
        "loop_cpu_ns": [d[2] for d in done], "exit_cpu_ns": [d[3] for d in done],
        "process_cpu_ns": children_cpu / workers, "parent_cpu_ns": parent_cpu,
        "blocks": blocks if variant != "plain" else 0}
    if variant in ("otel_rl", "otel_sdk"):
        # otel_rl adds a `process` marker per worker, the parent's block, the run span and the
        # run's aggregate span.
        expected = workers * blocks + (workers + 3 if variant == "otel_rl" else 0)
        received = receiver.wait_for(before + expected) - before
        result.update(expected=expected, received=received)
        if received != expected:
            checks.append(f"{variant}: receiver got {received} spans, expected {expected}")
    if variant == "otel_rl":
        checks += _check_timers_json(os.path.join(tmp, "timers.json"), workers, blocks)
        from otel_rl._internal import runtime

        rt = runtime.current()
        dropped = rt.dropped_total() if rt is not None else 0
        result["dropped"] = dropped
        if dropped:
            checks.append(f"otel_rl dropped {dropped} spans")
    shutil.rmtree(tmp, ignore_errors=True)
    result["checks"] = checks
    return result


def _check_timers_json(path: str, workers: int, blocks: int) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"cannot read the parent's timers.json: {exc}"]
    step = tree.get("children", {}).get("workers", {}).get("children", {}).get("step", {})
    checks = []
    if step.get("count") != workers * blocks:
        checks.append(f"timers.json counts {step.get('count')} `workers/step` blocks, "
                      f"expected {workers * blocks}")
    if not step.get("is_parallel"):
        checks.append("timers.json: the workers' blocks are not flagged is_parallel")
    if len(tree.get("workers", [])) != workers:
        checks.append(f"timers.json lists {len(tree.get('workers', []))} workers, "
                      f"expected {workers}")
    return checks


# --- rounds and the report ----------------------------------------------------------------------

def run(workers: int, blocks: int, rounds: int, seed: int,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    rng = random.Random(seed)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in VARIANTS}
    with ReceiverProcess() as receiver:
        for name, _ in VARIANTS:  # warm-up (page cache, first imports); not recorded
            run_variant(name, 1, min(blocks, 100), receiver)
        for r in range(rounds):
            order = [name for name, _ in VARIANTS]
            rng.shuffle(order)
            for name in order:
                samples[name].append(run_variant(name, workers, blocks, receiver))
            log(f"  round {r + 1}/{rounds} done ({', '.join(order)})")
    return {"config": {"workers": workers, "blocks": blocks, "rounds": rounds, "seed": seed,
                       "nesting": 1},
            "environment": environment(), "samples": samples, "summary": summarize(samples)}


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per variant: medians over rounds of the per-round mean over workers."""
    summary: dict[str, dict[str, Any]] = {}
    for name, rounds in samples.items():
        def per_round(f: Callable[[dict[str, Any]], float], rounds: Any = rounds) -> float:
            return _median([f(s) for s in rounds])

        row: dict[str, Any] = {
            "startup_ms": per_round(lambda s: statistics.mean(s["startup_ns"]) / 1e6),
            "ready_cpu_ms": per_round(lambda s: statistics.mean(s["ready_cpu_ns"]) / 1e6),
            "process_cpu_ms": per_round(lambda s: s["process_cpu_ns"] / 1e6),
            "checks": sorted({c for s in rounds for c in s["checks"]}),
        }
        if name != "plain":
            row["loop_us"] = per_round(
                lambda s: statistics.mean(s["loop_cpu_ns"]) / s["blocks"] / 1000)
            row["total_us"] = per_round(
                lambda s: statistics.mean(a + b for a, b in zip(s["loop_cpu_ns"],
                                                                 s["exit_cpu_ns"], strict=True))
                / s["blocks"] / 1000)
            row["parent_us"] = per_round(
                lambda s: s["parent_cpu_ns"] / (len(s["loop_cpu_ns"]) * s["blocks"]) / 1000)
        for key in ("received", "expected", "dropped"):
            if rounds and key in rounds[0]:
                row[key] = sum(s[key] for s in rounds)
        summary[name] = row
    base, plain = summary["mlagents"], summary["plain"]
    for name, row in summary.items():
        if name != "plain":
            row["total_ratio"] = row["total_us"] / base["total_us"]
        row["startup_extra_ms"] = row["startup_ms"] - plain["startup_ms"]
        row["ready_cpu_extra_ms"] = row["ready_cpu_ms"] - plain["ready_cpu_ms"]
    return summary


def render(results: dict[str, Any]) -> str:
    s, cfg = results["summary"], results["config"]
    out = [f"### Workers: {cfg['workers']} spawn workers × {cfg['blocks']:,} 1-deep blocks each "
           f"({cfg['rounds']} interleaved rounds, medians)", ""]
    rows = []
    for name, label in VARIANTS:
        if name == "plain":
            continue
        row = s[name]
        ok = row["total_ratio"] <= TARGET_CPU_RATIO or name != "otel_rl"
        rows.append([label, f"{row['loop_us']:.3f}", f"{row['total_us']:.3f}",
                     f"{row['total_ratio']:.2f}×",
                     ("meets" if ok else "**over**") + f" ≤ {TARGET_CPU_RATIO:g}×"
                     if name == "otel_rl" else "",
                     f"{row['parent_us']:.3f}"])
    out.append(markdown_table(["variant", "worker CPU µs/block, loop",
                               "worker CPU µs/block, loop + exit/flush", "× ML-Agents",
                               "target", "parent CPU µs/worker block ‡"], rows))
    out += ["", "‡ the parent's process CPU over the round divided by all worker blocks: "
            "for otel_rl that is receiving the relayed records and exporting them (OTLP/HTTP "
            "plus the `spans.otlp.jsonl` file that `output_dir` turns on); for the others it is "
            "only the cost of starting and joining workers.", ""]
    rows = []
    for name, label in VARIANTS:
        row = s[name]
        target = ""
        if name == "otel_rl":
            ok = row["startup_extra_ms"] <= TARGET_STARTUP_MS
            target = ("meets" if ok else "**over**") + f" < {TARGET_STARTUP_MS:g} ms"
        rows.append([label, f"{row['startup_ms']:.1f}", f"{row['startup_extra_ms']:+.1f}",
                     f"{row['ready_cpu_ms']:.1f}", f"{row['ready_cpu_extra_ms']:+.1f}",
                     f"{row['process_cpu_ms']:.1f}", target])
    out.append(markdown_table(["variant", "start → first block, ms", "Δ vs plain",
                               "worker CPU before first block, ms", "Δ vs plain",
                               "whole worker process CPU, ms", "start-up target"], rows))
    out += ["", "Start-up is per worker, workers started one after another (each waits until "
            "the previous one is ready). \"Whole worker process CPU\" is the children's "
            "rusage (user + system) over the round, per worker: interpreter start-up, imports, "
            "loop and exit.", ""]
    span_rows = []
    for name in ("otel_rl", "otel_sdk"):
        row = s[name]
        span_rows.append([name, f"{row.get('received', 0):,}", f"{row.get('expected', 0):,}",
                          f"{row.get('dropped', 0):,}" if "dropped" in row else "—",
                          "ok" if not row["checks"] else "; ".join(row["checks"])])
    out.append(markdown_table(["variant", "spans received", "expected", "dropped", "check"],
                              span_rows))
    out += ["", "otel_rl's expected count is every worker block plus one `process` marker "
            "per worker, the parent's `workers` block and the run span; its check also reads "
            "the parent's `timers.json` (`workers/step` counted "
            f"{cfg['workers']}×{cfg['blocks']:,} per round, flagged parallel, "
            f"{cfg['workers']} workers listed).", ""]
    out += failed_checks_lines(results)
    return "\n".join(out)


def installed_copy() -> str | None:
    """When bytecode writing is off, import otel_rl from a byte-compiled copy (in a temporary
    folder first on ``sys.path``, which spawn workers inherit); returns that folder.

    An installed package comes with ``.pyc`` files (pip compiles them), as ML-Agents and the
    OTel SDK do here; a source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` has none, which
    would bill compiling otel_rl to every worker's start-up.
    """
    if not sys.dont_write_bytecode:
        return None
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("otel_rl")  # finds it without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    tmp = tempfile.mkdtemp(prefix="otel-rl-bench-pkg-")
    shutil.copytree(next(iter(spec.submodule_search_locations)), os.path.join(tmp, "otel_rl"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(tmp, quiet=1)
    sys.path.insert(0, tmp)
    return tmp


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes: checks that the benchmark runs, measures nothing")
    parser.add_argument("--workers", type=int, help="workers per variant (default 4)")
    parser.add_argument("--blocks", type=int, help="blocks per worker (default 20,000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 7; quick 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the shuffled round order")
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.smoke else 3 if args.quick else 7)
    args.workers = args.workers or (2 if args.smoke else 4)
    args.blocks = args.blocks or (300 if args.smoke else 20_000)
    print(f"bench_workers: {rounds} rounds, {args.workers} spawn workers × {args.blocks:,} "
          "blocks", flush=True)
    copy = installed_copy()
    try:
        results = run(args.workers, args.blocks, rounds, args.seed,
                      log=lambda m: print(m, flush=True))
    finally:
        if copy:
            shutil.rmtree(copy, ignore_errors=True)
    results["config"]["otel_rl_bytecode"] = "compiled copy" if copy else "as found"
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
