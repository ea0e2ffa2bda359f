"""GPU timing (issue 11): what it costs, and — on a CUDA machine — what it shows.

Part 1, runs anywhere (no GPU needed). Cost per timed block of the same 3-deep nest of empty
blocks as bench_core, interleaved rounds in ONE process (each round runs every variant once,
in a shuffled order), median over rounds, ratios of medians:

- ``mlagents``: the real ``mlagents_envs.timers.hierarchical_timer`` (anchor);
- ``before``: otel_rl's recorder as it was before GPU timing (``--baseline-rev``, read with
  ``git show``; skipped when git or the revision is not available);
- ``now``: otel_rl's recorder now, no GPU setting (the default);
- ``now, gpu_blocks set``: ``gpu_blocks`` names other blocks, so every block pays the
  per-construction check and none is opted in;
- ``opted in, device double``: all three blocks ``gpu=True`` on tests/gpu_double.py's
  simulated device (events complete as soon as they are recorded, so the resolver thread runs
  too): otel_rl's host-side cost per opted-in block, without a GPU;
- ``opted in, null device``: the same with events that do nothing (otel_rl's own logic only).

Part 2, ``--cuda`` (needs torch with CUDA): the issue's table. A 4096x4096 matmul forward,
backward, SGD step and ``loss.item()`` (``after_optimizer``), 50 iterations, every phase a
``hierarchical_timer(..., gpu=True)``: the CPU column is otel_rl's wall time, the GPU column is
otel_rl's own GPU time (what the tree view and timers.json show), and a reference column times
the same phases with hand-made CUDA event pairs and a final synchronize. Then the per-block
cost of an empty opted-in block against an empty plain one on the real device.

    python benchmarks/bench_gpu.py [--quick | --smoke] [--json FILE]
    python benchmarks/bench_gpu.py --cuda          # on a machine with a CUDA GPU

Exits 1 if a check fails (wrong counts, GPU time not resolved).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _report import failed_checks_lines, finish, module_at_revision  # noqa: E402

from otel_rl import timers  # noqa: E402, F401 (plugs GPU timing into the recorder)
from otel_rl._internal import gpu, recorder  # noqa: E402

Timer = Callable[..., Any]


def _load_baseline(rev: str) -> ModuleType | None:
    return module_at_revision(rev, "otel_rl/_internal/recorder.py", "otel_rl_baseline_recorder")


class _NullEvent:
    __slots__ = ()

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class _NullStream:
    device_index = 0


class NullDevice:
    """Events that cost nothing: what is left is otel_rl's own bookkeeping."""

    _stream = _NullStream()

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def current_stream(self) -> _NullStream:
        return self._stream

    def Event(self, enable_timing: bool = False) -> _NullEvent:  # torch's name
        return _NullEvent()


def nest(timer: Timer, n: int, **kw: Any) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with timer("a", **kw):
            with timer("b", **kw):
                with timer("c", **kw):
                    pass
    return time.perf_counter_ns() - t0


