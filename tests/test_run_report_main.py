"""report.html written by the program's main process as it ends (`runreport`), under ``otel-rl
run``: the very page the launcher writes from the files, span for span; the launcher takes it
only while the files it was drawn from are unchanged, and writes it itself otherwise (the
program killed, a file changed after, the main process unable to write it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_rl._internal import runreport, timeline_side
from otel_rl._internal.cli import run as run_command
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl._internal.tree import Tree
from otel_rl.renderers import html

REPO = Path(__file__).resolve().parents[1]

#: Two spawn workers (their spans relayed), a thread whose name JSON cannot spell as it is (a
#: lone surrogate: the reader makes it U+FFFD) started by a block that ends at once (its spans
#: in later windows are marked: their starter ended), blocks that raise (spans with an error),
#: names outside ASCII, windows of 0.2 s all kept.
PROGRAM = '''
import multiprocessing as mp, sys, threading, time
from otel_rl.timers import hierarchical_timer
from otel_rl.timing import Timing

def worker(n):
    timing = Timing()
    for i in range(n):
        with timing.add_time("env_step"):
            if i % 97 == 0:
                time.sleep(0.0003)

def learner(n):
    for i in range(n):
        with hierarchical_timer("learner_step"):
            if i % 50 == 0:
                time.sleep(25 / n)  # 0.5 s in all: alive across windows

if __name__ == "__main__":
    n = int(sys.argv[1])
    with hierarchical_timer("main_loop"):
        workers = [mp.get_context("spawn").Process(target=worker, args=(n,)) for _ in range(2)]
        for p in workers:
            p.start()
        thread = threading.Thread(target=learner, args=(n,), name="learner \\ud800 é")
        with hierarchical_timer("start learner"):  # ends at once: its spans' starter ended
            thread.start()
        for i in range(n):
            with hierarchical_timer("step \\u2603"):
                pass
            if i % 500 == 0:
                try:
                    with hierarchical_timer("failing"):
                        raise ValueError("boom")
                except ValueError:
                    pass
        thread.join()
        for p in workers:
            p.join()
    if len(sys.argv) > 2:
        print("ready", flush=True)
        time.sleep(60)
'''


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    env["PYTHONPATH"] = str(REPO)
    env.update(OTEL_RL_WINDOW="0.2", OTEL_RL_SAMPLE_EVERY="1", **extra)
    return env


def otel_rl_run(folder: Path, program: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_rl", "run", "--output", str(folder), "--",
                           sys.executable, str(program), *args],
                          env=environ(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("program") / "train.py"
    path.write_text(PROGRAM)
    return path


@pytest.fixture(scope="module", params=[300, 4000], ids=["whole-file", "side-file"])
def run(request: pytest.FixtureRequest, program: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run: fewer spans than the timeline shows (the report reads the whole spans
    file) or more (its writer leaves the longest in a side file)."""
    folder = tmp_path_factory.mktemp("run") / "out"
    done = otel_rl_run(folder, program, str(request.param))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith(f"otel-rl run: wrote {folder / 'report.html'}")
    return folder


