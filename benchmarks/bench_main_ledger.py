"""What counting a killed main process costs (issue 16), under ``otel-rl run`` only.

The main process then pays (1) the tally store per timed block, the same `_tallied_enter` a
relaying worker runs (`bench_tally.py` measures it), and (2) per batch, the ledger's counts
copied into a shared file (`mainledger.Mirror`): offered at hand-off, "sending" and
delivered per request or line. This measures (2), interleaved in one process: the ledger
calls one flush makes for one sink (offered, sending, delivered), with and without the mirror.
Without ``otel-rl run`` (no survivor) neither is paid. Run
``python benchmarks/bench_main_ledger.py [--rounds N] [--iterations N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args(argv)

    from otel_rl._internal.ledger import Ledger
    from otel_rl._internal.mainledger import Mirror

    plain, mirrored = Ledger(), Ledger()
    for ledger in (plain, mirrored):
        ledger.add_sink("file", "spans.otlp.jsonl")
    path = os.path.join(tempfile.mkdtemp(prefix="bench-main-ledger-"), "x.ledger")
    mirrored.attach(Mirror(path, {"pid": os.getpid()}))

    def flush(ledger: Ledger) -> float:
        started = time.perf_counter_ns()
        for _ in range(args.iterations):
            ledger.offered("file", 100)
            ledger.sending("file", 100)
            ledger.delivered("file", 100)
        return (time.perf_counter_ns() - started) / args.iterations

    results: dict[str, list[float]] = {"with mirror": [], "without": []}
    for _ in range(args.rounds):
        order = [("with mirror", mirrored), ("without", plain)]
        random.shuffle(order)
        for name, ledger in order:
            results[name].append(flush(ledger))
    print(f"per flush of one batch to one sink (3 ledger calls), {args.rounds} interleaved "
          "rounds:")
    for name, values in results.items():
        print(f"  {name:12s} {statistics.median(values):7.0f} ns median, "
              f"{min(values):7.0f} ns fastest round")
    diff = statistics.median(results["with mirror"]) - statistics.median(results["without"])
    print(f"  difference   {diff:+7.0f} ns median per flush and sink")
    os.unlink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