def part1(rounds: int, n: int, baseline_rev: str) -> dict[str, Any]:
    from mlagents_envs import timers as mlagents_timers

    from tests.gpu_double import FakeCuda

    baseline = _load_baseline(baseline_rev)
    double = FakeCuda()
    null = NullDevice()
    checks: list[str] = []

    def plain(t: Timer) -> Callable[[], int]:
        return lambda: nest(t, n)

    def gpu_blocks_set() -> int:
        gpu.configure(("forward", "backward"), 10.0)
        try:
            return nest(recorder.hierarchical_timer, n)
        finally:
            gpu.configure((), 10.0)

    def opted_in(api: Any) -> Callable[[], int]:
        def run() -> int:
            gpu.use_api(api)
            try:
                return nest(recorder.hierarchical_timer, n, gpu=True)
            finally:
                deadline = time.monotonic() + 10
                while gpu.outstanding() and time.monotonic() < deadline:
                    time.sleep(0.001)
                if gpu.outstanding():
                    checks.append("GPU time of opted-in blocks was not resolved within 10 s")
                gpu.use_api(None)
        return run

    variants: dict[str, Callable[[], int]] = {"mlagents": plain(mlagents_timers.hierarchical_timer)}
    if baseline is not None:
        variants["before"] = plain(baseline.hierarchical_timer)
    variants["now"] = plain(recorder.hierarchical_timer)
    variants["now, gpu_blocks set"] = gpu_blocks_set
    variants["opted in, device double"] = opted_in(double)
    variants["opted in, null device"] = opted_in(null)
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm-up
        fn()
    for _ in range(rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            gc.collect()
            samples[name].append(variants[name]() / (3 * n))
    # Four variants (warm-up included) ran otel_rl's blocks on this thread's stack, two of
    # them opted in: every block counted, every opted-in one resolved.
    runs = (rounds + 1) * n
    a = recorder.thread_stack().root.children["a"]
    if a.count != 4 * runs:
        checks.append(f"otel_rl counted {a.count} 'a' blocks, expected {4 * runs}")
    if a.gpu_count != 2 * runs:
        checks.append(f"{a.gpu_count} opted-in 'a' blocks have GPU time, expected {2 * runs}")
    anchor = statistics.median(samples["mlagents"])
    before = statistics.median(samples["before"]) if "before" in samples else None
    before_min = min(samples["before"]) if "before" in samples else None
    rows = {}
    for name, values in samples.items():
        med = statistics.median(values)
        # The fastest round too: on a shared machine it is the least disturbed one.
        rows[name] = {"ns_per_block": med, "min_ns_per_block": min(values),
                      "vs_mlagents": med / anchor,
                      "vs_before": (med / before) if before else None,
                      "min_vs_before": (min(values) / before_min) if before_min else None,
                      "checks": list(checks)}
    return {"rounds": rounds, "iterations": n, "baseline_rev": baseline_rev if baseline else None,
            "summary": rows}


def part2(iterations: int, size: int) -> dict[str, Any]:
    import torch

    import otel_rl
    from otel_rl._internal.tree import Tree
    from otel_rl.renderers import treeview
    from otel_rl.timers import hierarchical_timer

    if not torch.cuda.is_available():
        raise SystemExit("--cuda needs torch with a CUDA device")
    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(size, size, device=device)
    w = torch.randn(size, size, device=device, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    phases = ("forward", "backward", "update", "after_optimizer")

    def step(timer: Callable[[str], Any]) -> None:
        with timer("forward"):
            loss = (x @ w).square().mean()
        with timer("backward"):
            loss.backward()
        with timer("update"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        with timer("after_optimizer"):
            loss.item()

    for _ in range(5):  # warm-up: cuBLAS handles, allocator
        step(lambda name: hierarchical_timer(name))
    torch.cuda.synchronize()

    # Reference: hand-made event pairs around the same phases, read after a synchronize.
    class Manual:
        def __init__(self) -> None:
            self.pairs: dict[str, list[tuple[Any, Any]]] = {p: [] for p in phases}
            self.name = ""

        def __call__(self, name: str) -> Manual:
            self.name = name
            return self

        def __enter__(self) -> None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.pairs[self.name].append((start, end))

        def __exit__(self, *exc: Any) -> None:
            self.pairs[self.name][-1][1].record()

    manual = Manual()
    for _ in range(iterations):
        step(manual)
    torch.cuda.synchronize()
    reference = {p: sum(s.elapsed_time(e) for s, e in manual.pairs[p]) / 1e3 for p in phases}

    out = tempfile.mkdtemp(prefix="otel-rl-gpu-")
    otel_rl.configure(output_dir=out, gpu_blocks=list(phases))
    with hierarchical_timer("train"):
        for _ in range(iterations):
            step(lambda name: hierarchical_timer(name))
    otel_rl.shutdown()
    with open(os.path.join(out, "timers.json"), encoding="utf-8") as f:
        tree = Tree.from_json(f.read())
    checks = []
    table = {}
    for p in phases:
        node = tree.find(["train", p])
        if node is None or node.gpu_count != iterations:
            checks.append(f"{p}: GPU time for {0 if node is None else node.gpu_count} of "
                          f"{iterations} runs")
            continue
        table[p] = {"cpu_s": node.total, "gpu_s": node.gpu_total, "reference_gpu_s": reference[p]}

    # Per-block cost on the real device: empty opted-in vs empty plain blocks, interleaved.
    def empty(gpu_on: bool, n: int = 2000) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            with hierarchical_timer("empty", gpu=gpu_on):
                pass
        return (time.perf_counter_ns() - t0) / n

    cost: dict[str, list[float]] = {"plain": [], "gpu": []}
    for _ in range(15):
        for key in random.sample(list(cost), 2):
            cost[key].append(empty(key == "gpu"))
    deadline = time.monotonic() + 30
    while gpu.outstanding() and time.monotonic() < deadline:
        time.sleep(0.01)
    per_block = {k: statistics.median(v) for k, v in cost.items()}
    return {"iterations": iterations, "size": size, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "table": table, "per_block_ns": per_block,
            "tree_view": treeview.render(tree), "checks": checks,
            "summary": {"cuda": {"checks": checks}}}


def render(results: dict[str, Any]) -> str:
    lines = []
    p1 = results.get("part1")
    if p1:
        lines += [f"### Per timed block: GPU timing off and opted in ({p1['rounds']} rounds × "
                  f"{p1['iterations']} × 3 blocks, median; {results['machine']})", "",
                  "| variant | ns / block | × ML-Agents | × otel_rl before | fastest round: ns "
                  "| × before |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, row in p1["summary"].items():
            before = f"{row['vs_before']:.3f}" if row["vs_before"] else "–"
            min_before = f"{row['min_vs_before']:.3f}" if row["min_vs_before"] else "–"
            lines.append(f"| {name} | {row['ns_per_block']:.0f} | {row['vs_mlagents']:.2f} "
                         f"| {before} | {row['min_ns_per_block']:.0f} | {min_before} |")
        lines += failed_checks_lines(p1)
    p2 = results.get("part2")
    if p2:
        lines += ["", f"### GPU time per block ({p2['device']}, torch {p2['torch']}, "
                      f"{p2['size']}×{p2['size']}, {p2['iterations']} iterations)", "",
                  "| block | otel_rl CPU | otel_rl GPU column | reference CUDA events |",
                  "|---|---:|---:|---:|"]
        for name, row in p2["table"].items():
            lines.append(f"| {name} | {row['cpu_s']:.3f} s | {row['gpu_s']:.3f} s "
                         f"| {row['reference_gpu_s']:.3f} s |")
        pb = p2["per_block_ns"]
        lines += ["", f"Empty block: plain {pb['plain'] / 1e3:.2f} µs, opted in "
                      f"{pb['gpu'] / 1e3:.2f} µs (+{(pb['gpu'] - pb['plain']) / 1e3:.2f} µs).",
                  "", "```", p2["tree_view"].rstrip(), "```"]
        lines += failed_checks_lines(p2)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--cuda", action="store_true", help="also part 2 (needs a CUDA GPU)")
    parser.add_argument("--baseline-rev", default="8df71c6^",
                        help="otel_rl revision before GPU timing (default: 8df71c6^)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rounds, n = (3, 200) if args.smoke else (15, 5000) if args.quick else (31, 10000)
    results: dict[str, Any] = {"machine": f"Python {platform.python_version()}, "
                                          f"{os.cpu_count()} cores"}
    results["part1"] = part1(rounds, n, args.baseline_rev)
    summary = dict(results["part1"]["summary"])
    if args.cuda:
        results["part2"] = part2(5 if args.smoke else 50, 4096)
        summary.update(results["part2"]["summary"])
    results["summary"] = summary
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
