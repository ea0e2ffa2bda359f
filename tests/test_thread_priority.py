"""otel_rl's background threads run nicer than the program (the ``thread_nice`` setting), so
that on a machine short of cores the training's threads are scheduled first: in the main
process, in a spawned worker, in a forked one and after a fork in the parent. The program's
own threads keep their priority, and so does the SIGTERM watcher.

Each program runs in a fresh interpreter and reads every thread's niceness back from the
kernel (``getpriority`` by thread id), next to the thread's name."""

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

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="a thread's own niceness is Linux's")

PROGRAM = """
    import json, multiprocessing as mp, os, sys, threading, time
    sys.path.insert(0, sys.argv[1])

    def niceness():
        return {t.name: os.getpriority(os.PRIO_PROCESS, t.native_id)
                for t in threading.enumerate() if t.native_id is not None}

    def work(queue):
        from otel_rl import timers
        with timers.hierarchical_timer("in_worker"):
            pass
        time.sleep(0.3)  # the worker's flusher is up by now
        queue.put((os.getpid(), niceness()))

    if __name__ == "__main__":
        start_nice = int(sys.argv[3])
        if start_nice:
            os.nice(start_nice)
        import otel_rl
        from otel_rl import timers
        otel_rl.configure(output_dir=sys.argv[2])
        with timers.hierarchical_timer("step"):
            pass
        user = threading.Thread(target=time.sleep, args=(1.0,), name="user-thread")
        user.start()
        time.sleep(0.3)
        seen = {"main": niceness()}
        for method in ("spawn", "fork"):
            ctx = mp.get_context(method)
            queue = ctx.Queue()
            with timers.hierarchical_timer("start_" + method):
                p = ctx.Process(target=work, args=(queue,))
                p.start()
                seen[method] = queue.get(timeout=60)[1]
                p.join(60)
        time.sleep(0.3)
        seen["main_after_fork"] = niceness()
        user.join()
        print(json.dumps(seen))
"""


def run(tmp_path: Path, start_nice: int = 0, **env: str) -> dict[str, dict[str, int]]:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEPARENT"))}
    done = subprocess.run(
        [sys.executable, str(script), str(REPO), str(tmp_path / "out"), str(start_nice)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env={**clean, **env})
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "out" / "timers.json").read_text())["children"]
    return seen


def otel_rl_threads(threads: dict[str, int]) -> dict[str, int]:
    """otel_rl's threads but the SIGTERM watcher (started only while a SIGTERM is handled),
    which runs at the program's priority wherever it is."""
    ours = {name: nice for name, nice in threads.items() if name.startswith("otel_rl-")}
    watcher = ours.pop("otel_rl-sigterm", None)
    assert watcher is None or watcher == threads["MainThread"], threads
    return ours


def test_otel_rl_threads_run_ten_steps_nicer_by_default_the_programs_threads_do_not(
    tmp_path: Path,
) -> None:
    seen = run(tmp_path)
    main = seen["main"]
    assert main["MainThread"] == 0 and main["user-thread"] == 0
    ours = otel_rl_threads(main)
    # The main process's flusher, its sink and the relay its workers send to, at least.
    assert {"otel_rl-flush", "otel_rl-sink-file"} <= set(ours), main
    assert set(ours.values()) == {10}, main
    for worker in ("spawn", "fork"):
        threads = seen[worker]
        assert threads["MainThread"] == 0, (worker, threads)
        ours = otel_rl_threads(threads)
        assert ours and set(ours.values()) == {10}, (worker, threads)
    after = otel_rl_threads(seen["main_after_fork"])  # stopped for the fork, started again
    assert "otel_rl-flush" in after and set(after.values()) == {10}, seen["main_after_fork"]
    assert seen["main_after_fork"]["MainThread"] == 0


def test_the_steps_count_from_the_programs_niceness_up_to_nineteen(tmp_path: Path) -> None:
    seen = run(tmp_path, start_nice=5)
    assert seen["main"]["MainThread"] == 5
    ours = otel_rl_threads(seen["main"])
    assert set(ours.values()) == {15}, seen["main"]
    seen = run(tmp_path, start_nice=5, OTEL_RL_THREAD_NICE="19")
    ours = otel_rl_threads(seen["main"])
    assert set(ours.values()) == {19}, seen["main"]  # the most Linux gives
    spawned = otel_rl_threads(seen["spawn"])  # the setting travels in the carrier
    assert spawned and set(spawned.values()) == {19}, seen["spawn"]


def test_zero_leaves_every_thread_at_the_programs_priority(tmp_path: Path) -> None:
    seen = run(tmp_path, OTEL_RL_THREAD_NICE="0")
    for where in ("main", "spawn", "fork", "main_after_fork"):
        ours = otel_rl_threads(seen[where])
        assert ours and set(ours.values()) == {0}, (where, seen[where])


def test_a_value_out_of_range_is_refused_where_it_is_read() -> None:
    import otel_rl
    from otel_rl._internal import config

    for bad in (-1, 20, True, 2.5):
        with pytest.raises(ValueError):
            otel_rl.configure(thread_nice=bad)
    setting = next(s for s in config.TABLE if s.name == "thread_nice")
    for text in ("-1", "20", "x", "1.5"):
        with pytest.raises(ValueError):
            setting.parse(text)
    assert setting.parse(" 0 ") == 0 and setting.parse("19") == 19


def test_a_daemon_that_does_not_yield_keeps_the_programs_priority_and_live_ones_follow(
    tmp_path: Path,
) -> None:
    """`start_daemon(yields=False)` (the SIGTERM watcher's) stays at the program's niceness;
    a yielding daemon already running when the niceness is set follows at once."""
    code = """
        import json, os, sys, threading, time
        sys.path.insert(0, sys.argv[1])
        from otel_rl._internal import threads

        def idle():
            while not threads.stopping():
                threads.sleep(0.01)

        early = threads.start_daemon("otel_rl-early", idle)
        time.sleep(0.05)
        threads.set_niceness(7)
        keeps = threads.start_daemon("otel_rl-keeps", idle, yields=False)
        late = threads.start_daemon("otel_rl-late", idle)
        time.sleep(0.05)
        print(json.dumps({d.name: os.getpriority(os.PRIO_PROCESS, d.thread.native_id)
                          for d in (early, keeps, late)}))
    """
    script = tmp_path / "daemons.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([sys.executable, str(script), str(REPO)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"otel_rl-early": 7, "otel_rl-keeps": 0, "otel_rl-late": 7}
