"""A Sample Factory `Timing` block in a worker thread: what the component switch costs.

    python benchmarks/bench_timing_switch.py [--quick] [--smoke] [--json FILE]

In a thread that is a parallel branch of the run (as Sample Factory's rollout workers are), a
named Timing's top-level block switches the thread to the Timing's component stack and back
(`otel_rl._internal.components`); a nested block does not. Measured: process CPU per
`with timing.add_time(key): pass`, top-level and nested, with `configure(spans="auto")`, for
otel_rl now and as it was at ``BEFORE`` (extracted from git into a temporary folder); each
measurement in a fresh interpreter, the variants interleaved over rounds, medians. The switch's
cost is top-level minus nested. Check: the whole-run tree counts every block under the
component.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from _report import failed_checks_lines, finish, package_at_revision
from bench_timing import CHILD  # the same worker-thread Timing blocks, measured in a child

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: The last revision before issue 19's change to the component switch.
BEFORE = "0c2e0b4"


def measure(src: str, n: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = src
    out = subprocess.run([sys.executable, "-c", CHILD, "any", "auto", str(n)], env=env,
                         capture_output=True, text=True, timeout=600,
                         cwd=tempfile.gettempdir())
    if out.returncode != 0:
        return {"error": out.stderr[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rounds, n = (1, 2000) if args.smoke else (5, 50000) if args.quick else (9, 100000)
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-switch-") as tmp:
        sources = {"now": ROOT}
        if package_at_revision(BEFORE, tmp):
            sources["before"] = tmp
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
        order = list(sources)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                rows[name].append(measure(sources[name], n))
    summary: dict[str, Any] = {}
    for name, runs in rows.items():
        good = [r for r in runs if "error" not in r]
        checks = sorted({f"{name}: {r['error']}" for r in runs if "error" in r})
        checks += [f"{name}: blocks missing from timers.json: {r['counts']}" for r in good
                   if r["counts"] != [n + 1000, n + 1000]]  # (1,000 warm-up blocks each)
        row: dict[str, Any] = {"checks": checks}
        for key in ("top", "nested"):
            values = [r[key] for r in good] or [0.0]
            row[key] = {"median": statistics.median(values), "min": min(values),
                        "max": max(values)}
        switch = [r["top"] - r["nested"] for r in good] or [0.0]
        row["switch"] = {"median": statistics.median(switch), "min": min(switch),
                         "max": max(switch)}
        summary[name] = row
    return finish({"rounds": rounds, "blocks": n, "before": BEFORE, "summary": summary},
                  args.json, render)


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [*failed_checks_lines(results),
             f"#### A named Timing's block in a worker thread, `spans=auto` ({results['blocks']:,}"
             f" blocks, {results['rounds']} interleaved rounds, fresh interpreter each; median "
             "CPU µs per block, min–max)", "",
             "| otel_rl | top-level block | nested block | the switch (top − nested) |",
             "|---|---|---|---|"]
    for name in ("before", "now"):
        if name in s:
            label = f"before (`{results['before']}`)" if name == "before" else "now"
            cells = [f"{s[name][k]['median']:.3f} ({s[name][k]['min']:.3f}–"
                     f"{s[name][k]['max']:.3f})" for k in ("top", "nested", "switch")]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
