"""The main process's CPU per worker record under `auto`: relay decode + the time windows.

    python benchmarks/bench_windows.py [--quick] [--smoke] [--own] [--json FILE]

Two relaying workers' batches shaped like a Sample Factory rollout worker's (short blocks
under a few parents, one in 500 with an extra, an occasional long block or outlier), one
batch per worker per flush (1 s), over simulated seconds of a run with the default windows
(10 s, every 10th kept, budget 10,000). Per round, every frame is decoded (`relay`) and the
flushes go through a fresh `Windower` as in the main process: as before issue 19's bulk
windows (`windows.py` at ``BEFORE``, read from git), now (relayed batches placed in bulk on
their columns, `windows_bulk`), and now record by record (``bulk = False``). Interleaved
rounds, medians of ``time.process_time``, the garbage collector on. Checks: the three export
the same records (ids, parents, times, extras, order) and keep the same windows.

``--own``: the same records as the main process's own drained batches (no relay frame, no
columns: the real ML-Agents run's main process records most of its blocks itself); "now" gives
them columns first (`windows_bulk.with_columns`).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from typing import Any

from _report import failed_checks_lines, finish, module_at_revision

from otel_rl._internal import relay, semconv
from otel_rl._internal import windows as windows_now
from otel_rl._internal.otlp.records import Batch

#: The last revision before the bulk windows.
BEFORE = "575f41f"
SECOND = 1_000_000_000
EPOCH = 1_750_000_000 * SECOND  # records carry perf_counter ns; the offset makes epoch ns


def make_frames(seconds: int, rate: int, own: bool = False) -> list[list[Any]]:
    """Per flush, each worker's batch as the relay frame body the main process reads (`own`:
    as the batch itself)."""
    rng = random.Random(19)
    names = [f"block_{i}" for i in range(20)]
    flushes = []
    sid = 1 << 40
    for s in range(seconds):
        frames = []
        for pid in (201, 202):
            records: list[Any] = []
            parent = 0
            for i in range(rate):
                sid += 1
                start = 10**12 + s * SECOND + i * (SECOND // rate) + rng.randrange(1000)
                duration = rng.randrange(2_000, 40_000)
                if rng.random() < 0.0005:
                    duration = rng.randrange(20, 200) * 1_000_000
                if i % 25 == 0:
                    parent, psid = sid, 0
                else:
                    psid = parent
                extra = {"attrs": {"step": i}} if i % 500 == 0 else None
                records.append((sid, psid, names[i % 20], start, start + duration, 9000 + pid,
                                0xBEEF, extra))
            batch = Batch({semconv.PROCESS_PID: pid, "service.name": "bench"}, EPOCH,
                          records, {9000 + pid: "MainThread"})
            frames.append(batch if own else
                          relay.encode_columns(batch)[relay.FRAME_HEADER.size:])
        flushes.append(frames)
    return flushes


def windower(module: Any, bulk: bool) -> Any:
    w = module.Windower(run_id="bench", t0_ns=EPOCH + 10**12, window_s=10.0, every=10,
                        budget=lambda: 10_000, main=True, run_span=(0xABC, 0x123),
                        lag_s=2.5, own=Batch({semconv.PROCESS_PID: 1}, EPOCH, []))
    if not bulk:
        w.bulk = False
    return w


def received(frame: Any) -> Batch:
    """A flush's batch as the main process has it: decoded from its frame, or (its own) a
    fresh copy of the drained batch."""
    if isinstance(frame, Batch):
        return Batch(frame.resource, frame.offset_ns, list(frame.records), frame.thread_names)
    return relay.decode_columns(frame)


def one_round(module: Any, bulk: bool, flushes: list[list[Any]]) -> tuple[float, Any]:
    """CPU seconds to decode (or copy) and window every flush; and what was exported."""
    w = windower(module, bulk)
    out = []
    gc.collect()
    start = time.process_time()
    for s, frames in enumerate(flushes):
        batches = [received(frame) for frame in frames]
        out.extend(w.process(batches, EPOCH + 10**12 + (s + 1) * SECOND))
    out.extend(w.process([], EPOCH + 10**12 + (len(flushes) + 3) * SECOND, final=True))
    elapsed = time.process_time() - start
    return elapsed, ([(b.resource, list(b.records)) for b in out], dict(w.kept))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--own", action="store_true",
                        help="the batches as the main process's own, not relayed")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rounds, seconds, rate = (2, 3, 2000) if args.smoke else (5, 30, 10_000) if args.quick \
        else (7, 40, 15_000)
    before = module_at_revision(BEFORE, "otel_rl/_internal/windows.py", "windows_before")
    variants: dict[str, tuple[Any, bool]] = {"now": (windows_now, True),
                                             "now, record by record": (windows_now, False)}
    if before is not None:
        variants["before"] = (before, False)
    flushes = make_frames(seconds, rate, args.own)
    n = seconds * rate * 2
    outputs = {name: one_round(module, bulk, flushes)[1]
               for name, (module, bulk) in variants.items()}
    checks: dict[str, list[str]] = {name: [] for name in variants}
    reference = outputs["now, record by record"]
    for name, got in outputs.items():
        if got[1] != reference[1]:
            checks[name].append(f"{name}: kept other windows ({got[1]} vs {reference[1]})")
        if got[0] != reference[0]:
            checks[name].append(f"{name}: exported other records")
    if not reference[0] or "schedule" not in reference[1].values():
        checks["now"].append("the workload kept no window")
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            module, bulk = variants[name]
            times[name].append(one_round(module, bulk, flushes)[0] / n * 1e6)
    summary = {name: {"checks": checks[name], "median": statistics.median(times[name]),
                      "min": min(times[name]), "max": max(times[name])} for name in variants}
    kept = reference[1]
    results = {"rounds": rounds, "records": n, "own": args.own, "seconds": seconds, "before": BEFORE,
               "kept": {str(k): v for k, v in kept.items()},
               "exported": sum(len(records) for _resource, records in reference[0]),
               "summary": summary}
    return finish(results, args.json, render)


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    title = ("#### The main process per record of its own: `auto` windows, "
             if results.get("own") else
             "#### The main process per worker record: relay decode + `auto` windows, ")
    lines = [*failed_checks_lines(results),
             title + f"{results['records']:,} records over {results['seconds']} s, "
             f"{results['rounds']} interleaved rounds (µs CPU per record, median, min–max); "
             f"{len(results['kept'])} windows kept, {results['exported']:,} spans exported", "",
             "| windows | µs per record | × before |", "|---|---|---|"]
    base = s.get("before")
    for name in ("before", "now, record by record", "now"):
        if name not in s:
            continue
        row = s[name]
        ratio = f"{row['median'] / base['median']:.2f}×" if base else ""
        label = f"before (`{results['before']}`)" if name == "before" else name
        lines.append(f"| {label} | {row['median']:.3f} ({row['min']:.3f}–{row['max']:.3f}) | "
                     f"{ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
