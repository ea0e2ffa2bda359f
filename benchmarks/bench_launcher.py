"""What ``otel-rl run`` itself costs: the launcher's CPU, and ``report.html`` written alone.

    python benchmarks/bench_launcher.py [--run-dir DIR] [--rounds 7] [--rev REV]
                                        [--quick | --smoke] [--json FILE]

The launcher starts the program, waits, and when the program has ended writes ``report.html``
from the run's timers.json and spans file, unless the program's main process wrote it as it
ended (`runreport`: a run under ``otel-rl run``; a folder made without the launcher has none). To measure just that, the program is ``true`` (no
Python, ~1 ms) and ``--output`` names a copy of a real run's folder: what the launcher costs
after a real run is then the whole CPU of ``otel-rl run --output COPY -- true``
(``RUSAGE_CHILDREN`` around it) less that of ``true`` alone. The run's folder is ``--run-dir``
(e.g. a real Sample Factory run's ``otel-rl run --output`` folder) or, by default, made here
with ``tests.long_workloads sf`` (2 spawn workers, a learner thread, the main loop, ``auto``
windows, every one kept).

Variants, interleaved (a shuffled order per round, a fresh interpreter per measurement):

- ``launcher``: ``python -m otel_rl run --output COPY -- true`` (CPU, all processes);
- ``write_report``: ``write_report(COPY)`` alone, CPU of the process from before its imports
  to after the page is written (``time.process_time`` inside);
- ``true`` alone, and ``python -c pass`` (an interpreter's start-up: the floor of a launcher
  written in Python);
- the spans file writer in this process (`FileSink` export and shutdown of the run's spans),
  keeping the timeline or not; then the page the main process writes itself under ``otel-rl
  run`` (`runreport.write`, timed alone, its modules already loaded here), and the launcher
  after it (a copy of that folder, its stamp current: the launcher keeps the page);

each with otel_rl as of ``--rev`` (before, from ``git archive``; default ``b971630``, the
commit before this change) and as checked out (now). Checks: the report is written by both,
and the pages are equal (the same title, tree and timeline). Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _report import failed_checks_lines, finish, package_at_revision  # noqa: E402

_WRITE_REPORT = ("import sys, time\nt = time.process_time()\n"
                 "from otel_rl._internal.cli.run import write_report\n"
                 "assert write_report(sys.argv[1])\nprint(time.process_time() - t)\n"
                 "import otel_rl\nprint(otel_rl.__file__)\n")


def _env(pythonpath: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "PYTHON"))}
    env["PYTHONPATH"] = pythonpath
    return env


def make_run(folder: str, n: int) -> None:
    """A real multi-process run's output in `folder` (`tests.long_workloads sf`)."""
    subprocess.run([sys.executable, "-m", "tests.long_workloads", "sf", folder, f"n={n}",
                    "workers=2", "window=0.5", "sample_every=1"],
                   cwd=ROOT, env=_env(ROOT), check=True, capture_output=True, timeout=600)


def _fresh_copy(run_dir: str, into: str) -> str:
    copy = os.path.join(into, "run")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("report.html"))
    return copy


