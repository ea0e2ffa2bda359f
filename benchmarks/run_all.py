"""Run every benchmark, print their markdown tables, write ``benchmarks/results/latest.json``.

    python benchmarks/run_all.py            # full run: about 2 minutes on 2 cores
    python benchmarks/run_all.py --quick    # fewer rounds and iterations: under a minute

Each benchmark runs in its own interpreter (a fresh process, nothing shared between them).
The exit status is 1 if any benchmark failed or one of its checks did (spans missing or
dropped, wrong timer counts): then the JSON records the failure and no result is complete.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ("bench_core", "bench_workers", "bench_gpu", "bench_readers", "bench_metrics",
              "bench_relay", "bench_timing_switch", "bench_timing", "bench_windows",
              "bench_launcher")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                             capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None


def run_one(name: str, extra_args: Sequence[str]) -> tuple[int, dict[str, Any] | None, str]:
    """Run one benchmark script, streaming its output; returns (exit status, results, output)."""
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as tmp:
        path = os.path.join(tmp, f"{name}.json")
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, f"{name}.py"),
                                 "--json", path, *extra_args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        status = proc.wait()
        results = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                results = json.load(f)
    return status, results, "".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes: checks that the benchmarks run, measures nothing")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "latest.json"),
                        help="where to write the results (default: benchmarks/results/latest.json)")
    args = parser.parse_args(argv)
    extra = ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
    started = time.time()
    combined: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "size": "smoke" if args.smoke else "quick" if args.quick else "full", "git_commit": _git_commit(), "benchmarks": {}}
    failed = []
    for name in BENCHMARKS:
        print(f"\n## {name}\n", flush=True)
        status, results, output = run_one(name, extra)
        combined["benchmarks"][name] = {"exit_status": status, "results": results,
                                        "output": output}
        if status != 0:
            failed.append(f"{name} (exit status {status})")
    combined["seconds"] = round(time.time() - started, 1)
    combined["failed"] = failed
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(combined, f, indent=2)
    print(f"\nwrote {args.output} ({combined['seconds']} s)")
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
