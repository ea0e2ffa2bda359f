"""What the input boundary (issue 12) costs when a spans file is read.

Interleaved rounds in ONE process (each round runs every variant once, in a shuffled order),
median over rounds, ratios of medians. Every variant reads the same OTLP/JSON lines (the
Collector's file-exporter format, 1,000 spans a line, as otel_rl writes them):

- ``json.loads``: the lines parsed, nothing more (the floor, the anchor);
- ``before``: otel_rl's OTLP/JSON reader as it was before the boundary (``--baseline-rev``,
  read with ``git show``; skipped when git or the revision is not available);
- ``now``: the reader through the boundary (strict JSON with number hooks, every field's type
  and range, otel_rl's attributes), what ``otel-rl tree``/``report``/``replay`` run;
- ``now, + cycle check and tree``: also the parent-cycle check and the tree built.

    python benchmarks/bench_readers.py [--quick | --smoke] [--json FILE]

Exits 1 if a check fails (a variant read a different number of spans).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _report import failed_checks_lines, finish, module_at_revision  # noqa: E402

from otel_rl._internal import semconv  # noqa: E402
from otel_rl._internal.otlp.requests import request_to_json_line  # noqa: E402
from otel_rl._internal.otlp.spans import encode_spans  # noqa: E402
from otel_rl._internal.readers.otlp_json import parse_otlp_json_lines  # noqa: E402
from otel_rl._internal.readers.semantics import check_span_set  # noqa: E402
from otel_rl._internal.spandata import SpanData  # noqa: E402
from otel_rl._internal.treebuild import build_tree  # noqa: E402

SPANS_PER_LINE = 1000


def _load_baseline(rev: str) -> ModuleType | None:
    return module_at_revision(rev, "otel_rl/_internal/readers/otlp_json.py", "otel_rl_baseline_otlp_json")


def make_lines(n_spans: int) -> list[str]:
    """OTLP/JSON lines of a PPO-like run: env steps with policy and worker blocks."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    resource = {semconv.SERVICE_NAME: "bench", semconv.PROCESS_PID: 100, semconv.RUN_ID: "r"}
    t0 = 1_700_000_000_000_000_000
    spans = [SpanData(trace, f"{1:016x}", "", "run", t0, t0 + 10 * n_spans * 1000,
                      {semconv.KIND: semconv.KIND_RUN}, resource)]  # fmt: skip
    for i in range(1, n_spans):
        parent = spans[0].span_id if i % 4 == 1 else spans[i - 1 - (i - 1) % 4 + 1].span_id
        start = t0 + i * 1000
        spans.append(SpanData(trace, f"{i + 1:016x}", parent, ("env_step", "policy", "step", "update")[i % 4],
                              start, start + 900,
                              {semconv.THREAD_ID: 140000 + i % 3, semconv.THREAD_NAME: "MainThread"},
                              resource))  # fmt: skip
    return [
        request_to_json_line(encode_spans(spans[i : i + SPANS_PER_LINE])) + "\n"
        for i in range(0, len(spans), SPANS_PER_LINE)
    ]


def run(rounds: int, n_spans: int, baseline_rev: str) -> dict[str, Any]:
    lines = make_lines(n_spans)
    baseline = _load_baseline(baseline_rev)
    checks: list[str] = []

    def floor() -> int:
        return sum(len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for line in lines)

    def now() -> int:
        return len(parse_otlp_json_lines(lines, "bench"))

    def now_tree() -> int:
        spans = parse_otlp_json_lines(lines, "bench")
        check_span_set(spans, "bench")
        return sum(1 for _ in build_tree(spans).root.walk()) and len(spans)

    variants: dict[str, Callable[[], int]] = {"json.loads": floor}
    if baseline is not None:
        variants["before"] = lambda: len(baseline.parse_otlp_json_lines(lines, "bench"))
    variants["now"] = now
    variants["now, + cycle check and tree"] = now_tree
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            started = time.perf_counter()
            count = variants[name]()
            times[name].append(time.perf_counter() - started)
            if count != n_spans:
                checks.append(f"{name} read {count} spans, not {n_spans}")
    anchor = statistics.median(times["json.loads"])
    summary = {}
    for name, samples in times.items():
        median = statistics.median(samples)
        summary[name] = {
            "median_s": median,
            "us_per_span": median / n_spans * 1e6,
            "spans_per_s": n_spans / median,
            "x_json_loads": median / anchor,
            "checks": sorted(set(c for c in checks if c.startswith(name))),
        }
    if "before" in summary:
        for name in ("now", "now, + cycle check and tree"):
            summary[name]["x_before"] = summary[name]["median_s"] / summary["before"]["median_s"]
    return {
        "benchmark": "bench_readers",
        "python": platform.python_version(),
        "spans": n_spans,
        "bytes": sum(len(line) for line in lines),
        "rounds": rounds,
        "baseline_rev": baseline_rev if baseline is not None else None,
        "summary": summary,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"### Reading a spans file: {results['spans']:,} spans, {results['bytes'] / 1e6:.1f} MB, "
        f"median of {results['rounds']} interleaved rounds",
        "",
        "| variant | µs per span | spans/s | × json.loads | × before |",
        "|---|---|---|---|---|",
    ]
    for name, row in results["summary"].items():
        before = f"{row['x_before']:.2f}" if "x_before" in row else "-"
        lines.append(
            f"| {name} | {row['us_per_span']:.2f} | {row['spans_per_s']:,.0f} | "
            f"{row['x_json_loads']:.2f} | {before} |"
        )
    lines.extend(["", *failed_checks_lines(results)])
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and spans")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    parser.add_argument("--json", metavar="FILE", help="write the results here")
    parser.add_argument("--baseline-rev", default="ce8a7ba",
                        help="the revision whose reader is 'before' (default: the last one "
                        "without the input boundary)")  # fmt: skip
    args = parser.parse_args()
    rounds, n_spans = (2, 2_000) if args.smoke else (5, 30_000) if args.quick else (9, 100_000)
    return finish(run(rounds, n_spans, args.baseline_rev), args.json, render)


if __name__ == "__main__":
    raise SystemExit(main())
