"""``otel-rl demo``: train PPO on CartPole the way mlagents-learn trains, with otel_rl on.

    otel-rl demo                       # ./results/demo, a few seconds on 2 cores
    otel-rl demo --workers 4 --steps 100000 --run-id big --spans all
    otel-rl demo --force               # overwrite ./results/demo

The run folder ``<output>/<run-id>/`` gets the checkpoints (``CartPole/CartPole-<step>.npz``),
the final model (``CartPole.npz``) and ``run_logs/`` with ``timers.json``, the spans file and
``report.html``. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, the spans also go there.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from otel_rl._internal.errors import UnavailableError, UsageError, one_line, shown

#: Limits that keep a typo from starting hundreds of processes.
MAX_WORKERS = 64
TIMERS_FILE = "timers.json"
SPANS_FILE = "spans.otlp.jsonl"
REPORT_FILE = "report.html"


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``otel-rl demo``'s arguments to `parser`."""
    parser.add_argument(
        "--workers", type=int, default=2, metavar="N", help="env worker processes (default: 2)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=50_000,
        metavar="N",
        help="env steps to train for, over all envs (default: 50000)",
    )
    parser.add_argument(
        "--output",
        default="results",
        metavar="DIR",
        help="folder that holds run folders (default: ./results)",
    )
    parser.add_argument(
        "--run-id",
        default="demo",
        metavar="ID",
        help="name of this run's folder under --output (default: demo)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="random seed; the same seed trains the same model (default: 0)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=int,
        default=20_000,
        metavar="N",
        help="save a checkpoint every N steps (default: 20000)",
    )
    parser.add_argument(
        "--spans",
        choices=("all", "auto", "off"),
        default=None,
        help="span policy (default: OTEL_RL_SPANS, else auto)",
    )
    parser.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default=None,
        help="how to start env workers (default: the platform's)",
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite the run folder if it already exists"
    )
    parser.add_argument("--quiet", action="store_true", help="print only where the results are")


def _check_options(args: argparse.Namespace) -> None:
    if args.steps < 1:
        raise UsageError(f"--steps must be a positive number of steps, got {args.steps}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}")
    if args.seed < 0:
        raise UsageError(f"--seed must be zero or positive, got {args.seed}")
    if args.checkpoint_interval < 1:
        raise UsageError(
            f"--checkpoint-interval must be a positive number of steps, got {args.checkpoint_interval}"
        )
    run_id = args.run_id
    # The run id names a folder that --force deletes: it must stay one plain name.
    if not run_id or run_id in (".", "..") or any(c in run_id for c in "/\\\0"):
        raise UsageError(f"--run-id must be a plain folder name, got {shown(run_id)}")
    if len(os.fsencode(run_id)) > 255:
        raise UsageError(f"--run-id is {len(run_id)} characters; a folder name has at most 255 bytes")


def _prepare_run_dir(output: Path, run_id: str, force: bool) -> Path:
    """Create ``output/run_id`` (empty), or explain in one line why it cannot be."""
    try:
        return _make_run_dir(output, run_id, force)
    except OSError as exc:  # e.g. a path too long for the file system
        raise UnavailableError(
            f"cannot create {run_id} in --output {output}: {one_line(exc.strerror or exc)}"
        ) from None


def _make_run_dir(output: Path, run_id: str, force: bool) -> Path:
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} is not a directory")
    try:
        output.mkdir(parents=True, exist_ok=True)
        # Fail now, not after training, if nothing can be written here.
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as exc:
        raise UnavailableError(f"cannot write to --output {output}: {exc.strerror or exc}") from None
    run_dir = output / run_id
    if run_dir.exists() or run_dir.is_symlink():
        if not force:
            raise UsageError(
                f"{run_dir} already exists; choose another --run-id or pass --force to overwrite it"
            )
        try:
            if run_dir.is_dir() and not run_dir.is_symlink():
                shutil.rmtree(run_dir)
            else:
                run_dir.unlink()
        except OSError as exc:
            raise UnavailableError(f"cannot remove {run_dir}: {exc.strerror or exc}") from None
    try:
        (run_dir / "run_logs").mkdir(parents=True)
    except OSError as exc:
        raise UnavailableError(f"cannot create {run_dir}: {exc.strerror or exc}") from None
    return run_dir


