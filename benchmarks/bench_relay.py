"""The worker -> parent relay frame: CPU per record to encode (worker) and decode (parent).

    python benchmarks/bench_relay.py [--quick] [--smoke] [--json FILE]

Batches shaped like a Sample Factory rollout worker's 2-second flush (20 block names, one
trace, one record in 500 with an extra), encoded and decoded by the relay as it was before
issue 19 (`relay.py` at ``BEFORE``, read from git) and as it is now, with the compiled column
writer (`_relaycols`, where built) and with the pure one (`relay_columns.pure`, what an install
without a compiler runs), interleaved in one process (7 rounds, medians of
``time.process_time``; the garbage collector on, collected before each loop). Checks: every
variant decodes every batch back to the records that went in, each decodes the others' frames
(the wire format did not change), and all write the same bytes.
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

from otel_rl._internal import relay as relay_now
from otel_rl._internal import relay_columns
from otel_rl._internal.otlp.records import Batch

#: The relay before the column writers (`relay_columns`, issue 19's fifth round): its frame
#: is the same as at ``0c2e0b4`` (before issue 19), whose `relay.py` no longer imports today.
BEFORE = "b971630"
HEADER = 5  # relay.FRAME_HEADER.size: (length, kind)


def make_batches(count: int, size: int) -> list[Batch]:
    rng = random.Random(7)
    names = [f"block_{i}" for i in range(20)]
    trace = rng.getrandbits(128)
    batches = []
    sid = 1 << 40
    for _ in range(count):
        records = []
        t = rng.randrange(1 << 40)
        for i in range(size):
            sid += 1
            extra = {"attrs": {"k": i}} if i % 500 == 0 else None
            records.append((sid, sid - 1, names[i % 20], t, t + 1000, 140000 + i % 3, trace,
                            extra))
            t += 1500
        batches.append(Batch({"service.name": "w", "process.pid": 7}, 123, records,
                             {140000: "MainThread"}))
    return batches


class _Writer:
    """`relay` now with one column writer in use while it encodes (picked per batch of
    thousands of records: a global assignment)."""

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled

    def encode_columns(self, batch: Batch) -> bytes:
        relay_columns.use(self.compiled)
        return relay_now.encode_columns(batch)

    decode_columns = staticmethod(relay_now.decode_columns)


def per_record(fn: Any, items: list[Any], n: int) -> float:
    gc.collect()
    start = time.process_time()
    for item in items:
        fn(item)
    return (time.process_time() - start) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rounds, count, size = (2, 2, 500) if args.smoke else (5, 10, 5000) if args.quick else \
        (7, 20, 10000)
    before = module_at_revision(BEFORE, "otel_rl/_internal/relay.py", "relay_before")
    variants: dict[str, Any] = {"now": _Writer(True), "now_pure": _Writer(False)}
    if relay_columns.compiled_module() is None:
        del variants["now"]  # (not built here: the pure writer is what runs)
    if before is not None:
        variants["before"] = before
    batches = make_batches(count, size)
    n = count * size
    checks: dict[str, list[str]] = {name: [] for name in variants}
    frames = {name: [mod.encode_columns(b)[HEADER:] for b in batches]
              for name, mod in variants.items()}
    for name, mod in variants.items():
        for other in variants:
            again = [mod.decode_columns(f) for f in frames[other]]
            if [list(map(tuple, b.records)) for b in again] != [b.records for b in batches]:
                checks[name].append(f"{name}: decoding {other}'s frames lost or changed records")
    written = {frame for name in variants for frame in [b"".join(frames[name])]}
    if len(written) != 1:
        for name in variants:
            checks[name].append("the variants wrote different bytes")
    times: dict[str, dict[str, list[float]]] = {
        name: {"encode": [], "decode": []} for name in variants}
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            mod = variants[name]
            times[name]["encode"].append(per_record(mod.encode_columns, batches, n))
            times[name]["decode"].append(per_record(mod.decode_columns, frames[name], n))
    summary = {}
    for name in variants:
        row: dict[str, Any] = {"checks": checks[name],
                               "bytes_per_record": sum(map(len, frames[name])) / n}
        for step in ("encode", "decode"):
            values = times[name][step]
            row[step] = {"median": statistics.median(values), "min": min(values),
                         "max": max(values)}
        summary[name] = row
    results = {"rounds": rounds, "records": n, "before": BEFORE, "summary": summary}
    return finish(results, args.json, render)


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [*failed_checks_lines(results),
             f"#### Relay frames: {results['records']:,} records per round, "
             f"{results['rounds']} interleaved rounds (median µs per record, min–max)", "",
             "| relay | encode (worker) | decode (parent) | both | × before | bytes/record |",
             "|---|---|---|---|---|---|"]
    base = s.get("before")
    labels = {"now": "now, compiled writer (`_relaycols`)",
              "now_pure": "now, pure writer (no compiler)"}
    for name in ("before", "now", "now_pure"):
        if name not in s:
            continue
        row = s[name]
        both = row["encode"]["median"] + row["decode"]["median"]
        ratio = (f"{both / (base['encode']['median'] + base['decode']['median']):.2f}×"
                 if base else "")
        cells = [f"{row[k]['median']:.3f} ({row[k]['min']:.3f}–{row[k]['max']:.3f})"
                 for k in ("encode", "decode")]
        label = f"before (`{results['before']}`)" if name == "before" else labels[name]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {both:.3f} | {ratio} | "
                     f"{row['bytes_per_record']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