def _launch(pythonpath: str, folder: str, scratch: str) -> float:
    """CPU seconds of ``otel-rl run --output FOLDER -- true`` (all its processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "otel_rl", "run", "--output", folder, "--",
                           "true"], env=_env(pythonpath), capture_output=True, text=True,
                          timeout=600, cwd=scratch)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "wrote" not in done.stderr:
        raise RuntimeError(f"otel-rl run: exit {done.returncode}: {done.stderr[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure_launcher(pythonpath: str, run_dir: str, scratch: str) -> tuple[float, str]:
    copy = _fresh_copy(run_dir, scratch)
    cpu = _launch(pythonpath, copy, scratch)
    with open(os.path.join(copy, "report.html"), encoding="utf-8") as f:
        return cpu, f.read()


def measure_plain(argv: list[str], scratch: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, cwd=scratch, env=_env(""))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure_write_report(pythonpath: str, run_dir: str, scratch: str) -> float:
    copy = _fresh_copy(run_dir, scratch)
    # (cwd: not a folder with an otel_rl in it, which would come before PYTHONPATH)
    done = subprocess.run([sys.executable, "-c", _WRITE_REPORT, copy], env=_env(pythonpath),
                          capture_output=True, text=True, timeout=600, check=True, cwd=scratch)
    cpu, where = done.stdout.split()[-2:]
    if not where.startswith(pythonpath):
        raise RuntimeError(f"otel_rl imported from {where}, not from {pythonpath}")
    return float(cpu)


def _batches_of(spans_path: str) -> list[Any]:
    """The spans of a run's spans file as the records its writer was handed: one batch per
    run of spans from one process, times already epoch (offset 0)."""
    from otel_rl._internal.otlp.records import Batch
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file

    batches: list[Any] = []
    for span in read_otlp_json_file(spans_path):
        attrs = {k: v for k, v in span.attributes.items() if not k.startswith("thread.")}
        extra: dict[str, Any] = {"attrs": attrs} if attrs else {}
        for event in span.events:
            if event.name == "exception":
                extra["error"] = tuple(str(event.attributes.get(f"exception.{k}", ""))
                                       for k in ("type", "message", "stacktrace"))
        tid = int(span.attributes.get("thread.id", 0))
        record = (int(span.span_id, 16), int(span.parent_span_id or "0", 16), span.name,
                  span.start_ns, span.end_ns, tid, int(span.trace_id, 16), extra or None)
        if not batches or batches[-1].resource != span.resource:
            batches.append(Batch(span.resource, 0, [], {}))
        batches[-1].records.append(record)
        batches[-1].thread_names[tid] = str(span.attributes.get("thread.name", ""))
    return batches


def measure_writer(batches: list[Any], timeline: bool, scratch: str) -> float:
    """CPU seconds the main process's spans file writer takes for `batches` (export in
    requests of 2,048 spans, then shutdown), keeping the timeline's spans or not."""
    from otel_rl._internal.sinks.base import Stats
    from otel_rl._internal.sinks.file import FileSink

    folder = os.path.join(scratch, "writer")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    start = time.process_time()
    sink = FileSink(os.path.join(folder, "spans.otlp.jsonl"), Stats(), timeline=timeline)
    for i in range(0, len(batches), 8):
        sink.export(batches[i:i + 8], float("inf"))
    sink.shutdown(float("inf"))
    return time.process_time() - start


def measure_main_page(batches: list[Any], run_dir: str, scratch: str) -> tuple[float, str]:
    """CPU seconds the main process takes to write report.html itself once its spans file
    writer has shut down (`runreport.write`: the page from the spans the writer kept; its
    modules are loaded here already, as they are not in a real main process), and the folder
    it wrote the page in."""
    from otel_rl._internal import runreport
    from otel_rl._internal.sinks.base import Stats
    from otel_rl._internal.sinks.file import FileSink

    folder = os.path.join(scratch, "main-page")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    sink = FileSink(os.path.join(folder, "spans.otlp.jsonl"), Stats(), timeline=True)
    for i in range(0, len(batches), 8):
        sink.export(batches[i:i + 8], float("inf"))
    sink.shutdown(float("inf"))
    shutil.copy2(os.path.join(run_dir, "timers.json"), folder)
    start = time.process_time()
    written = runreport.write(folder, sink.timeline_spans())
    cpu = time.process_time() - start
    if not written or not runreport.is_current(folder):
        raise RuntimeError("the main process's page was not written")
    return cpu, folder


