"""What OTLP metrics cost (issue 18): per-block cost with metrics on vs off, and the size of
one metrics export.

Per block: the 3-deep nest of empty blocks of `bench_core`, in interleaved rounds (each round
runs every variant once, shuffled) in ONE process:

- ``mlagents``: the real ML-Agents ``hierarchical_timer`` (the anchor);
- ``metrics_off``: otel_rl ``spans="auto"`` over OTLP/HTTP, ``metrics=False``;
- ``metrics_on``: the same with ``metrics=True`` (histograms fed by the flush thread from the
  span records, an export every 0.2 s and at shutdown).

Both otel_rl variants flush every 0.05 s with 0.1 s windows (defaults: 2 s and 10 s), so the
flush thread — span encoding, the windows and, with metrics, the histograms, paths and
exemplars — runs *during* the loop and competes with it for the GIL, which is what the target
is about (with the default 2 s the loop ends before the first flush and on/off run the very
same code). Wall is the loop; CPU (all threads) covers the loop, then the final flush too.
Ratios to metrics off are also taken per round (on and off run in the same round) and
reported as median and range. Targets for metrics on: at most 1.05x metrics off (CPU
including the flush thread's work, final flush included) and at most 0.75x ML-Agents (CPU of
the training thread, the loop's own: ML-Agents does all its work there).

The metrics' own work is also measured directly: the flush thread's CPU time (thread time)
in `Metrics.observe`, `Metrics.exported` and `Metrics.encode` (counting, path resolution,
histogram and exemplar updates, encoding) per record, in the ``metrics_on`` rounds.

Export size: a run of 100 block paths (names) in the main process and 2 workers' roles,
1,000 runs each: bytes of one ``ExportMetricsServiceRequest`` (as sent, and gzip), and the
Prometheus series it makes.

    python benchmarks/bench_metrics.py [--quick|--smoke] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import bench_core
from _receiver import ReceiverProcess
from _report import finish

VARIANTS = (("mlagents", "ML-Agents `hierarchical_timer`"),
            ("metrics_off", "otel_rl `spans=auto`, metrics off"),
            ("metrics_on", "otel_rl `spans=auto`, metrics on"),
            ("metrics_on_pure", "otel_rl `spans=auto`, metrics on, pure-Python metrics columns"))
#: The variants with metrics on: compiled column reader (where built) and pure.
ON = ("metrics_on", "metrics_on_pure")


#: Flush-thread CPU ns spent in the metrics' own methods during the current round.
_SPENT: dict[str, int] = {}


def _timed_metrics() -> None:
    """Count the thread time of the metrics' work (`_SPENT`), once per process."""
    import time

    from otel_rl._internal import metrics as m

    if getattr(m.Metrics, "_bench_timed", False):
        return
    def timing(name: str) -> Any:
        orig = getattr(m.Metrics, name)

        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return orig(self, *args, **kwargs)
            finally:
                _SPENT[name] = _SPENT.get(name, 0) + time.thread_time_ns() - t0
        return timed

    for name in ("observe", "exported", "encode"):
        setattr(m.Metrics, name, timing(name))
    m.Metrics._bench_timed = True  # type: ignore[attr-defined]


def _round(n: int, receiver: ReceiverProcess, metrics: bool,
           pure: bool = False) -> dict[str, Any]:
    from otel_rl._internal import metrics_columns

    settings = bench_core._otlp(receiver, n)
    _timed_metrics()
    _SPENT.clear()
    # The pure column reader with the same (compiled) hot path: only the metrics differ.
    compiled = metrics_columns.COMPILED
    if pure:
        metrics_columns.COMPILED = None
    try:
        result = bench_core._otel_rl_round(n, receiver, spans="auto", metrics=metrics,
                                           metrics_interval=0.2, flush_interval=0.05,
                                           window=0.1, **settings)
    finally:
        metrics_columns.COMPILED = compiled
    result["metrics_ns"] = dict(_SPENT)
    return result


#: Per round: wall of the loop, the loop's own thread CPU, process CPU over the loop, and
#: process CPU including the final flush.
METRICS = ("wall", "thread", "cpu", "cpu_total")

