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
Ratios to metrics off are also taken per round (on and off run back to back in a round) and
reported as median and range. Targets: on/off at most 1.05x (wall), on at most 0.75x ML-Agents.

Export size: a run of 100 block paths (names) in the main process and 2 workers' roles,
1,000 runs each: bytes of one ``ExportMetricsServiceRequest`` (as sent, and gzip), and the
Prometheus series it makes.

    python benchmarks/bench_metrics.py [--quick|--smoke] [--json FILE]
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
            ("metrics_on", "otel_rl `spans=auto`, metrics on"))


def _round(n: int, receiver: ReceiverProcess, metrics: bool) -> dict[str, Any]:
    settings = bench_core._otlp(receiver, n)
    return bench_core._otel_rl_round(n, receiver, spans="auto", metrics=metrics,
                                     metrics_interval=0.2, flush_interval=0.05, window=0.1,
                                     **settings)


RUNNERS = {"mlagents": bench_core.run_mlagents,
           "metrics_off": lambda n, r: _round(n, r, False),
           "metrics_on": lambda n, r: _round(n, r, True)}


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
        for metric in ("wall", "cpu", "cpu_total"):
            per_block = [s[f"{metric}_ns"] / s["blocks"] / 1000 for s in runs]
            row[metric] = {"median": statistics.median(per_block), "min": min(per_block),
                           "max": max(per_block)}
        summary[name] = row
    for row in summary.values():
        for metric in ("wall", "cpu", "cpu_total"):
            row[metric]["vs_mlagents"] = row[metric]["median"] / summary["mlagents"][metric]["median"]
            row[metric]["vs_off"] = row[metric]["median"] / summary["metrics_off"][metric]["median"]
    paired: dict[str, Any] = {}
    for metric in ("wall", "cpu", "cpu_total"):
        ratios = [on[f"{metric}_ns"] / off[f"{metric}_ns"]
                  for on, off in zip(samples["metrics_on"], samples["metrics_off"], strict=True)]
        paired[metric] = {"median": statistics.median(ratios), "min": min(ratios),
                          "max": max(ratios)}
    summary["metrics_on"]["paired_vs_off"] = paired
    return {"config": {"nests": nests, "rounds": rounds, "seed": seed}, "summary": summary,
            "export": export_size(), "export_exponential": export_size(exponential=True),
            "environment": bench_core.environment()}


def render(results: dict[str, Any]) -> str:
    s, cfg, export = results["summary"], results["config"], results["export"]
    rows = []
    for name, label in VARIANTS:
        row = s[name]
        rows.append([label, f"{row['wall']['median']:.3f}", f"{row['wall']['vs_mlagents']:.2f}×",
                     f"{row['wall']['vs_off']:.3f}×", f"{row['cpu']['median']:.3f}",
                     f"{row['cpu']['vs_mlagents']:.2f}×", f"{row['cpu']['vs_off']:.3f}×",
                     f"{row['cpu_total']['vs_off']:.3f}×"])
    on = s["metrics_on"]

    def verdict(metric: str) -> str:
        ok = on[metric]["vs_off"] <= 1.05 and on[metric]["vs_mlagents"] <= 0.75
        return "meets" if ok else "**over**"

    return "\n".join([
        f"### Metrics on vs off ({cfg['rounds']} interleaved rounds, {cfg['nests']:,} nests each)",
        "", bench_core.markdown_table(
            ["variant", "wall µs/block", "wall × ML-Agents", "wall × off", "CPU µs/block †",
             "CPU × ML-Agents", "CPU × off", "CPU incl. final flush × off"], rows),
        "", "† process CPU (all threads: the flush thread's histogram work during the loop "
        "counts) over the loop; medians over rounds.",
        "", "Metrics on / off per round (median, min–max): " + "; ".join(
            f"{label} {p['median']:.3f}× ({p['min']:.3f}–{p['max']:.3f})"
            for label, p in (("wall", on["paired_vs_off"]["wall"]),
                             ("CPU", on["paired_vs_off"]["cpu"]),
                             ("CPU incl. final flush", on["paired_vs_off"]["cpu_total"]))) + ".",
        "", f"Targets (metrics on): ≤ 1.05× metrics off and ≤ 0.75× ML-Agents — wall: "
        f"{verdict('wall')}; CPU: {verdict('cpu')}.",
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
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    nests = {"smoke": 200, "quick": 20_000, "full": 50_000}[size]
    rounds = {"smoke": 1, "quick": 5, "full": 9}[size]
    print(f"bench_metrics: {rounds} rounds of {nests:,} nests", flush=True)
    return finish(run(nests, rounds, args.seed), args.json, render)


if __name__ == "__main__":
    sys.exit(main())
