"""Hot-path cost of one timed block, and memory per buffered span, against two anchors.

Every variant times the same 3-deep nest of empty blocks::

    with t("a"):
        with t("b"):
            with t("c"):
                pass

and reports the cost per block = time / (3 x iterations). Rounds are interleaved in ONE
process (each round runs every variant once, in a shuffled order) so that machine noise hits
all variants alike; the table shows the median over rounds and the ratio of medians.

Variants:

- ``mlagents``: the real ``mlagents_envs.timers.hierarchical_timer`` (anchor 1);
- ``otel_sdk``: the raw OTel SDK, ``TracerProvider`` + ``BatchSpanProcessor(OTLPSpanExporter)``
  to the local receiver, ``start_as_current_span`` per block (anchor 2; its own provider);
- ``auto``: otel_rl, ``spans="auto"``, exporting over OTLP/HTTP to the local receiver;
- ``all``: otel_rl, ``spans="all"``, every block exported; CPU is measured for the loop plus
  the final ``otel_rl.shutdown()`` flush, and every span must reach the receiver;
- ``off``: otel_rl, ``spans="off"``: no block spans, only the run span and aggregates;
- ``disabled``: otel_rl configured with ``disabled=True``;
- ``unconfigured``: otel_rl's ``hierarchical_timer`` used as a plain drop-in.

Memory per buffered span is measured in fresh child processes (one per variant and method):
otel_rl with ``spans="all"`` holding records (huge ``flush_interval``, files only) against the
SDK's ``BatchSpanProcessor`` holding ``ReadableSpan`` objects (huge schedule delay and queue).

Run ``python benchmarks/bench_core.py [--quick] [--json FILE]``. It exits 1 if a check fails
(spans missing or dropped, wrong timer counts): numbers from an incomplete run are not results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from _receiver import ReceiverProcess
from _report import failed_checks_lines, finish

NEST = 3  # blocks per iteration
#: (variant, label) in table order.
VARIANTS = (
    ("mlagents", "anchor 1: ML-Agents `hierarchical_timer`"),
    ("otel_sdk", "anchor 2: OTel SDK `start_as_current_span` + BatchSpanProcessor + OTLP"),
    ("auto", "(a) otel_rl `spans=auto`, OTLP/HTTP"),
    ("all", "(b) otel_rl `spans=all`, OTLP/HTTP"),
    ("off", "(b2) otel_rl `spans=off` (aggregates only), OTLP/HTTP"),
    ("disabled", "(c) otel_rl `disabled=True`"),
    ("unconfigured", "(e) otel_rl unconfigured (plain drop-in)"),
)
#: Targets as (metric, limit, aim) in multiples of ML-Agents.
TARGETS = {
    "auto": ("wall", 1.0, 0.6),
    "all": ("cpu_total", 3.0, 1.5),
    "disabled": ("wall", 0.5, None),
}


def nest_loop(timer: Callable[[str], Any], n: int) -> None:
    """The measured workload: `n` 3-deep nests of empty blocks."""
    for _ in range(n):
        with timer("a"):
            with timer("b"):
                with timer("c"):
                    pass


# --- one round of one variant -------------------------------------------------------------------

def _measure(loop: Callable[[], None], finish: Callable[[], None] | None = None) -> dict[str, Any]:
    """Wall and process CPU (all threads) of `loop`, then CPU including `finish` (the flush);
    and the CPU of the loop's own thread (the training thread: without the flush thread's)."""
    gc.collect()
    w0, c0, t0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    loop()
    w1, c1, t1 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    if finish is not None:
        finish()
    c2 = time.process_time_ns()
    return {"wall_ns": w1 - w0, "cpu_ns": c1 - c0, "cpu_total_ns": c2 - c0,
            "thread_ns": t1 - t0}


def run_mlagents(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    from mlagents_envs import timers

    timers.reset_timers()
    result = _measure(lambda: nest_loop(timers.hierarchical_timer, n))
    count = timers.get_timer_tree()["children"]["a"]["children"]["b"]["children"]["c"]["count"]
    result["checks"] = [] if count == n else [f"ML-Agents counted {count} blocks, expected {n}"]
    return result


def run_otel_sdk(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(shutdown_on_exit=False)
    # A queue that holds every span: the SDK drops silently when it is full, and this anchor
    # should pay for exporting everything, as (b) does.
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces"),
        max_queue_size=max(2048, NEST * n + 16)))
    tracer = provider.get_tracer("bench")
    before = receiver.spans()
    result = _measure(lambda: nest_loop(tracer.start_as_current_span, n), provider.shutdown)
    expected = NEST * n
    received = receiver.wait_for(before + expected) - before
    result.update(expected=expected, received=received)
    result["checks"] = [] if received == expected else [
        f"OTel SDK: receiver got {received} spans, expected {expected}"]
    return result


def _otel_rl_round(n: int, receiver: ReceiverProcess, **settings: Any) -> dict[str, Any]:
    import otel_rl
    from otel_rl._internal import runtime
    from otel_rl.timers import hierarchical_timer, reset_timers

    reset_timers()
    if settings:
        otel_rl.configure(**settings)
    rt = runtime.current()
    before = receiver.spans()
    result = _measure(lambda: nest_loop(hierarchical_timer, n),
                      (lambda: otel_rl.shutdown(120.0)) if settings else None)
    if settings:
        assert rt is not None
        result["dropped"] = rt.dropped_total() + sum(rt.stats.dropped.values())
        result["exported"] = sum(rt.stats.exported.values())
        spans_on = not settings.get("disabled")
        # Sampled (`auto`) runs send what they kept: the exporter's own count is the truth.
        # `all`: every block, the run span and the aggregate span.
        expected = (NEST * n + 2) if settings.get("spans") == "all" else result["exported"]
        result["received"] = (receiver.wait_for(before + expected) - before) if spans_on else 0
        result["expected"] = expected if spans_on else 0
    from otel_rl.timers import get_timer_tree

    tree = get_timer_tree()
    count = tree["children"]["a"]["children"]["b"]["children"]["c"]["count"]
    checks = [] if count == n else [f"otel_rl counted {count} blocks, expected {n}"]
    if result.get("received", 0) != result.get("expected", 0):
        checks.append(f"receiver got {result['received']} spans, expected {result['expected']}")
    if result.get("dropped"):
        checks.append(f"otel_rl dropped {result['dropped']} spans")
    result["checks"] = checks
    return result


def _otlp(receiver: ReceiverProcess, n: int) -> dict[str, Any]:
    return {"endpoint": receiver.http_endpoint, "protocol": "http/protobuf",
            "max_buffer": max(500_000, 2 * NEST * n), "shutdown_timeout": 120.0}


def run_auto(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    return _otel_rl_round(n, receiver, spans="auto", **_otlp(receiver, n))


def run_all(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    return _otel_rl_round(n, receiver, spans="all", **_otlp(receiver, n))


def run_off(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    return _otel_rl_round(n, receiver, spans="off", **_otlp(receiver, n))


def run_disabled(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    return _otel_rl_round(n, receiver, disabled=True)


def run_unconfigured(n: int, receiver: ReceiverProcess) -> dict[str, Any]:
    from otel_rl._internal import runtime

    rt = runtime.current()
    assert rt is None or rt.closed, "otel_rl must not be active for the unconfigured variant"
    return _otel_rl_round(n, receiver)


RUNNERS: dict[str, Callable[[int, ReceiverProcess], dict[str, Any]]] = {
    "mlagents": run_mlagents, "otel_sdk": run_otel_sdk, "auto": run_auto, "all": run_all,
    "off": run_off,
    "disabled": run_disabled, "unconfigured": run_unconfigured,
}


# --- memory per buffered span (in a fresh child process per measurement) ------------------------

def _memory_child(kind: str, method: str, nests: int, endpoint: str) -> dict[str, Any]:
    import psutil

    def used() -> int:
        if method == "tracemalloc":
            return tracemalloc.get_traced_memory()[0]
        return int(psutil.Process().memory_info().rss)

    import tracemalloc

    tmp = tempfile.mkdtemp(prefix="otel-rl-bench-")
    try:
        if kind == "otel_rl":
            import otel_rl
            from otel_rl._internal import runtime
            from otel_rl.timers import hierarchical_timer

            otel_rl.configure(spans="all", output_dir=tmp, flush_interval=3600.0,
                              max_buffer=NEST * nests + 1000, propagate=False)
            rt = runtime.current()
            assert rt is not None
            buffer = rt.pipeline.buffer
            nest_loop(hierarchical_timer, 10)  # tree nodes exist before the measurement
            timer: Callable[[str], Any] = hierarchical_timer
            held: Callable[[], int] = lambda: len(buffer)  # noqa: E731
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(shutdown_on_exit=False)
            size = max(2048, NEST * nests + 1000)
            # Export only when the queue is full (never, here): every span stays queued.
            processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"),
                                           max_queue_size=size, max_export_batch_size=size,
                                           schedule_delay_millis=3.6e6)
            provider.add_span_processor(processor)
            tracer = provider.get_tracer("bench")
            queue = processor._batch_processor._queue
            nest_loop(tracer.start_as_current_span, 10)
            timer = tracer.start_as_current_span
            held = lambda: len(queue)  # noqa: E731
        gc.collect()
        if method == "tracemalloc":
            tracemalloc.start()
        base, held0 = used(), held()
        nest_loop(timer, nests)
        gc.collect()
        grown, n = used() - base, held() - held0
        if method == "tracemalloc":
            tracemalloc.stop()
        if kind == "otel_rl":
            buffer.clear()  # the export path is measured elsewhere; skip writing the file
            otel_rl.shutdown(30.0)
        else:
            queue.clear()
            provider.shutdown()
        return {"kind": kind, "method": method, "spans": n, "bytes": grown,
                "bytes_per_span": grown / n if n else float("nan")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_memory(nests: int, endpoint: str) -> list[dict[str, Any]]:
    rows = []
    for kind in ("otel_rl", "otel_sdk"):
        for method in ("tracemalloc", "rss"):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--memory-child", kind, method,
                 "--mem-nests", str(nests), "--endpoint", endpoint],
                capture_output=True, text=True, timeout=600, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"memory child {kind}/{method} failed:\n{out.stderr}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def bytes_per_span(nests: int) -> dict[str, float]:
    """Bytes per exported span of the nest workload's real records, as OTLP protobuf (what
    goes over the wire, uncompressed and gzip) and as OTLP/JSON (the spans file)."""
    import gzip

    import otel_rl
    from otel_rl._internal import runtime
    from otel_rl._internal.otlp import records as otlp_encode
    from otel_rl._internal.otlp.records import Batch
    from otel_rl.timers import hierarchical_timer

    tmp = tempfile.mkdtemp(prefix="otel-rl-bench-")
    try:
        otel_rl.configure(spans="all", output_dir=tmp, flush_interval=3600.0,
                          max_buffer=NEST * nests + 1000, propagate=False)
        rt = runtime.current()
        assert rt is not None
        nest_loop(hierarchical_timer, nests)
        records = list(rt.pipeline.buffer)
        rt.pipeline.buffer.clear()
        batch = [Batch(rt.resource, rt.offset_ns, records, dict(rt.thread_names))]
        proto = otlp_encode.encode_batches(batch, otlp_encode.Encoder())
        text = otlp_encode.JsonEncoder().request_line(batch)
        otel_rl.shutdown(30.0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(records)
    return {"spans": n, "protobuf": len(proto) / n, "protobuf_gzip": len(gzip.compress(proto)) / n,
            "json": len(text.encode()) / n}


# --- rounds and the report ----------------------------------------------------------------------

def run(nests: int, sdk_nests: int, rounds: int, mem_nests: int, seed: int,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Interleave `rounds` rounds of every variant; returns the raw samples and the summary."""
    rng = random.Random(seed)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in VARIANTS}
    with ReceiverProcess() as receiver:
        # Warm-up: imports, first connections, code paths; not recorded.
        for name, _ in VARIANTS:
            RUNNERS[name](max(1, min(nests, sdk_nests) // 10), receiver)
        for r in range(rounds):
            order = [name for name, _ in VARIANTS]
            rng.shuffle(order)
            for name in order:
                n = sdk_nests if name == "otel_sdk" else nests
                result = RUNNERS[name](n, receiver)
                result["blocks"] = NEST * n
                samples[name].append(result)
            log(f"  round {r + 1}/{rounds} done ({', '.join(order)})")
        memory = measure_memory(mem_nests, receiver.http_endpoint)
    wire = bytes_per_span(mem_nests)
    return {"wire": wire, "config": {"nests": nests, "sdk_nests": sdk_nests, "rounds": rounds,
                       "mem_nests": mem_nests, "seed": seed, "blocks_per_nest": NEST},
            "environment": environment(),
            "samples": samples, "summary": summarize(samples), "memory": memory}


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per variant: median (and min, max) over rounds of each metric per block, in µs."""
    summary: dict[str, dict[str, Any]] = {}
    for name, rounds in samples.items():
        row: dict[str, Any] = {"checks": sorted({c for s in rounds for c in s["checks"]})}
        for metric in ("wall", "cpu", "cpu_total"):
            per_block = [s[f"{metric}_ns"] / s["blocks"] / 1000 for s in rounds]
            row[metric] = {"median": statistics.median(per_block), "min": min(per_block),
                           "max": max(per_block)}
        for key in ("received", "expected", "dropped"):
            if rounds and key in rounds[0]:
                row[key] = sum(s[key] for s in rounds)
        summary[name] = row
    base = summary["mlagents"]
    for row in summary.values():
        for metric in ("wall", "cpu", "cpu_total"):
            row[metric]["ratio"] = row[metric]["median"] / base[metric]["median"]
    # (b) is judged against ML-Agents' loop CPU (ML-Agents has nothing to flush).
    row_all = summary["all"]
    row_all["cpu_total"]["ratio"] = row_all["cpu_total"]["median"] / base["cpu"]["median"]
    sdk = summary["otel_sdk"]
    sdk["cpu_total"]["ratio"] = sdk["cpu_total"]["median"] / base["cpu"]["median"]
    return summary


def environment() -> dict[str, Any]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for dist in ("opentelemetry-sdk", "mlagents-envs", "protobuf"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "versions": versions}


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ratio: float, limit: float | None, aim: float | None) -> str:
    if limit is None:
        return ""
    if ratio > limit:
        return f"**over** target ≤ {limit:g}×"
    if aim is not None and ratio <= aim:
        return f"meets aim ≤ {aim:g}×"
    return f"meets target ≤ {limit:g}×" + (f" (aim {aim:g}×)" if aim else "")


def _fmt(stat: dict[str, float]) -> str:
    return f"{stat['median']:.3f} ({stat['min']:.3f}–{stat['max']:.3f})"


def render(results: dict[str, Any]) -> str:
    """The markdown tables for a `run` result."""
    s, cfg = results["summary"], results["config"]
    out = [f"### Per timed block, 3-deep nests of empty blocks "
           f"({cfg['rounds']} interleaved rounds; {cfg['nests']:,} nests per round, "
           f"{cfg['sdk_nests']:,} for the OTel SDK)", "",
           "Median µs per block (min–max over rounds); ratio of medians to ML-Agents.", ""]
    rows = []
    for name, label in VARIANTS:
        row = s[name]
        metric, limit, aim = TARGETS.get(name, ("wall", None, None))
        cpu = "cpu_total" if name in ("all", "otel_sdk") else "cpu"
        rows.append([label, _fmt(row["wall"]), f"{row['wall']['ratio']:.2f}×", _fmt(row[cpu]),
                     f"{row[cpu]['ratio']:.2f}×", verdict(row[metric]["ratio"], limit, aim)])
    out.append(markdown_table(
        ["variant", "wall µs/block", "wall ×", "CPU µs/block †", "CPU ×", "target"], rows))
    out += ["", "† process CPU of all threads (`time.process_time`); for the two exporting "
            "variants (`spans=all`, OTel SDK) it covers the loop plus the final flush "
            "(`otel_rl.shutdown()` / `provider.shutdown()`) and is compared with ML-Agents' "
            "loop CPU; for the others it covers the loop.", ""]
    wall = {name: s[name]["wall"]["median"] for name in ("auto", "all", "off")}
    out += [f"`auto` costs {wall['auto'] / wall['all']:.2f}× what `all` costs per block (wall), "
            f"`off` {wall['off'] / wall['all']:.2f}×.", ""]
    span_rows = []
    for name in ("otel_sdk", "auto", "all", "off"):
        row = s[name]
        span_rows.append([name, f"{row.get('received', 0):,}", f"{row.get('expected', 0):,}",
                          f"{row.get('dropped', 0):,}",
                          "ok" if not row["checks"] else "; ".join(row["checks"])])
    out.append(markdown_table(["variant", "spans received", "expected", "dropped", "check"],
                              span_rows))
    out += ["", "`expected` for `auto` and `off` is what otel_rl reports it exported (`auto` "
            "keeps whole time windows on a schedule, each within the 10,000-span budget; `off` "
            "only the run and aggregate spans); for `all` it is every block plus the run and "
            "aggregate spans, summed over rounds.", ""]
    wire = results.get("wire")
    if wire:
        out += [f"### Bytes per exported span ({wire['spans']:,} spans of the nest workload)", "",
                markdown_table(["OTLP protobuf", "OTLP protobuf, gzip", "OTLP/JSON (spans file)"],
                               [[f"{wire['protobuf']:.0f}", f"{wire['protobuf_gzip']:.0f}",
                                 f"{wire['json']:.0f}"]]), ""]
    mem = {(m["kind"], m["method"]): m for m in results["memory"]}
    mem_rows = []
    for kind, label in (("otel_rl", "otel_rl record in the buffer"),
                        ("otel_sdk", "OTel SDK `ReadableSpan` in the BatchSpanProcessor queue")):
        t, r = mem[(kind, "tracemalloc")], mem[(kind, "rss")]
        mem_rows.append([label, f"{t['spans']:,}", f"{t['bytes_per_span']:.0f}",
                         f"{r['bytes_per_span']:.0f}"])
    ratio = mem[("otel_sdk", "tracemalloc")]["bytes_per_span"] / mem[("otel_rl", "tracemalloc")][
        "bytes_per_span"]
    out += [f"### (d) Memory per buffered span ({cfg['mem_nests']:,} nests, fresh process each)",
            "", markdown_table(["held", "spans", "bytes/span (tracemalloc)", "bytes/span (RSS Δ)"],
                               mem_rows),
            "", f"The SDK holds {ratio:.1f}× the memory per buffered span.", ""]
    out += failed_checks_lines(results)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes: checks that the benchmark runs, measures nothing")
    parser.add_argument("--nests", type=int, help="nests per round (default 100,000; quick 20,000)")
    parser.add_argument("--sdk-nests", type=int, help="nests per round for the OTel SDK "
                        "(default 10,000; quick 2,000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 7; quick 3)")
    parser.add_argument("--mem-nests", type=int, help="nests for the memory measurement "
                        "(default 20,000; quick 5,000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the shuffled round order")
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--memory-child", nargs=2, metavar=("KIND", "METHOD"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        kind, method = args.memory_child
        print(json.dumps(_memory_child(kind, method, args.mem_nests, args.endpoint)))
        return 0
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    nests = args.nests or {"smoke": 300, "quick": 20_000, "full": 100_000}[size]
    sdk_nests = args.sdk_nests or {"smoke": 100, "quick": 2_000, "full": 10_000}[size]
    rounds = args.rounds or {"smoke": 1, "quick": 3, "full": 7}[size]
    mem_nests = args.mem_nests or {"smoke": 300, "quick": 5_000, "full": 20_000}[size]
    print(f"bench_core: {rounds} rounds of {nests:,} nests ({sdk_nests:,} for the OTel SDK)",
          flush=True)
    results = run(nests, sdk_nests, rounds, mem_nests, args.seed,
                  log=lambda m: print(m, flush=True))
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
