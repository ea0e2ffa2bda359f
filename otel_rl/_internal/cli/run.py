"""``otel-rl run``: run a program with its ML-Agents / Sample Factory timers served by otel_rl.

    otel-rl run [--service-name NAME] [--output DIR] [--spans all|auto|off] -- COMMAND [ARGS...]

The program is not changed: the options become ``OTEL_RL_*`` environment variables, and the
zero-code folder goes first on PYTHONPATH so that every Python process of the program starts
with otel_rl's `sitecustomize` (see `otel_rl._internal.zerocode`); its main process is the run.
A ``.py`` COMMAND runs with this Python. Signals sent to ``otel-rl run`` are passed on to the
program, and its exit code is returned (128 + N when signal N ended it).

The service is named after the program (``python -m sf_examples.train_gym_env`` ->
``sf_examples.train_gym_env``, ``mlagents-learn`` -> ``mlagents-learn``) unless
``--service-name``, ``OTEL_RL_SERVICE_NAME``, ``OTEL_SERVICE_NAME`` or a ``service.name`` in the
resource attributes says otherwise. When the program has ended, ``report.html`` is next to its
``timers.json`` (as ``otel-rl report --html`` would write it): the program's main process writes
it as its last step (`runreport`), or, where that page does not describe the files as they are,
this command writes it from them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from types import FrameType
from typing import Any

from otel_rl._internal import mainledger, runreport, torchrun
from otel_rl._internal.config import SPAN_POLICIES, run_folder
from otel_rl._internal.errors import UnavailableError, UsageError, one_line, shown
from otel_rl._internal.mainledger import SURVIVOR_ENV
from otel_rl._internal.zerocode import MAIN_ENV, ZEROCODE_DIR

_USAGE = "usage: otel-rl run [options] -- COMMAND [ARGS...]"

#: Signals passed on to the program.
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
#: Signals a terminal sends to its whole foreground process group: the program has had them
#: already when we are in that group, and a second SIGINT would interrupt its clean-up.
_FROM_TERMINAL = ("SIGINT", "SIGQUIT")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service-name", metavar="NAME", help="service.name of the spans (OTEL_RL_SERVICE_NAME)"
    )
    parser.add_argument(
        "--output",
        metavar="DIR",
        help="folder for timers.json and spans.otlp.jsonl (OTEL_RL_OUTPUT_DIR)",
    )
    parser.add_argument(
        "--spans", choices=SPAN_POLICIES, help="which blocks become spans (OTEL_RL_SPANS)"
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARGS...]",
        help="the program to run; a .py file runs with this Python",
    )


def child_environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The program's environment: ``environ`` plus the options and the zero-code PYTHONPATH."""
    env = dict(environ)
    if args.service_name is not None:
        if not args.service_name.strip():
            raise UsageError("--service-name must not be empty")
        env["OTEL_RL_SERVICE_NAME"] = args.service_name
    if args.output is not None:
        if not args.output.strip():
            raise UsageError("--output must not be empty")
        if os.path.exists(args.output) and not os.path.isdir(args.output):
            # The program would run with nowhere to write timers.json and its spans.
            raise UsageError(f"--output {shown(args.output, 100)}: is not a folder")
        # Absolute, so processes that change directory still write to the same folder.
        env["OTEL_RL_OUTPUT_DIR"] = os.path.abspath(args.output)
    if args.spans is not None:
        env["OTEL_RL_SPANS"] = args.spans
    env[MAIN_ENV] = "1"
    env[SURVIVOR_ENV] = str(os.getpid())  # counts the main process's loss if it is killed
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != ZEROCODE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([ZEROCODE_DIR, *paths])
    return env


def command_line(command: list[str], env: dict[str, str]) -> list[str]:
    """The argv to start: a ``.py`` file runs with this Python; anything else must exist."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError(f"no command given ({_USAGE})")
    program = command[0]
    if program.endswith(".py"):
        if not os.path.isfile(program):
            raise UsageError(f"no such file: {program}")
        return [sys.executable, *command]
    if shutil.which(program, path=env.get("PATH")) is None:
        raise UsageError(f"command not found: {program}")
    return command


def program_name(argv: list[str]) -> str:
    """What the program is called: the module of ``python -m``, a script's name without
    ``.py``, else the command's name."""
    name = os.path.basename(argv[0])
    if name.startswith("python") and len(argv) > 1:
        args = iter(argv[1:])
        for arg in args:
            if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
                return arg[2:] if len(arg) > 2 else next(args, name)
            if arg == "-c":
                return name
            if arg in ("-W", "-X", "-Q"):
                next(args, None)  # the option's value
            elif not arg.startswith("-"):
                name = os.path.basename(arg)
                break
    return name[:-3] if name.endswith(".py") and len(name) > 3 else name


def _service_named(env: dict[str, str]) -> bool:
    if env.get("OTEL_RL_SERVICE_NAME", "").strip() or env.get("OTEL_SERVICE_NAME", "").strip():
        return True
    resource = env.get("OTEL_RL_RESOURCE_ATTRIBUTES", "") + "," + env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return any(item.split("=", 1)[0].strip() == "service.name" for item in resource.split(","))


