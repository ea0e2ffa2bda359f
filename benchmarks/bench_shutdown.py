"""Shutdown under faulty collectors: how long `otel_rl.shutdown()` takes, against its deadline.

Runs the fault suite's workload (`tests/faults/workload.py`: a main process, 2 spawned workers
x 4 threads, 150 blocks per thread, 2,407 spans) once per collector behaviour, with
``shutdown_timeout=2``, and reads the workload's own measure of its ``shutdown()`` call and the
ledger its timers.json records. Behaviours: healthy; dead (nothing listens); never answers;
answers after 60 s; trickles its answer a byte every 2 s; answers once, then stalls on the
kept-alive connection; HTTP 503 with ``Retry-After: 8``.

Run ``python benchmarks/bench_shutdown.py [--json FILE]`` from the repository root; prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.collectors import collector, dead_endpoint
from tests.faults.helpers import run_workload, shutdown_time

CASES: list[tuple[str, dict[str, object] | None]] = [
    ("healthy", {"mode": "ok"}),
    ("dead", None),
    ("never answers", {"mode": "never"}),
    ("answers after 60 s", {"mode": "slow", "delay": 60.0}),
    ("trickles 1 byte / 2 s", {"mode": "trickle", "delay": 2.0}),
    ("stalls on kept-alive", {"mode": "slow", "delay": 60.0, "fast_first": 1}),
    ("503 Retry-After: 8", {"mode": "status", "status": 503, "retry_after": 8}),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the rows to this file")
    args = parser.parse_args()
    rows = []
    print("| collector | shutdown() (deadline 2 s) | run total | collector got | lost (reason) "
          "| sent, no answer (unconfirmed) |")
    print("|---|---|---|---|---|---|")
    for name, spec in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            if spec is None:
                proc, elapsed = run_workload(out, "--endpoint", dead_endpoint(),
                                             "--blocks", "150", "--shutdown-timeout", "2")
                got = 0
            else:
                with collector(**spec) as c:  # type: ignore[arg-type]
                    proc, elapsed = run_workload(out, "--endpoint", c.endpoint, "--blocks",
                                                 "150", "--shutdown-timeout", "2")
                    got = c.accepted
            meta = json.loads((out / "timers.json").read_text())["metadata"]
            book = json.loads(meta.get("otel_rl_ledger", "null") or "null")
            sink = book["sinks"]["otlp"] if book else {}
            lost, unconfirmed = sink.get("lost", {}), sink.get("unconfirmed", 0)
            took = shutdown_time(proc.stderr).removeprefix("shutdown took ")
            print(f"| {name} | {took} | {elapsed:.1f} s | {got} | {lost or 0} | {unconfirmed} |",
                  flush=True)
            rows.append({"collector": name, "shutdown": took, "run_s": round(elapsed, 2),
                         "collector_got": got, "lost": lost, "unconfirmed": unconfirmed})
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
