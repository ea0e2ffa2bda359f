"""Offline tools on big spans files: time and peak memory of ``otel-rl tree`` and ``otel-rl
report --html`` against the number of spans (issue 9: ≤ 500 MB for 2 M spans, linear time).

For each size a spans file is recorded by a real run under ``spans="all"`` (3-deep nests of
empty blocks in a fresh process, every block a span: the biggest file a run makes), then each
command runs in a fresh process, and its wall time and peak RSS (``wait4``'s ``ru_maxrss``)
are taken. The tree each command gives must equal the run's timers.json exactly: numbers from a
wrong tree are not results.

Run ``python benchmarks/bench_long.py [--sizes 500000,1000000,2000000] [--json FILE]``
(about 3 minutes for the default sizes on 2 cores; ``--smoke`` for a check that it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from _report import failed_checks_lines, finish

MEMORY_LIMIT_MB = 500
RECORD = """
import sys, otel_rl
from otel_rl.timers import hierarchical_timer
nests = int(sys.argv[2])
otel_rl.configure(output_dir=sys.argv[1], spans="all", max_buffer=2_000_000, propagate=False,
                  flush_interval=1.0, shutdown_timeout=600)
for _ in range(nests):
    with hierarchical_timer("a"):
        with hierarchical_timer("b"):
            with hierarchical_timer("c"):
                pass
otel_rl.shutdown()
"""


def measure(argv: Sequence[str], cwd: str) -> dict[str, Any]:
    """Run `argv` in a fresh process; its exit status, wall seconds and peak RSS in MB."""
    started = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "wall_s": wall, "peak_mb": usage.ru_maxrss / 1024,
            "stderr": stderr[-500:]}


def run_size(nests: int, tmp: str) -> dict[str, Any]:
    out = os.path.join(tmp, f"run-{nests}")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", RECORD, out, str(nests)], check=True)
    record_s = time.perf_counter() - started
    spans_file = os.path.join(out, "spans.otlp.jsonl")
    with open(os.path.join(out, "timers.json"), encoding="utf-8") as f:
        written = json.load(f)
    rebuilt = os.path.join(tmp, "tree.json")
    html = os.path.join(tmp, "report.html")
    tree = measure([sys.executable, "-m", "otel_rl", "tree", spans_file, "-o", rebuilt], tmp)
    report = measure([sys.executable, "-m", "otel_rl", "report", spans_file, "--html", html], tmp)
    checks = []
    for name, result in (("tree", tree), ("report", report)):
        if result["rc"] != 0:
            checks.append(f"{nests * 3:,} spans: {name} exited {result['rc']}: {result['stderr']}")
        if result["peak_mb"] > MEMORY_LIMIT_MB:
            checks.append(f"{nests * 3:,} spans: {name} peaked at {result['peak_mb']:.0f} MB")
    if tree["rc"] == 0:
        with open(rebuilt, encoding="utf-8") as f:
            if json.load(f) != written:
                checks.append(f"{nests * 3:,} spans: the tree is not the run's timers.json")
    size_mb = os.path.getsize(spans_file) / 2**20
    shutil.rmtree(out, ignore_errors=True)
    return {"spans": 3 * nests + 2, "file_mb": size_mb, "record_s": record_s, "tree": tree,
            "report": report, "checks": checks}


def render(results: dict[str, Any]) -> str:
    rows = []
    for row in results["summary"].values():
        t, r = row["tree"], row["report"]
        rows.append(f"| {row['spans']:,} | {row['file_mb']:.0f} | {t['wall_s']:.1f} | "
                    f"{t['peak_mb']:.0f} | {r['wall_s']:.1f} | {r['peak_mb']:.0f} |")
    per_m = [(row["tree"]["wall_s"] / row["spans"] * 1e6) for row in results["summary"].values()]
    out = ["### Offline tools on `spans=all` files (fresh process per command)", "",
           "| spans | file MB | `tree` s | `tree` peak MB | `report --html` s | "
           "`report` peak MB |", "|---|---|---|---|---|---|", *rows, "",
           "`tree` seconds per million spans: " + ", ".join(f"{x:.1f}" for x in per_m) +
           f" (linear if flat). Memory limit: {MEMORY_LIMIT_MB} MB.", ""]
    out += failed_checks_lines(results)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="500000,1000000,2000000",
                        help="spans per file, comma-separated (3 per nest)")
    parser.add_argument("--smoke", action="store_true", help="one tiny file")
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args(argv)
    sizes = [3000] if args.smoke else [int(x) for x in args.sizes.split(",")]
    tmp = tempfile.mkdtemp(prefix="otel-rl-bench-long-")
    summary = {}
    try:
        for spans in sizes:
            print(f"bench_long: {spans:,} spans ...", flush=True)
            summary[str(spans)] = run_size(spans // 3, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish({"summary": summary}, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