def launchers_page(folder: Path, tmp_path: Path) -> str:
    """The page the launcher writes from the run's files alone."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / runreport.STAMP).unlink()
    (copy / "report.html").unlink()
    assert run_command.write_report(str(copy)) == str(copy / "report.html")
    return (copy / "report.html").read_text(encoding="utf-8")


def test_the_main_process_wrote_the_page_the_launcher_writes(run: Path, tmp_path: Path) -> None:
    spans = read_otlp_json_file(run / "spans.otlp.jsonl")
    many = sum(s.attributes.get("otel_rl.kind") != "aggregate" for s in spans)
    side = Path(timeline_side.side_path(run / "spans.otlp.jsonl"))
    assert side.exists() == (many > html.MAX_TIMELINE_SPANS)
    # What the timeline has to show: every process, the odd thread name, errors, spans whose
    # starter ended.
    assert len({s.resource["process.pid"] for s in spans}) == 3
    assert any(s.is_error for s in spans)
    assert any(s.attributes.get("otel_rl.starter_ended") for s in spans)
    assert any("\ufffd" in str(s.attributes.get("thread.name", "")) for s in spans)
    assert runreport.is_current(str(run))  # the main process's page, taken by the launcher
    page = (run / "report.html").read_text(encoding="utf-8")
    assert page == launchers_page(run, tmp_path)
    tree = Tree.from_json((run / "timers.json").read_text())
    title = f"otel-rl run: {tree.metadata['command_line_arguments']}"
    assert page == html.render(tree, spans, title=title)  # a full read's page
    assert "learner \ufffd é" in page and "step \u2603" in page


@pytest.mark.parametrize("change", ["timers.json", "spans.otlp.jsonl", "report.html", "stamp"])
def test_the_launcher_writes_the_page_again_once_a_file_changed(run: Path, tmp_path: Path,
                                                                  change: str) -> None:
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    assert runreport.is_current(str(folder))
    if change == "stamp":
        (folder / runreport.STAMP).write_text("{not json")
    elif change == "report.html":
        (folder / "report.html").write_text("<html>someone else's</html>")
    else:
        path = folder / change
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert not runreport.is_current(str(folder))
    assert run_command.write_report(str(folder))
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert page == (run / "report.html").read_text(encoding="utf-8")  # the files' page


def test_a_killed_programs_page_comes_from_the_launcher(program: Path, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "otel_rl", "run", "--output", str(folder),
                             "--", sys.executable, str(program), "300", "wait"],
                            env=environ(OTEL_RL_FLUSH_INTERVAL="0.2"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(1.0)  # a flush or two: the spans file has lines
    main = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(proc.pid)],
                                               capture_output=True, text=True).stdout.split()]
    assert len(main) == 1
    os.kill(main[0], signal.SIGKILL)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    assert f"otel-rl run: wrote {folder / 'report.html'}" in err
    assert not (folder / runreport.STAMP).exists()
    # The page of the timers.json the launcher wrote with the ledger of what was lost.
    assert "was killed by SIGKILL" in (folder / "report.html").read_text(encoding="utf-8")


def test_a_page_the_main_process_cannot_write_is_left_to_the_launcher(program: Path,
                                                                       tmp_path: Path) -> None:
    folder = tmp_path / "out"
    (folder / "report.html").mkdir(parents=True)  # neither can write a file there
    done = otel_rl_run(folder, program, "300")
    assert done.returncode == 0  # the program's result stands
    assert not (folder / runreport.STAMP).exists()
    said = [line for line in done.stderr.splitlines() if "report.html" in line]
    assert len(said) == 1 and said[0].startswith("otel-rl run: no report.html (")


def test_only_the_main_process_otel_rl_run_asked_writes_it(tmp_path: Path) -> None:
    """No report.html from a program that configures otel_rl itself (as before), nor where the
    variable names another folder or this is not the run's main process; the one asked does."""
    code = ("import os, sys\n"
            "if sys.argv[2] == 'main':\n"
            "    os.environ['OTEL_RL_ZEROCODE_MAIN'] = f'pid:{os.getpid()}'\n"
            "import otel_rl\n"
            "otel_rl.configure(output_dir=sys.argv[1])\n"
            "from otel_rl.timers import hierarchical_timer\n"
            "with hierarchical_timer('x'): pass\n"
            "otel_rl.shutdown()\n")
    written = {}
    for name, asked, main in (("plain", None, "main"), ("elsewhere", "other", "main"),
                              ("not-main", "not-main", "other"), ("asked", "asked", "main")):
        folder = tmp_path / name
        extra = {} if asked is None else {runreport.REPORT_ENV: str(tmp_path / asked)}
        done = subprocess.run([sys.executable, "-c", code, str(folder), main],
                              env=environ(**extra), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (folder / "timers.json").exists()
        written[name] = ((folder / "report.html").exists(), (folder / runreport.STAMP).exists())
    assert written == {"plain": (False, False), "elsewhere": (False, False),
                       "not-main": (False, False), "asked": (True, True)}
    assert runreport.is_current(str(tmp_path / "asked"))


def test_the_stamp_names_the_files_as_they_are(run: Path) -> None:
    stamp = json.loads((run / runreport.STAMP).read_text())
    for name in ("report.html", "timers.json", "spans.otlp.jsonl"):
        st = (run / name).stat()
        assert stamp[name] == [st.st_size, st.st_mtime_ns]
    assert runreport.TIMERS_FILE == run_command.TIMERS_FILE
    assert runreport.SPANS_FILE == run_command.SPANS_FILE
    assert runreport.REPORT_FILE == run_command.REPORT_FILE
