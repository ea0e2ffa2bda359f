"""No thread of otel_rl's is alive when the program forks, so a program that was single-threaded
before `configure()` forks single-threaded (Python 3.12+ warns otherwise: "This process is
multi-threaded, use of fork() may lead to deadlocks in the child"), and the threads carry on
after the fork in the parent, and in a child that joins the run.

Every program runs in a fresh interpreter with ``-W default``: on Python 3.12+ the warning
counts are the check; on every Python the thread counts at the moment of fork() are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
FORK_WARNING = "is multi-threaded, use of fork() may lead to deadlocks"

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def run_program(tmp_path: Path, code: str, *args: str, timeout: float = 120) -> str:
    """Run `code` with warnings shown; its stdout. Fails on a non-zero exit or the fork
    warning."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([sys.executable, "-W", "default", str(script), str(REPO), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert FORK_WARNING not in done.stderr, done.stderr
    assert "otel_rl" not in done.stderr, done.stderr  # nothing of otel_rl's to say either
    return done.stdout


def counts(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    result = {}
    for name, child in (tree.get("children") or {}).items():
        result[(*path, name)] = child["count"]
        result.update(counts(child, (*path, name)))
    return result


PROBE = """
    import json, os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from otel_rl._internal import gpu, threads

    seen = []

    def probe():  # registered before configure(): runs after otel_rl's own before-fork hook
        with open("/proc/self/stat", "rb") as f:
            os_threads = int(f.read().rsplit(b")", 1)[1].split()[17])
        seen.append({"pid": os.getpid(), "os_threads": os_threads,
                     "python_threads": sorted(t.name for t in threading.enumerate())})

    os.register_at_fork(before=probe)

    import otel_rl
    from otel_rl import timers
    from tests.gpu_double import FakeCuda

    os.makedirs(sys.argv[2])
    cuda = FakeCuda()
    gpu.use_api(cuda)
    otel_rl.configure(output_dir=sys.argv[2], gpu_blocks=["on_gpu"])

    # A thread another module adds later, keeping the contract: it is covered too.
    ticks = []

    def ticker():
        while not threads.stopping():
            ticks.append(1)
            threads.sleep(0.01)

    threads.start_daemon("otel_rl-test", ticker)
    with timers.hierarchical_timer("on_gpu"):
        cuda.launch(5.0)  # pending on the device across the forks below

    def names():
        return sorted(t.name for t in threading.enumerate())

    with timers.hierarchical_timer("forking"):
        before = names()
        pid = os.fork()
        if pid == 0:  # a worker of the run now: it forks a grandchild in turn
            with timers.hierarchical_timer("child_block"):
                pass
            worker = names()
            grandchild = os.fork()
            if grandchild == 0:
                os._exit(0)
            os.waitpid(grandchild, 0)
            with open(sys.argv[2] + "/child.json", "w") as f:
                json.dump({"names": worker, "after": names(), "seen": seen}, f)
            otel_rl.shutdown()
            os._exit(0)
        after = names()
        os.waitpid(pid, 0)
    ticked = len(ticks)
    time.sleep(0.1)
    cuda.advance(5.0)
    otel_rl.shutdown()
    print(json.dumps({"before": before, "after": after, "seen": seen,
                      "ticked_after_fork": len(ticks) > ticked,
                      "gpu": timers.get_timer_root().children["on_gpu"].gpu_count}))
"""


def test_no_otel_rl_thread_is_alive_at_fork_and_all_carry_on_after_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = json.loads(run_program(tmp_path, PROBE, str(out)))
    assert result["before"] == ["MainThread", "otel_rl-flush", "otel_rl-gpu", "otel_rl-sink-file",
                                "otel_rl-test"]
    assert result["seen"] == [{"pid": result["seen"][0]["pid"], "os_threads": 1,
                               "python_threads": ["MainThread"]}]
    # Started again in the parent, with the relay the fork's carrier opened for the child.
    assert result["after"] == sorted([*result["before"], "otel_rl-relay"])
    assert result["ticked_after_fork"]
    assert result["gpu"] == 1  # the pair pending at the fork was resolved after it
    child = json.loads((out / "child.json").read_text())
    # The child joined the run: its own flush and SIGTERM watcher; both gone at its fork.
    assert child["names"] == ["MainThread", "otel_rl-flush", "otel_rl-sigterm",
                              "otel_rl-sink-relay"]
    assert child["after"] == sorted([*child["names"], "otel_rl-relay"])  # for the grandchild
    assert [s["os_threads"] for s in child["seen"]] == [1, 1]  # the parent's fork, its own
    assert child["seen"][1]["python_threads"] == ["MainThread"]
    tree = json.loads((out / "timers.json").read_text())
    assert counts(tree)[("forking", "child_block")] == 1


POOL = """
    import json, multiprocessing, sys, time
    sys.path.insert(0, sys.argv[1])
    import otel_rl
    from otel_rl import timers

    def task(i):
        with timers.hierarchical_timer("task"):
            time.sleep(0.01)
        return i * i

    if __name__ == "__main__":
        method = sys.argv[3]
        if method != "fork-context":
            multiprocessing.set_start_method(method)
        otel_rl.configure(output_dir=sys.argv[2])
        with timers.hierarchical_timer("pool"):
            context = (multiprocessing.get_context("fork") if method == "fork-context"
                       else multiprocessing)
            with context.Pool(2) as pool:
                print(json.dumps(pool.map(task, range(6))))
        otel_rl.shutdown()
"""


@pytest.mark.parametrize("method", ["fork-context", "fork", "forkserver", "spawn"])
def test_a_pool_after_configure_warns_nothing_and_its_blocks_join_the_run(
    tmp_path: Path, method: str
) -> None:
    """A fork pool (3.12's warning), and forkserver and spawn as the default start method
    (3.14's default is forkserver): the workers' blocks land under the block that made the
    pool, whatever the method."""
    out = tmp_path / "out"
    assert json.loads(run_program(tmp_path, POOL, str(out), method)) == [0, 1, 4, 9, 16, 25]
    tree = json.loads((out / "timers.json").read_text())
    assert counts(tree)[("pool", "task")] == 6
    assert tree["children"]["pool"]["children"]["task"]["is_parallel"]


WORKERS = """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import otel_rl
    from otel_rl import timers

    otel_rl.configure(output_dir=sys.argv[2], flush_interval=0.05)
    pids = []
    with timers.hierarchical_timer("start_workers"):
        for i in range(4):  # Sample Factory's and ML-Agents' shape: fork, work, exit
            pid = os.fork()
            if pid == 0:
                for _ in range(3):
                    with timers.hierarchical_timer("rollout"):
                        pass
                otel_rl.shutdown()
                os._exit(0)
            pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    otel_rl.shutdown()
    print(json.dumps(codes))
"""


def test_fork_workers_after_configure_warn_nothing_and_are_counted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert json.loads(run_program(tmp_path, WORKERS, str(out))) == [0, 0, 0, 0]
    tree = json.loads((out / "timers.json").read_text())
    assert counts(tree)[("start_workers", "rollout")] == 12


DEMO = """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    blas = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    for name in blas:
        os.environ.pop(name, None)  # the demo's own choice, however the tests were launched
    seen = []

    def probe():  # registered first: runs after otel_rl's own before-fork hook
        with open("/proc/self/stat", "rb") as f:
            seen.append(int(f.read().rsplit(b")", 1)[1].split()[17]))

    os.register_at_fork(before=probe)
    from otel_rl._internal.cli import main

    code = main(["demo", "--steps", "600", "--workers", "2", "--start-method", "fork",
                 "--quiet", "--output", sys.argv[2]])
    with open(sys.argv[3], "w") as f:
        json.dump({"code": code, "threads_at_fork": seen,
                   "environment_after": [os.environ.get(name) for name in blas]}, f)
"""


def test_the_demo_with_fork_workers_forks_single_threaded(tmp_path: Path) -> None:
    """No thread at all when the demo forks its env workers: numpy's OpenBLAS pool (started
    when numpy loads, ended by OpenBLAS inside fork(), now and then still counted there) is
    one thread, as the demo runs it), and the caller's environment as it was after it."""
    result = tmp_path / "result.json"
    run_program(tmp_path, DEMO, str(tmp_path / "out"), str(result))
    done = json.loads(result.read_text())
    assert done == {"code": 0, "threads_at_fork": [1, 1],
                    "environment_after": [None, None, None]}
    tree = json.loads((tmp_path / "out" / "demo" / "run_logs" / "timers.json").read_text())
    assert any(path[-1] == "worker_step" for path in counts(tree))


BUSY = """
    import json, os, sys, tempfile, threading, time
    sys.path.insert(0, sys.argv[1])
    import otel_rl
    from otel_rl._internal import threads

    otel_rl.configure(output_dir=tempfile.mkdtemp(), propagate=False)
    busy, ticks = threading.Event(), []

    def exporter():  # like a flush sending to a collector that takes its time to answer
        while not threads.stopping():
            if busy.is_set():
                busy.clear()
                time.sleep(threads.FORK_WAIT_S + 0.5)  # a call nobody can interrupt
            ticks.append(1)
            threads.sleep(0.01)

    threads.start_daemon("otel_rl-busy", exporter)
    busy.set()
    time.sleep(0.1)
    for _ in range(3):  # the first fork waits (bounded); the others do not wait again
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    seen = len(ticks)
    time.sleep(threads.FORK_WAIT_S + 0.5)
    names = sorted(t.name for t in threading.enumerate())
    otel_rl.shutdown()
    print(json.dumps({"carried_on": len(ticks) > seen, "names": names}))
"""


def test_a_thread_busy_past_the_fork_wait_is_said_once_and_carries_on_after(
    tmp_path: Path,
) -> None:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(BUSY))
    done = subprocess.run([sys.executable, str(script), str(REPO)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "otel_rl-busy" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("otel_rl: otel_rl-busy still running ")
    assert lines[0].endswith("after fork() asked it to stop (an export in progress); "
                             "forking with it alive")
    result = json.loads(done.stdout)
    assert result["carried_on"]
    assert result["names"] == ["MainThread", "otel_rl-busy", "otel_rl-flush", "otel_rl-sink-file"]


OWN_THREAD = """
    import sys, tempfile, threading
    sys.path.insert(0, sys.argv[1])
    import otel_rl
    otel_rl.configure(output_dir=tempfile.mkdtemp())
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="the-programs-own").start()
    import os
    pid = os.fork()  # line 9
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    stop.set()
    otel_rl.shutdown()
"""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the fork warning is Python 3.12's")
def test_a_program_with_threads_of_its_own_is_warned_at_its_own_line(tmp_path: Path) -> None:
    """The warning stays the program's when it has threads of its own: once, at the line of
    its fork() (not inside otel_rl, which restarts its threads once fork() has returned)."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(OWN_THREAD))
    done = subprocess.run([sys.executable, "-W", "default", str(script), str(REPO)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if FORK_WARNING in line]
    assert len(warned) == 1, done.stderr
    assert warned[0].startswith(f"{script}:9: DeprecationWarning: This process (pid=")


def test_only_daemons_stopped_for_the_fork_start_again_and_an_ended_one_is_forgotten() -> None:
    """In this process, without forking: `pause_for_fork` / `resume_after_fork` around nothing."""
    import threading

    from otel_rl._internal import threads

    runs: list[str] = []
    finished = threading.Event()

    def once() -> None:
        runs.append("once")

    def loop() -> None:
        runs.append("loop")
        while not threads.stopping() and not finished.is_set():
            threads.sleep(0.01)

    first = threads.start_daemon("otel_rl-once", once)
    first.join(5)
    second = threads.start_daemon("otel_rl-loop", loop)
    assert threads.pause_for_fork() == []  # every live daemon stopped in time
    assert not second.is_alive()
    threads.resume_after_fork()
    assert second.is_alive() and not first.is_alive()
    assert sorted(runs) == ["loop", "loop", "once"]
    finished.set()  # its owner ends it: not asked to stop, so it is done for good
    second.join(5)
    assert second not in threads.live() and first not in threads.live()
    threads.pause_for_fork()
    threads.resume_after_fork()
    assert sorted(runs) == ["loop", "loop", "once"]