def output_dir(env: dict[str, str]) -> str | None:
    """The folder the run writes its files to, as its main process will choose it."""
    if env.get("OTEL_RL_OUTPUT_DIR", "").strip():
        return os.path.abspath(env["OTEL_RL_OUTPUT_DIR"])
    if any(env.get(name, "").strip() for name in (
            "OTEL_RL_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None  # exported to a collector; no files unless an output folder is given
    return os.path.abspath(run_folder(env["OTEL_RL_RUN_ID"]))


def write_report(folder: str) -> str | None:
    """Write ``report.html`` from the run's timers.json (and spans file, for the timeline),
    unless the main process wrote it from those files as they are (`runreport.is_current`).

    The timeline's spans are read as `readers.timeline` reads them: only those it shows are
    converted (the page is the one a full read gives). A last line of the spans file cut off
    mid-record is left out, and said on stderr."""
    import gc
    from pathlib import Path

    timers = Path(folder) / TIMERS_FILE
    if not timers.exists():
        return None  # (before the imports: a run without files costs nothing more)
    if runreport.is_current(folder):  # the main process wrote it from these files
        return str(Path(folder) / REPORT_FILE)
    from otel_rl._internal import atomic
    from otel_rl._internal.readers.timeline import timeline_spans
    from otel_rl._internal.tree import Tree
    from otel_rl.renderers import html

    tree = Tree.from_json(timers.read_text(encoding="utf-8"))
    spans_path = Path(folder) / SPANS_FILE
    collecting = gc.isenabled()
    gc.disable()  # the parsed lines hold no cycles; collecting while they come costs ~15 %
    try:
        spans = (timeline_spans(spans_path, html.MAX_TIMELINE_SPANS) if spans_path.exists()
                 else None)
    finally:
        if collecting:
            gc.enable()
    title = f"otel-rl run: {tree.metadata.get('command_line_arguments', '') or folder}"
    report = Path(folder) / REPORT_FILE
    atomic.write_text(report, html.render(tree, spans, title=title))
    for note in spans.skipped if spans is not None else ():
        print(f"otel-rl run: report.html: {note}", file=sys.stderr)
    return str(report)


#: The run's files, as `runtime` names them (not imported from there: the launcher would
#: load the whole write side for two names; `tests/test_report_timeline.py` pins them equal).
TIMERS_FILE = "timers.json"
SPANS_FILE = "spans.otlp.jsonl"
REPORT_FILE = "report.html"


def _in_foreground_group() -> bool:
    """Whether a terminal's signals reach our process group (and so the program's too)."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except (OSError, AttributeError):
            continue
    return False


class _Forwarder:
    """Signal handler passing signals on to the program, installed before it starts so that a
    signal arriving in between is not lost (it is sent once the program exists)."""

    __slots__ = ("pending", "previous", "proc")

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []
        self.previous: dict[int, Any] = {}

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if signal.Signals(signum).name in _FROM_TERMINAL and _in_foreground_group():
            return
        if self.proc is None:
            self.pending.append(signum)
            return
        try:
            self.proc.send_signal(signum)
        except OSError:
            pass  # the program has exited already

    def install(self) -> None:
        for name in _FORWARDED:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                self.previous[signum] = signal.signal(signum, self)
            except (OSError, ValueError):
                continue  # not settable here (e.g. not the main thread)

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        for signum in self.pending:
            self(signum, None)
        self.pending.clear()

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def run(args: argparse.Namespace) -> int:
    env = child_environment(args, dict(os.environ))
    argv = command_line(list(args.command), env)
    if not _service_named(env):
        named = torchrun.training_program(argv) if torchrun.is_torchrun(argv) else argv
        env["OTEL_RL_SERVICE_NAME"] = program_name(named or argv)
    # torchrun on several nodes: one run id from the rendezvous id; a node other than 0 joins.
    joining_node = torchrun.launch_environment(argv, env)
    if not env.get("OTEL_RL_RUN_ID", "").strip():
        # Chosen here, so that the default output folder (otel-rl-runs/<run id>) is known.
        from otel_rl._internal.config import new_run_id

        env["OTEL_RL_RUN_ID"] = new_run_id()
    folder = output_dir(env)
    if folder is not None and joining_node is None and not env.get(torchrun.AUTO_NODE):
        env[runreport.REPORT_ENV] = folder  # the main process writes report.html as it ends
    forwarder = _Forwarder()
    forwarder.install()
    try:
        try:
            proc = subprocess.Popen(argv, env=env)
        except OSError as exc:
            raise UnavailableError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        forwarder.started(proc)
        returncode = proc.wait()
    finally:
        forwarder.restore()
    try:  # the main process killed (SIGKILL, OOM): what it held, counted
        said = mainledger.after_main(proc.pid, env["OTEL_RL_RUN_ID"], returncode, folder)
    except Exception as exc:  # the program's result stands; the count is extra
        said = f"cannot count what the main process left ({one_line(exc)})"
    if said:
        print(f"otel-rl run: {said}", file=sys.stderr)
    if joining_node is None and env.get(torchrun.AUTO_NODE) and torchrun.joined_as_node(folder):
        joining_node = -1  # its node rank came from the rendezvous: not node 0
    if folder is not None and joining_node is None:  # node 0 writes the run's report
        try:
            written = write_report(folder)
        except Exception as exc:  # the program's result stands; the report is extra
            print(f"otel-rl run: no report.html ({one_line(exc)})", file=sys.stderr)
        else:
            if written:
                print(f"otel-rl run: wrote {written}", file=sys.stderr)
    return returncode if returncode >= 0 else 128 - returncode
