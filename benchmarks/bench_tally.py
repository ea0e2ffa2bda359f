"""What the worker tally costs a timed block (issue 16): one store per block, in workers.

A relaying worker's timed blocks store their span ids in a shared file (`recorder.tally`), so
its parent can count exactly what a SIGKILL took. Only a relaying worker pays: `use_tally`
swaps `hierarchical_timer.__enter__` for `recorder._tallied_enter` (the same code plus the
store); the main process keeps the plain one. This compares the two, interleaved in ONE
process, with ``spans="all"``, the tally on a real shared file as in a worker:

    with t("a"):
        with t("b"):
            with t("c"):
                pass

Each round runs both variants once, in a shuffled order; the table shows the median and the
fastest round per block. Run ``python benchmarks/bench_tally.py [--rounds N] [--iterations N]``.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--iterations", type=int, default=50_000)
    args = parser.parse_args(argv)

    import otel_rl
    from otel_rl._internal import recorder, runtime, tallyfile
    from otel_rl.timers import hierarchical_timer as t

    out = tempfile.mkdtemp(prefix="bench-tally-")
    otel_rl.configure(output_dir=out, spans="all", max_buffer=10 ** 8, flush_interval=10 ** 6,
                      metrics=False)
    path = tallyfile.share("bench")
    variants = {"with store": recorder._tallied_enter,
                "without": recorder._untallied_enter}
    per_block: dict[str, list[float]] = {name: [] for name in variants}
    rt = runtime.active()
    assert rt is not None
    for _ in range(args.rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            recorder.hierarchical_timer.__enter__ = variants[name]  # type: ignore[method-assign]
            started = time.perf_counter_ns()
            for _ in range(args.iterations):
                with t("a"):
                    with t("b"):
                        with t("c"):
                            pass
            per_block[name].append((time.perf_counter_ns() - started) / (3 * args.iterations))
            rt.pipeline.buffer.clear()
    recorder.hierarchical_timer.__enter__ = variants["with store"]  # type: ignore[method-assign]
    with t("last"):  # stores the latest id: the rounds without the store drew ids too
        pass
    counted = recorder.tallied()
    expected = 3 * args.iterations * args.rounds * 2 + 1
    print(f"per timed block, {args.rounds} interleaved rounds (shared file tally: {path}):")
    medians = {name: statistics.median(values) for name, values in per_block.items()}
    fastest = {name: min(values) for name, values in per_block.items()}
    for name, value in medians.items():
        print(f"  {name:10s} {value:7.1f} ns median, {fastest[name]:7.1f} ns fastest round")
    delta = medians["with store"] - medians["without"]
    least = fastest["with store"] - fastest["without"]
    print(f"  difference {delta:+7.1f} ns median ({delta / medians['without']:+.1%}), "
          f"{least:+7.1f} ns fastest ({least / fastest['without']:+.1%})")
    otel_rl.shutdown()
    if path:
        tallyfile.remove(path)
    if counted != expected:
        print(f"bench_tally: the tally counted {counted} blocks, expected {expected}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