RUNNERS = {"mlagents": bench_core.run_mlagents,
           "metrics_off": lambda n, r: _round(n, r, False),
           "metrics_on": lambda n, r: _round(n, r, True),
           "metrics_on_pure": lambda n, r: _round(n, r, True, pure=True)}


def export_size(paths: int = 100, runs: int = 1000, exponential: bool = False) -> dict[str, Any]:
    from otel_rl._internal import metrics as m
    from otel_rl._internal.otlp.records import Batch
    from otel_rl._internal.sinks.base import Stats

    metrics = m.Metrics(resource={"service.name": "bench", "otel_rl.run.id": "run",
                                  "process.pid": 1, "host.name": "h"}, start_ns=1,
                        stats=Stats(), gauges=lambda: {"reward": {"value": 1.0}},
                        scalars=lambda: [("main", 0, [["0", "reward/reward", 1.0, 100, 1]])],
                        dropped=lambda: 0, exponential=exponential)
    rng = random.Random(1)
    for role, index in (("main", 0), ("worker", 0), ("worker", 1)):
        records = [(i * paths + p + 1, 0, f"block_{p:03d}", 0, int(rng.lognormvariate(-9, 2) * 1e9),
                    1, 7, None) for i in range(runs) for p in range(paths)]
        resource = {} if role == "main" else {"otel_rl.worker.role": role,
                                              "otel_rl.worker.index": index}
        metrics.observe([Batch(resource, 0, records)], exemplars=True)
    with_exemplars = metrics.encode(10**18)
    without = metrics.encode(10**18 + 1)
    return {"paths": paths, "roles": 2, "workers": 3, "bytes": len(without),
            "bytes_gzip": len(gzip.compress(without)),
            "bytes_with_exemplars": len(with_exemplars), "series": metrics.series()}


def observe_cost(nests: int = 30_000, repeats: int = 5) -> dict[str, Any]:
    """Flush-thread CPU of `Metrics.observe` per record (µs, median and range of `repeats`) for
    a 3-deep nest `a/b/c` (every third nest also runs `x` under `b`, and `x` also sits at
    `a/x` in the trees), by where the records come from: this process (names at one path
    in its trees: one name column), this process with `x` at two paths (those records
    placed by parent ids), and a relaying worker's batch as it arrives (typed columns)."""
    import os
    import time

    from otel_rl._internal import metrics as m
    from otel_rl._internal import relay
    from otel_rl._internal.otlp.records import Batch
    from otel_rl._internal.recorder import TimerNode
    from otel_rl._internal.sinks.base import Stats

    def tree(*paths: str) -> Any:
        root = TimerNode("root")
        for path in paths:
            node = root
            for name in path.split("/"):
                node = node.get_child(name)
        return root

    records: list[Any] = []
    sid, t = 10, 0
    for i in range(nests):
        a, b, c, x = sid, sid + 1, sid + 2, sid + 3
        sid += 4
        records += [(c, b, "c", t, t + 300 + i % 7, 7, 5, None),
                    (b, a, "b", t, t + 9_000, 7, 5, None)]
        if i % 3 == 0:
            records.append((x, b, "x", t, t + 2_000, 7, 5, None))
        records.append((a, 1, "a", t, t + 20_000 + i % 1000, 7, 5, None))
        t += 30_000
    here = {"process.pid": os.getpid()}
    worker = {"process.pid": -1, "otel_rl.worker.role": "rollout", "otel_rl.worker.index": 0}
    sources: dict[str, tuple[dict[str, Any], list[Any] | None]] = {
        "this process, names at one path": (here, [tree("a/b/c", "a/b/x")]),
        "this process, `x` at two paths": (here, [tree("a/b/c", "a/b/x", "a/x")]),
        "relayed worker (columns)": (worker, None),
    }
    result: dict[str, Any] = {"records": len(records)}
    for label, (resource, trees) in sources.items():
        costs: dict[str, list[float]] = {"compiled": [], "pure": []}
        for attempt in range(repeats + 1):  # the first warms up (imports, first-use tables)
            for reader, spent in costs.items():  # alternately
                metrics = m.Metrics(resource={}, start_ns=1, stats=Stats(), gauges=dict,
                                    scalars=list, roots=lambda: {1},
                                    local=None if trees is None else _constant(trees),
                                    accelerated=reader == "compiled")
                batch = Batch(resource, 0, records, {7: "MainThread"})
                if trees is None:
                    frame = relay.encode_columns(batch)
                    batch = relay.decode_columns(frame[relay.FRAME_HEADER.size:])
                t0 = time.thread_time_ns()
                metrics.observe([batch], exemplars=False, final=True)
                if attempt:
                    spent.append((time.thread_time_ns() - t0) / len(records) / 1000)
                runs = sum(sum(h.counts) for h in metrics.hists.values())
                assert runs == len(records), (label, runs)
        result[label] = {reader: _spread(spent) for reader, spent in costs.items()}
    return result