#: What sets the BLAS libraries' thread pools (OpenBLAS, OpenMP, MKL), read when numpy loads.
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """One BLAS thread for the run (and its workers, which inherit the environment), unless
    the environment says otherwise; the caller's environment as it was afterwards.

    The demo's networks are tiny and its env workers are processes, so a BLAS pool adds
    nothing but a thread alive at every fork: OpenBLAS starts its pool when numpy loads and
    ends it inside fork(), where the kernel may still count it, and Python 3.12+ then warned
    that the demo was multi-threaded."""
    added = [name for name in _BLAS_THREADS if name not in os.environ]
    for name in added:
        os.environ[name] = "1"
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def run(args: argparse.Namespace) -> int:
    """Train, shut telemetry down, then read the results back and write the report."""
    _check_options(args)
    with _one_blas_thread():
        return _train_and_report(args)


def _train_and_report(args: argparse.Namespace) -> int:
    # numpy and the trainer are imported only now: `otel-rl --help` stays fast.
    import otel_rl
    from otel_rl._internal.demo.training import TrainingOptions, run_training

    run_dir = _prepare_run_dir(Path(args.output), args.run_id, args.force)
    logs_dir = run_dir / "run_logs"
    say: Callable[[str], None] = _quiet if args.quiet else _print
    options = TrainingOptions(
        run_dir=run_dir,
        run_id=args.run_id,
        max_steps=args.steps,
        workers=args.workers,
        seed=args.seed,
        checkpoint_interval=args.checkpoint_interval,
        start_method=args.start_method,
    )
    # The run id is not the folder name: trace ids are derived from it, so two runs into one
    # folder name (every demo is "demo" by default) must still be two runs in a backend.
    named = os.environ.get("OTEL_RL_SERVICE_NAME") or os.environ.get("OTEL_SERVICE_NAME")
    otel_rl.configure(
        output_dir=str(logs_dir),
        # A default the environment can override.
        service_name=None if named else "otel-rl-demo",
        spans=args.spans,
    )
    from otel_rl._internal import runtime

    rt = runtime.current()
    disabled = rt is not None and rt.settings.disabled
    trace_id = f"{rt.trace.trace_id:032x}" if rt is not None and rt.spans_on else None
    otel_run_id = rt.run_id if rt is not None and not disabled else ""
    try:
        result = run_training(options, log=say)
        if disabled:
            # OTEL_SDK_DISABLED: otel_rl writes no files, but the timers still aggregated in
            # this process (ML-Agents' own tree, env workers merged in as it does).
            _write_text(logs_dir / TIMERS_FILE, _in_process_tree_json())
    finally:
        otel_rl.shutdown()
    tree_text, spans_written = _report(logs_dir)
    if not args.quiet:
        print()
        print(tree_text, end="")
        print()
    print(f"Run folder:  {run_dir}")
    print(f"Final model: {result.final_model}")
    print(f"Checkpoints: {len(result.checkpoints)} in {run_dir / 'CartPole'}")
    print(f"Timers:      {logs_dir / TIMERS_FILE}")
    print(f"Spans:       {logs_dir / SPANS_FILE if spans_written else '(none written)'}")
    print(f"Report:      {logs_dir / REPORT_FILE}")
    if trace_id is not None:
        # What `otel-rl tree --jaeger URL --trace-id ...` and Jaeger's search box need: the
        # run trace (the run span and the aggregates; under `auto` blocks are in window traces).
        print(f"Trace ID:    {trace_id}")
    if otel_run_id:
        print(f"Run id:      {otel_run_id}  (otel-rl tree --jaeger URL --run-id {otel_run_id})")
    if disabled:
        print("otel_rl is disabled (OTEL_SDK_DISABLED / OTEL_RL_DISABLED): no spans; "
              "timers.json holds the in-process timers")
    return 0


def _in_process_tree_json() -> str:
    import otel_rl.timers
    from otel_rl._internal.tree import Tree

    return Tree.from_dict(otel_rl.timers.get_timer_tree()).to_json(indent=2) + "\n"


def _report(logs_dir: Path) -> tuple[str, bool]:
    """Read back what shutdown wrote and write report.html; the tree view text, and
    whether there was a spans file."""
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file
    from otel_rl._internal.tree import Tree
    from otel_rl.renderers import html, treeview

    timers_path = logs_dir / TIMERS_FILE
    try:
        tree = Tree.from_json(timers_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnavailableError(f"training finished but {timers_path} was not written") from None
    spans_path = logs_dir / SPANS_FILE
    spans = read_otlp_json_file(spans_path) if spans_path.exists() else None
    _write_text(logs_dir / REPORT_FILE, html.render(tree, spans, title="otel-rl demo"))
    return treeview.render(tree), spans is not None


def _write_text(path: Path, text: str) -> None:
    from otel_rl._internal import atomic

    try:
        atomic.write_text(path, text)  # nobody opens half a report
    except OSError as exc:
        raise UnavailableError(f"cannot write {path}: {exc.strerror or exc}") from None


def _print(line: str) -> None:
    print(line, flush=True)


def _quiet(_line: str) -> None:
    pass
