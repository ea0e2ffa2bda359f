"""Run every benchmark, print their markdown tables, write ``benchmarks/results/latest.json``
and the tables alone to ``benchmarks/results/latest.md``.

    python benchmarks/run_all.py                # full run: about 2 minutes on 2 cores
    python benchmarks/run_all.py --quick        # fewer rounds and iterations: under a minute
    python benchmarks/run_all.py --all          # and fork(), shutdown, Ray, the real Sample
                                                # Factory, ML-Agents and RLlib runs (~50 min)

Each benchmark runs in its own interpreter (a fresh process, nothing shared between them),
with this checkout first on its path (not whatever otel_rl the interpreter has installed) and
its compiled modules built in place first (``scripts/build_accel.py``, as the tests do; where
that fails the benchmarks say they ran the pure-Python code).
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

from bench_sample_factory import framework_python

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ("bench_core", "bench_workers", "bench_gpu", "bench_readers", "bench_metrics",
              "bench_relay", "bench_timing_switch", "bench_timing", "bench_windows",
              "bench_launcher", "bench_step_exchange")
#: With --all: the real runs (issue 19, item 4; their venvs are built on first use), Ray,
#: fork() and shutdown against faulty collectors. (name, full size, --quick size, venv: the
#: bench runs with that framework venv's Python and this checkout first on its path). The
#: real runs take 11 rounds: single rounds move by up to ±27 % on a shared 2-core machine, in
#: both variants, and two runs of 7 rounds of the same code gave medians up to 9 % apart.
MORE = (("bench_fork", ("--forks", "200"), ("--forks", "50"), None),
        ("bench_shutdown", (), (), None),
        ("bench_ray", ("--rounds", "15"), ("--quick",), "ray"),
        ("bench_ray_join", ("--rounds", "9"), ("--quick",), "ray"),
        ("bench_sample_factory", ("--rounds", "11", "--steps", "60000"), ("--quick",), None),
        ("bench_mlagents", ("--rounds", "11", "--steps", "20000"), ("--quick",), None),
        ("bench_rllib", ("--rounds", "11", "--iterations", "50"), ("--quick",), None))
REPO = os.path.dirname(HERE)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                             capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None


def run_one(name: str, extra_args: Sequence[str], venv: str | None = None
            ) -> tuple[int, dict[str, Any] | None, str]:
    """Run one benchmark script, streaming its output; returns (exit status, results, output)."""
    env = dict(os.environ)
    python = sys.executable
    if venv is not None:
        # Not `venv_python`: that installs the checkout and holds the framework tests' lock
        # for this process's life, and bench_rllib.py takes the same lock in its own process.
        python = framework_python(venv)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as tmp:
        path = os.path.join(tmp, f"{name}.json")
        proc = subprocess.Popen([python, os.path.join(HERE, f"{name}.py"),
                                 "--json", path, *extra_args], env=env,
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


def markdown(combined: dict[str, Any]) -> str:
    """The run's tables alone, each under its benchmark's name, the arguments and the load
    average before and after it: what the READMEs' tables are copied from."""
    lines = [f"# benchmarks/run_all.py, {combined['size']} run",
             "",
             f"Started {combined['started']}, commit {combined['git_commit'] or 'unknown'}, "
             f"{combined['seconds']} s, Python {sys.version.split()[0]}, "
             f"{os.cpu_count()} CPUs." + (f" FAILED: {', '.join(combined['failed'])}."
                                         if combined["failed"] else ""),
             ""]
    for name, bench in combined["benchmarks"].items():
        before, after = bench["load_average"]
        lines += [f"## {name} {' '.join(bench['arguments'])}".rstrip(), "",
                  f"Exit status {bench['exit_status']}; load average {before:.2f} before, "
                  f"{after:.2f} after.", ""]
        last = -2
        for i, line in enumerate(bench["output"].splitlines()):
            if not line.startswith(("|", "#")):
                continue
            continues_table = (line.startswith("|") and i == last + 1
                               and lines[-1].startswith("|"))
            if lines[-1] and not continues_table:
                lines.append("")  # a blank line around each heading and between tables
            lines.append("#" + line if line.startswith("#") else line)
            last = i
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes: checks that the benchmarks run, measures nothing")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "latest.json"),
                        help="where to write the results (default: benchmarks/results/latest.json)")
    parser.add_argument("--all", action="store_true",
                        help="also fork(), shutdown, Ray and the real Sample Factory, ML-Agents "
                             "and RLlib runs (~35 minutes)")
    args = parser.parse_args(argv)
    if args.smoke and args.all:
        parser.error("--all has no --smoke size (its --quick runs take minutes)")
    extra = ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
    plan: list[tuple[str, list[str], str | None]] = [(name, extra, None) for name in BENCHMARKS]
    if args.all:
        plan += [(name, list(quick if args.quick else full), venv)
                 for name, full, quick, venv in MORE]
    # The compiled modules of this checkout, for the interpreter that runs the benchmarks.
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "build_accel.py"), "--quiet",
                    "--stale"], check=False)
    started = time.time()
    combined: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "size": "smoke" if args.smoke else "quick" if args.quick else "full",
        "git_commit": _git_commit(), "all": args.all, "benchmarks": {}}
    failed = []
    for name, arguments, venv in plan:
        print(f"\n## {name}\n", flush=True)
        load_before = os.getloadavg()[0]
        status, results, output = run_one(name, arguments, venv)
        combined["benchmarks"][name] = {"exit_status": status, "arguments": arguments,
                                        "load_average": [load_before, os.getloadavg()[0]],
                                        "results": results, "output": output}
        if status != 0:
            failed.append(f"{name} (exit status {status})")
    combined["seconds"] = round(time.time() - started, 1)
    combined["failed"] = failed
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(combined, f, indent=2)
    tables = os.path.splitext(args.output)[0] + ".md"
    with open(tables, "w", encoding="utf-8") as f:
        f.write(markdown(combined))
    print(f"\nwrote {args.output} and {tables} ({combined['seconds']} s)")
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