def measure_launcher_after_page(folder: str, scratch: str) -> float:
    """The launcher's CPU after a run whose main process wrote the page (`folder`, copied
    whole: the stamp still matches), the program being `true`."""
    copy = os.path.join(scratch, "paged")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    cpu = _launch(ROOT, copy, scratch)
    from otel_rl._internal import runreport

    if not runreport.is_current(copy):  # (a page written again would not match its stamp)
        raise RuntimeError("the launcher wrote the page again")
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", help="a real run's output folder (default: one made here)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--rev", default="b971630", help="otel_rl before (a git revision)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.smoke else 3 if args.quick else 7)
    n = 1000 if args.smoke else 6000 if args.quick else 20000
    checks: list[str] = []
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-launcher-") as tmp:
        run_dir = args.run_dir
        if run_dir is None:
            run_dir = os.path.join(tmp, "made")
            make_run(run_dir, n)
        paths = {"now": ROOT}
        before = os.path.join(tmp, "before")
        os.makedirs(before)
        if package_at_revision(args.rev, before):
            paths["before"] = before
        scratch = os.path.join(tmp, "scratch")
        os.makedirs(scratch)
        spans = os.path.join(run_dir, "spans.otlp.jsonl")
        size = os.path.getsize(spans) if os.path.exists(spans) else 0
        rng = random.Random(0)
        pages: dict[str, str] = {}
        writer_batches = None
        for _ in range(rounds):
            jobs = [(what, version) for what in ("launcher", "write_report") for version in paths]
            jobs += [("true", ""), ("python", ""), ("writer", "keeps"), ("writer", "plain"),
                     ("main page", "")]
            rng.shuffle(jobs)
            for what, version in jobs:
                if what == "true":
                    samples.setdefault("`true` alone", []).append(measure_plain(["true"], scratch))
                elif what == "python":  # the floor of any launcher written in Python
                    samples.setdefault("`python -c pass`", []).append(
                        measure_plain([sys.executable, "-c", "pass"], scratch))
                elif what == "writer":  # in this process: the keeper's cost in the main
                    if writer_batches is None:
                        writer_batches = _batches_of(spans)
                    samples.setdefault(f"spans file writer, {version}", []).append(
                        measure_writer(writer_batches, version == "keeps", scratch))
                elif what == "main page":  # in this process, then the launcher after it
                    if writer_batches is None:
                        writer_batches = _batches_of(spans)
                    cpu, paged = measure_main_page(writer_batches, run_dir, scratch)
                    samples.setdefault("the main process's page (`runreport.write`)",
                                       []).append(cpu)
                    samples.setdefault("launcher, now, after the main process's page",
                                       []).append(measure_launcher_after_page(paged, scratch))
                elif what == "launcher":
                    cpu, page = measure_launcher(paths[version], run_dir, scratch)
                    pages[version] = page
                    samples.setdefault(f"launcher, {version}", []).append(cpu)
                else:
                    samples.setdefault(f"write_report, {version}", []).append(
                        measure_write_report(paths[version], run_dir, scratch))
        if "before" in pages and pages["before"] != pages["now"]:
            checks.append("report.html differs between before and now")
    summary = {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                      "runs": v, "checks": checks} for name, v in samples.items()}
    results = {"run_dir": args.run_dir or f"tests.long_workloads sf n={n}", "rounds": rounds,
               "spans_file_bytes": size, "before": args.rev if "before" in paths else None,
               "summary": summary}

    def render(res: dict[str, Any]) -> str:
        rows = [f"### `otel-rl run`'s own CPU ({res['rounds']} interleaved rounds; spans file "
                f"{res['spans_file_bytes'] / 1e6:.1f} MB, {res['run_dir']})", "",
                "| what | CPU s, median (min–max) | × before |", "|---|---|---|"]
        for name, row in res["summary"].items():
            base = res["summary"].get(name.replace("now", "before"))
            ratio = (f"{row['median_s'] / base['median_s']:.2f}×"
                     if base and "now" in name and base["median_s"] > 0 else "")
            rows.append(f"| {name} | {row['median_s']:.3f} ({row['min_s']:.3f}–"
                        f"{row['max_s']:.3f}) | {ratio} |")
        return "\n".join([*rows, "", *failed_checks_lines(res)])

    results["summary"] = dict(sorted(summary.items()))
    return finish(results, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
