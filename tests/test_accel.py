"""The compiled hot path (`_hotpath.c`) against the pure-Python one: the same workloads give
the same trees, records, drops and tallies, exactly; a compiler-less ``pip install`` runs pure.

Random programs of nested, erroring, decorated, reset and threaded blocks run once on each
path with the same deterministic clock and span ids; everything the recorder holds afterwards
is compared whole. A second comparison keeps the real clock (the compiled path reads it
natively) and compares everything but the times, which must lie between readings of
`time.perf_counter_ns` taken around the workload.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import accel, recorder
from otel_rl.testing import DeterministicClock

REPO = Path(__file__).resolve().parents[1]
NAMES = ("step", "update", "env", "forward", "io")

pytestmark = pytest.mark.skipif(
    accel.compiled() is None and not os.environ.get("CI"),
    reason="the compiled hot path is not built here (python scripts/build_accel.py)")


class Boom(Exception):
    pass


class Lost(LookupError):
    pass


def program(seed: int) -> Callable[[], None]:
    """A random workload: nests up to 5 deep, some blocks raising (caught a random number of
    levels up), decorated functions, explicit stacks, a reset inside an open block, and
    threads (run one after another, so a shared deterministic clock stays deterministic)."""
    rng = random.Random(seed)

    def body(depth: int) -> None:
        for _ in range(rng.randint(0, 3 if depth < 5 else 0)):
            name = rng.choice(NAMES)
            kind = rng.random()
            if kind < 0.1:
                try:
                    with recorder.hierarchical_timer(name):
                        raise Boom(f"at depth {depth}")
                except Boom:
                    pass
            elif kind < 0.15:
                timed = recorder.hierarchical_timer(name)(lambda d=depth: body(d + 1))
                timed()
            elif kind < 0.18:
                with recorder.hierarchical_timer(name, None, False):
                    body(depth + 1)
            elif kind < 0.2:
                with recorder.hierarchical_timer(name, gpu=None):  # keywords: the pure init
                    pass
            elif kind < 0.22 and depth:
                with recorder.hierarchical_timer(name):
                    recorder.thread_stack().reset()  # this block still pops its own frames
            elif kind < 0.26:
                try:
                    with recorder.hierarchical_timer(name):
                        body(depth + 1)
                        raise Lost(name)
                except Lost:
                    pass
            else:
                with recorder.hierarchical_timer(name):
                    body(depth + 1)

    threads = rng.randint(0, 3)

    def run() -> None:
        body(0)
        # Each thread stays alive until all have run: a thread id used again would find the
        # dead thread's stack (ML-Agents keys stacks by thread id), differently in each run.
        finish = threading.Event()
        started = []
        for i in range(threads):
            done = threading.Event()

            def work(done: threading.Event = done) -> None:
                body(1)
                done.set()
                finish.wait(60)

            th = threading.Thread(target=work, name=f"worker-{i}")
            th.start()
            done.wait(60)
            started.append(th)
        finish.set()
        for th in started:
            th.join()
        own = recorder.TimerStack()
        with recorder.hierarchical_timer("explicit", own):
            with recorder.hierarchical_timer("inner", own):
                pass
        body(1)

    return run


def run_on(path: bool, workload: Callable[[], None], *, cap: int = 10**6, full_at: int = 0,
           full_skip: int = 0, tallied: bool = False,
           deterministic: bool = True) -> dict[str, Any]:
    """Run `workload` on one path with every stack in one trace; what the recorder holds.
    With `full_at`, a hook empties the buffer whenever an append leaves more in it (as a main
    process's pipeline packs it), noting how many it found and in which thread, except in the
    thread `full_skip`."""
    recorder.reset_for_tests()
    assert recorder.use_accelerator(path) is path
    sink: list[Any] = []
    trace = recorder.Trace(77, 10**9, sink)
    slots = [0] * recorder.TALLY_SLOTS
    if tallied:
        recorder.use_tally(slots)
    previous = None
    if deterministic:
        previous = recorder.swap_clock_and_ids(DeterministicClock(7), itertools.count(1),
                                               lambda: 1)

    def join(stack: recorder.TimerStack) -> None:
        stack.trace = trace

    emptied: list[Any] = []
    fulls: list[int] = []

    def full(buffer: list[Any]) -> None:
        assert buffer is sink
        fulls.append((len(buffer), threading.current_thread().name))
        emptied.extend(buffer)
        buffer.clear()

    recorder.arm(cap, join, None, full if full_at else None, full_at, full_skip)
    stacks_before = recorder.all_stacks()
    for stack in stacks_before:
        join(stack)
    try:
        workload()
    finally:
        recorder.disarm()
        if previous is not None:
            recorder.swap_clock_and_ids(*previous)
        recorder.use_accelerator(accel.wanted())
        recorder._formatted_stacks.clear()  # other tests look at what it holds
    stacks = recorder.all_stacks()
    tids = {st.tid: i for i, st in enumerate(stacks)}
    return {
        "records": [(*r[:5], tids.get(r[5], -1), r[6], r[7]) for r in emptied + sink],
        "fulls": fulls,
        "trees": [recorder.node_dict(st.root) for st in stacks],
        "whole": [recorder.node_dict(recorder.stack_contribution(st)) for st in stacks],
        "dropped": [st.dropped for st in stacks],
        "open": [st.open_blocks() for st in stacks],
        "frames": [len(st.stack) for st in stacks],
        # Per stack (slots are handed out in order across runs), and the first two.
        "tally": (slots[:2], [slots[st.slot] for st in stacks]) if tallied else None,
    }


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_record_the_same_on_both_paths(seed: int) -> None:
    pure = run_on(False, program(seed))
    compiled = run_on(True, program(seed))
    assert pure["records"], "the workload recorded nothing"
    assert compiled == pure


@pytest.mark.parametrize("seed", range(4))
def test_the_tallied_enter_counts_the_same_on_both_paths(seed: int) -> None:
    pure = run_on(False, program(seed), tallied=True)
    compiled = run_on(True, program(seed), tallied=True)
    assert compiled == pure
    assert max(compiled["tally"][1]) == max(r[0] for r in compiled["records"]) > 0


def test_a_full_buffer_drops_and_counts_the_same_on_both_paths() -> None:
    pure = run_on(False, program(3), cap=10)
    compiled = run_on(True, program(3), cap=10)
    assert len(pure["records"]) == 10 and sum(pure["dropped"]) > 0
    assert compiled == pure


@pytest.mark.parametrize("full_at", [1, 7])
def test_a_filling_buffer_calls_its_hook_alike_on_both_paths(full_at: int) -> None:
    pure = run_on(False, program(5), full_at=full_at)
    compiled = run_on(True, program(5), full_at=full_at)
    assert pure["fulls"] and {n for n, _ in pure["fulls"]} == {full_at + 1}, pure["fulls"]
    assert compiled == pure
    assert run_on(True, program(5))["records"] == pure["records"]  # the hook loses none


def test_the_main_threads_blocks_never_call_the_hook_on_either_path() -> None:
    main = threading.main_thread().ident or 0
    pure = run_on(False, program(5), full_at=3, full_skip=main)
    compiled = run_on(True, program(5), full_at=3, full_skip=main)
    threads = {name for _, name in pure["fulls"]}
    assert threads and "MainThread" not in threads, pure["fulls"]
    assert compiled == pure
    assert run_on(True, program(5))["records"] == pure["records"]


def test_errors_carry_the_same_extra_on_both_paths() -> None:
    def workload() -> None:
        for i in range(3):
            try:
                with recorder.hierarchical_timer("outer"):
                    with recorder.hierarchical_timer("inner"):
                        raise ValueError(f"bad {i}")
            except ValueError:
                pass

    pure = run_on(False, workload)
    compiled = run_on(True, workload)
    assert compiled == pure
    errors = [r[7]["error"] for r in compiled["records"]]
    assert [e[:2] for e in errors] == [("ValueError", f"bad {i}") for i in range(3) for _ in "io"]
    assert all("raise ValueError" in e[2] for e in errors)


def strip_times(result: dict[str, Any]) -> dict[str, Any]:
    def node(d: dict[str, Any]) -> dict[str, Any]:
        return {"count": d["count"], "children": {k: node(v) for k, v in
                                                  d.get("children", {}).items()}}

    return {"records": [(r[0], r[1], r[2], r[5], r[6], r[7] and r[7]["error"][:2])
                        for r in result["records"]],
            "trees": [node(t) for t in result["trees"]], "dropped": result["dropped"]}


def test_the_real_clock_gives_the_same_records_but_times_on_both_paths() -> None:
    work = program(5)
    before = time.perf_counter_ns()
    compiled = run_on(True, work, deterministic=False)
    after = time.perf_counter_ns()
    pure = run_on(False, program(5), deterministic=False)
    # Span ids come from a fresh random sequence per run: compare them as offsets.
    for result in (pure, compiled):
        first = min(r[0] for r in result["records"])
        result["records"] = [(r[0] - first, r[1] - first if r[1] else 0, *r[2:])
                             for r in result["records"]]
    assert strip_times(compiled) == strip_times(pure)
    for record in compiled["records"]:
        assert before <= record[3] <= record[4] <= after  # read from perf_counter_ns' clock
    totals = [d["total"] for t in compiled["trees"] for d in t.get("children", {}).values()]
    assert all(0 <= total < (after - before) * 1e-9 for total in totals)


def test_concurrent_threads_record_the_same_counts_on_both_paths() -> None:
    def workload() -> None:
        def steps() -> None:
            for _ in range(300):
                with recorder.hierarchical_timer("step"):
                    with recorder.hierarchical_timer("env"):
                        pass

        threads = [threading.Thread(target=steps) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    for path in (False, True):
        result = run_on(path, workload, deterministic=False)
        assert sorted(r[2] for r in result["records"]) == ["env"] * 1200 + ["step"] * 1200
        # (Summed: a finished thread's id may be used again, and its stack with it.)
        steps = [t["children"]["step"] for t in result["trees"] if t.get("children")]
        assert sum(s["count"] for s in steps) == 1200
        assert sum(s["children"]["env"]["count"] for s in steps) == 1200
        ids = [r[0] for r in result["records"]]
        assert len(set(ids)) == len(ids)  # one id sequence, no id twice


def test_an_exit_without_enter_fails_alike_on_both_paths() -> None:
    messages = []
    for path in (False, True):
        recorder.use_accelerator(path)
        try:
            with pytest.raises(AttributeError) as info:
                recorder.hierarchical_timer("never").__exit__(None, None, None)
            messages.append(str(info.value))
        finally:
            recorder.use_accelerator(accel.wanted())
    assert messages[0] == messages[1]


def test_the_gpu_opt_in_sees_the_same_calls_on_both_paths() -> None:
    seen: list[tuple[str, bool | None]] = []

    def opt_in(timer: recorder.hierarchical_timer, name: str, gpu: bool | None) -> None:
        seen.append((name, gpu))
        timer._gpu_opt = bool(gpu)

    previous = recorder._gpu_opt_in
    recorder.set_gpu_opt_in(opt_in)
    try:
        for path in (False, True):
            recorder.use_accelerator(path)
            recorder.hierarchical_timer("plain")
            recorder.hierarchical_timer("given", None, False)
            recorder.hierarchical_timer("keyword", gpu=True)
            recorder.use_gpu_blocks(True)
            recorder.gpu_wanted["named"] = True
            recorder.hierarchical_timer("named")
            recorder.use_gpu_blocks(False)
            recorder.hierarchical_timer("after")
    finally:
        recorder.set_gpu_opt_in(previous)
        recorder.use_gpu_blocks(False)
        recorder.use_accelerator(accel.wanted())
    once = [("given", False), ("keyword", True), ("named", None)]
    assert seen == once + once


def test_switching_paths_keeps_the_tally_and_stack_lookup_swaps() -> None:
    slots = [0] * recorder.TALLY_SLOTS
    recorder.reset_for_tests()
    try:
        recorder.use_tally(slots)
        for path in (True, False, True):
            recorder.use_accelerator(path)
            # Tallied enter, as a relaying worker's: the compiled one where it is compiled.
            assert (recorder.hierarchical_timer.__enter__ is not recorder._tallied_enter) is path
        recorder.use_stack_lookup(recorder.thread_stack)
        recorder.use_accelerator(False)
        recorder.use_stack_lookup(None)
        assert recorder.hierarchical_timer.__enter__ is recorder._tallied_enter
    finally:
        recorder.reset_for_tests()
        recorder.use_accelerator(accel.wanted())


def test_otel_rl_says_which_hot_path_it_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = "from otel_rl._internal import recorder; print(recorder.hot_path())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={**env, "OTEL_RL_ACCELERATOR": "true"}, timeout=60, check=True)
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "OTEL_RL_ACCELERATOR": "false"}, timeout=60, check=True)
    assert on.stdout.startswith("compiled")
    assert off.stdout.strip() == "pure Python (the accelerator setting is off)"
    cli = subprocess.run([sys.executable, "-m", "otel_rl", "--version"], capture_output=True,
                         text=True, env={**env, "OTEL_RL_ACCELERATOR": "true"}, timeout=60,
                         check=True)
    assert "hot path: compiled" in cli.stdout
    assert "Sample Factory Timing: compiled (otel_rl._internal._timingacc)" in cli.stdout
    cli = subprocess.run([sys.executable, "-m", "otel_rl", "--version"], capture_output=True,
                         text=True, env={**env, "OTEL_RL_ACCELERATOR": "false"}, timeout=60,
                         check=True)
    assert cli.stdout.count("pure Python (the accelerator setting is off)") == 2


@pytest.fixture
def project_copy(tmp_path: Path) -> Iterator[Path]:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "otel_rl", source / "otel_rl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    yield source


def test_pip_install_without_a_compiler_runs_the_pure_path(project_copy: Path,
                                                           tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    # No dependencies: the recorder imports with the standard library only. The build
    # backend comes from the package index (setuptools>=77), as for any `pip install .`.
    done = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--quiet",
                           "--disable-pip-version-check", project_copy],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**env, "CC": "/bin/false"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check = ("import otel_rl, glob, os; from otel_rl._internal import recorder as r\n"
             "with r.hierarchical_timer('a'):\n    pass\n"
             "print(otel_rl.__file__); print(r.hot_path()); print(r.thread_stack().root"
             ".children['a'].count)\n"
             "print(glob.glob(os.path.join(os.path.dirname(otel_rl.__file__), '_internal', '*.so')))\n"
             "from otel_rl._internal import metrics_columns as m; print(m.reader() is m.PURE)\n"
             "import otel_rl.timing as t; x = t.Timing('x')\n"
             "with x.add_time('b'):\n    pass\n"
             "print(t.accelerated(), x.b > 0)")
    ran = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    where, path, count, built, pure_metrics, pure_timing = ran.stdout.splitlines()
    assert where.startswith(str(venv))
    assert path == "pure Python (the compiled hot path is not built)"
    assert (count, built, pure_metrics) == ("1", "[]", "True")  # the metrics' columns: pure
    assert pure_timing == "False True"  # Sample Factory's Timing: pure, and timing
    version = subprocess.run([python, "-m", "otel_rl", "--version"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path, env=env)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().endswith(
        "(hot path: pure Python (the compiled hot path is not built); Sample Factory Timing: "
        "pure Python (the compiled Timing is not built))")
