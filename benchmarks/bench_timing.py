"""Sample Factory's `Timing` block: its own against otel_rl's, pure and compiled (issue 19).

    python benchmarks/bench_timing.py [--quick] [--smoke] [--json FILE]

Measured: process CPU per ``with timing.add_time(key): pass``, top-level and nested (inside
one open ``add_time`` block), in a worker thread of a run (as Sample Factory's rollout workers
time their blocks), for

- Sample Factory 2.1.1's own `sample_factory.utils.timing.Timing` (its venv, when it is cached
  under ``~/.cache/otel-rl/venvs/``; its torch import is outside the measurement),
- `otel_rl.timing.Timing`, pure Python (``OTEL_RL_ACCELERATOR=false``) and compiled
  (`otel_rl/_internal/_timingacc.c` with the compiled hot path), each unconfigured and with
  ``configure(spans="auto")`` (every block is then also an otel_rl block, mirrored and placed
  under the Timing's component).

Every measurement runs in a fresh interpreter (the SF venv's Python for all, so they share one
interpreter build), the variants interleaved in random order over rounds; medians and min-max,
and ratios to Sample Factory's own. Check: the configured runs count every block in
timers.json.
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
from pathlib import Path
from typing import Any

from _report import failed_checks_lines, finish

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SF_PYTHON = Path.home() / ".cache/otel-rl/venvs/sf-2.1.1-torch-2.5.1-py3.11/bin/python"

CHILD = r"""
import json, os, sys, tempfile, threading, time
which, configured, n = sys.argv[1], sys.argv[2] == "auto", int(sys.argv[3])
if which == "sample_factory":
    from sample_factory.utils.timing import Timing
else:  # "pure", "compiled", or "any": whichever the otel_rl on the path runs (older ones too)
    import otel_rl
    from otel_rl.timing import Timing
    if which != "any":
        from otel_rl.timing import accelerated
        assert accelerated() is (which == "compiled"), "not on the path asked for"
    if configured:
        out = tempfile.mkdtemp()
        otel_rl.configure(output_dir=out, spans="auto")
res = {}
def work():
    t = Timing("RolloutWorker_w0 profile")
    for _ in range(1000):
        with t.add_time("top"):
            pass
    start = time.process_time()
    for _ in range(n):
        with t.add_time("top"):
            pass
    res["top"] = (time.process_time() - start) / n * 1e6
    with t.add_time("outer"):
        for _ in range(1000):
            with t.add_time("nested"):
                pass
        start = time.process_time()
        for _ in range(n):
            with t.add_time("nested"):
                pass
        res["nested"] = (time.process_time() - start) / n * 1e6
runner = Timing("Runner profile")
with runner.timeit("main_loop"):
    th = threading.Thread(target=work)
    th.start()
    th.join()
if which != "sample_factory" and configured:
    otel_rl.shutdown()
    tree = json.load(open(out + "/timers.json"))
    comp = tree["children"]["main_loop"]["children"]["RolloutWorker_w0 profile"]["children"]
    res["counts"] = [comp["top"]["count"], comp["outer"]["children"]["nested"]["count"]]
print(json.dumps(res))
"""

#: (implementation, configuration) measured; Sample Factory's has no configuration.
VARIANTS = [("sample_factory", "-"), ("pure", "off"), ("compiled", "off"), ("pure", "auto"),
            ("compiled", "auto")]


def measure(which: str, configured: str, n: int, python: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = ROOT
    env["OTEL_RL_ACCELERATOR"] = "true" if which == "compiled" else "false"
    out = subprocess.run([python, "-c", CHILD, which, configured, str(n)], env=env,
                         capture_output=True, text=True, timeout=600,
                         cwd=tempfile.gettempdir())
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _spread(values: list[float]) -> dict[str, float]:
    values = values or [0.0]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rounds, n = (1, 2000) if args.smoke else (7, 50000) if args.quick else (9, 100000)
    python = str(SF_PYTHON) if SF_PYTHON.exists() else sys.executable
    variants = [v for v in VARIANTS if v[0] != "sample_factory" or SF_PYTHON.exists()]
    rows: dict[str, list[dict[str, Any]]] = {f"{w}/{c}": [] for w, c in variants}
    for _ in range(rounds):
        order = list(variants)
        random.shuffle(order)
        for which, configured in order:
            rows[f"{which}/{configured}"].append(measure(which, configured, n, python))
    summary: dict[str, Any] = {}
    for name, runs in rows.items():
        good = [r for r in runs if "error" not in r]
        checks = sorted({f"{name}: {r['error']}" for r in runs if "error" in r})
        checks += [f"{name}: blocks missing from timers.json: {r['counts']}" for r in good
                   if "counts" in r and r["counts"] != [n + 1000, n + 1000]]
        summary[name] = {key: _spread([r[key] for r in good]) for key in ("top", "nested")}
        summary[name]["checks"] = checks
    sf = rows.get("sample_factory/-")
    if sf:
        for name, runs in rows.items():
            for key in ("top", "nested"):
                # Per round: this variant over Sample Factory's own in the same round.
                ratios = [r[key] / s[key] for r, s in zip(runs, sf, strict=True)
                          if "error" not in r and "error" not in s and s[key] > 0]
                summary[name][f"{key}_ratio"] = _spread(ratios)
    # Without Sample Factory's venv its row is left out (said in the output), not a failure.
    note = None if SF_PYTHON.exists() else (f"Sample Factory's venv is not cached ({SF_PYTHON}):"
                                            " its own Timing was not measured")
    return finish({"rounds": rounds, "blocks": n, "python": python, "summary": summary,
                   "note": note}, args.json, render)


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [*failed_checks_lines(results),
             f"#### Sample Factory's `Timing`: CPU µs per `add_time` block in a worker thread "
             f"({results['blocks']:,} blocks, {results['rounds']} interleaved rounds, fresh "
             "interpreter each; median, min–max; ratio: per round to Sample Factory's own)", "",
             *([results["note"], ""] if results.get("note") else []),
             "| Timing | otel_rl configured | top-level block | nested block | top-level ratio"
             " | nested ratio |", "|---|---|---|---|---|---|"]
    labels = {"sample_factory": "Sample Factory 2.1.1's own", "pure": "otel_rl, pure Python",
              "compiled": "otel_rl, compiled"}
    for name, row in s.items():
        which, configured = name.split("/")
        cells = [f"{row[k]['median']:.3f} ({row[k]['min']:.3f}–{row[k]['max']:.3f})"
                 for k in ("top", "nested")]
        for k in ("top_ratio", "nested_ratio"):
            r = row.get(k)
            cells.append(f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})" if r else "–")
        config = {"-": "–", "off": "no", "auto": "`spans=auto`"}[configured]
        lines.append(f"| {labels[which]} | {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