def _compiled_columns() -> bool:
    """Whether the ``metrics_on`` variant reads columns compiled: built, and the accelerator
    setting on (``OTEL_RL_ACCELERATOR=false`` runs everything pure, both variants alike)."""
    from otel_rl._internal import accel, metrics_columns

    return metrics_columns.COMPILED is not None and accel.wanted()


def _constant(value: Any) -> Any:
    return lambda: value


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(nests: int, rounds: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in VARIANTS}
    with ReceiverProcess() as receiver:
        for name, _ in VARIANTS:
            RUNNERS[name](max(1, nests // 10), receiver)  # warm-up
        for r in range(rounds):
            order = [name for name, _ in VARIANTS]
            rng.shuffle(order)
            for name in order:
                result = RUNNERS[name](nests, receiver)
                result["blocks"] = bench_core.NEST * nests
                samples[name].append(result)
            print(f"  round {r + 1}/{rounds} done ({', '.join(order)})", flush=True)
    summary: dict[str, Any] = {}
    for name, runs in samples.items():
        row: dict[str, Any] = {"checks": sorted({c for s in runs for c in s["checks"]})}
        for metric in METRICS:
            per_block = [s[f"{metric}_ns"] / s["blocks"] / 1000 for s in runs]
            row[metric] = _spread(per_block)
        summary[name] = row
    # The metrics' own flush-thread work per record (µs), per method and in all.
    for on in ON:
        work: dict[str, Any] = {}
        for part in ("observe", "exported", "encode", "total"):
            work[part] = _spread([
                (sum(s["metrics_ns"].values()) if part == "total"
                 else s["metrics_ns"].get(part, 0)) / s["blocks"] / 1000 for s in samples[on]])
        summary[on]["work"] = work
    for row in summary.values():
        for metric in ("wall", "cpu", "cpu_total"):
            row[metric]["vs_mlagents"] = row[metric]["median"] / summary["mlagents"][metric]["median"]
            row[metric]["vs_off"] = row[metric]["median"] / summary["metrics_off"][metric]["median"]
    for variant in ON:
        for against, key in (("metrics_off", "paired_vs_off"),
                             ("mlagents", "paired_vs_mlagents")):
            paired: dict[str, Any] = {}
            for metric in METRICS:
                # ML-Agents has no flush thread: its CPU including the flush is its loop CPU.
                theirs = "cpu" if against == "mlagents" and metric == "cpu_total" else metric
                paired[metric] = _spread([
                    on[f"{metric}_ns"] / other[f"{theirs}_ns"]
                    for on, other in zip(samples[variant], samples[against], strict=True)])
            summary[variant][key] = paired
    return {"config": {"nests": nests, "rounds": rounds, "seed": seed}, "summary": summary,
            "export": export_size(), "export_exponential": export_size(exponential=True),
            "observe": observe_cost(min(30_000, max(300, nests))),
            "compiled_columns": _compiled_columns(),
            "environment": bench_core.environment()}


def render(results: dict[str, Any]) -> str:
    s, cfg, export = results["summary"], results["config"], results["export"]
    columns = ("in use" if results.get("compiled_columns")
               else "NOT in use (not built, or the accelerator setting is off): pure here too")

    def cell(row: dict[str, Any], metric: str) -> str:
        v = row[metric]
        return f"{v['median']:.3f} ({v['min']:.2f}–{v['max']:.2f})"

    rows = []
    for name, label in VARIANTS:
        row = s[name]
        rows.append([label, *(cell(row, m) for m in METRICS)])
    on = s["metrics_on"]

    def ratio(p: dict[str, Any]) -> str:
        return f"**{p['median']:.3f}×** ({p['min']:.2f}–{p['max']:.2f})"

    ratios = [[f"metrics on{' (pure columns)' if variant != 'metrics_on' else ''} / {label}"]
              + [ratio(s[variant][key][m]) for m in METRICS]
              for variant in ON for key, label in (("paired_vs_off", "metrics off"),
                                                   ("paired_vs_mlagents", "ML-Agents"))]

    def work(variant: str) -> str:
        spent = s[variant]["work"]
        return "; ".join(
            f"{part} {spent[part]['median']:.3f} ({spent[part]['min']:.3f}–"
            f"{spent[part]['max']:.3f})" for part in ("observe", "exported", "encode", "total"))

    meets_off = on["paired_vs_off"]["cpu_total"]["median"] <= 1.05
    meets_ml = on["paired_vs_mlagents"]["thread"]["median"] <= 0.75
    return "\n".join([
        f"### Metrics on vs off ({cfg['rounds']} interleaved rounds, {cfg['nests']:,} nests "
        f"= {3 * cfg['nests']:,} blocks each)",
        "", "µs per block, median (min–max over rounds):", "",
        bench_core.markdown_table(
            ["variant", "wall (loop)", "training thread CPU", "CPU, loop †",
             "CPU incl. final flush †"], rows),
        "", "† process CPU, all threads: the flush thread's work during the loop counts; then "
        "the final flush (shutdown) too. Training thread CPU: the loop's own thread only (the "
        "hot path, what a block costs the program's thread).",
        "", "Per-round ratios, median (min–max):", "",
        bench_core.markdown_table(["", "wall", "training thread CPU", "CPU, loop",
                                   "CPU incl. final flush"], ratios),
        "", "The metrics' own work on the flush thread (thread CPU in observe / exported / "
        f"encode), µs per record, median (min–max): compiled columns ({columns}): "
        f"{work('metrics_on')}; pure columns: {work('metrics_on_pure')}.",
        "", f"Targets (metrics on): ≤ 1.05× metrics off in CPU including the flush — "
        f"{'meets' if meets_off else '**over**'}; ≤ 0.75× ML-Agents on the training thread — "
        f"{'meets' if meets_ml else '**over**'} (ML-Agents does all its work on that thread; "
        "otel_rl's flush work is the column above).",
        "", f"### Counting cost by where the records come from ({results['observe']['records']:,}"
        " records of a 3-deep nest, `Metrics.observe`, flush-thread CPU)", "",
        bench_core.markdown_table(
            ["records", "µs per record, compiled columns", "pure columns (median (min–max))"],
            [[label, *(f"{v[r]['median']:.3f} ({v[r]['min']:.3f}–{v[r]['max']:.3f})"
                       for r in ("compiled", "pure"))]
             for label, v in results["observe"].items() if label != "records"]),
        "", f"### One metrics export: {export['paths']} block paths, {export['roles']} roles, "
        f"{export['workers']} worker processes", "",
        bench_core.markdown_table(
            ["histograms", "bytes (protobuf)", "gzip", "with exemplars", "series"],
            [[kind, f"{e['bytes']:,}", f"{e['bytes_gzip']:,}", f"{e['bytes_with_exemplars']:,}",
              f"{e['series']:,}"]
             for kind, e in (("explicit", export), ("exponential",
                                                    results["export_exponential"]))]), ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 9; quick 7)")
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    nests = {"smoke": 200, "quick": 20_000, "full": 50_000}[size]
    rounds = args.rounds or {"smoke": 1, "quick": 7, "full": 9}[size]
    print(f"bench_metrics: {rounds} rounds of {nests:,} nests", flush=True)
    return finish(run(nests, rounds, args.seed), args.json, render)


if __name__ == "__main__":
    sys.exit(main())
