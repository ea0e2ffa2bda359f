"""Process state has one owner: forks, resets and the import graph (issue 10)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import otel_rl
from otel_rl._internal import procstate, recorder, runtime
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl.timers import get_timer_tree, hierarchical_timer
from tests.test_layers import module_graph

PACKAGE = Path(otel_rl.__file__).parent


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_with_propagation_off_neither_keeps_nor_reexports_records(
        tmp_path: Path) -> None:
    otel_rl.configure(spans="all", output_dir=str(tmp_path), propagate=False,
                      flush_interval=3600)
    rt = runtime.active()
    assert rt is not None
    for _ in range(50):
        with hierarchical_timer("before_fork"):
            pass
    buffered = len(rt.pipeline.buffer)
    assert buffered == 50  # unflushed at fork time
    read_end, write_end = os.pipe()
    with hierarchical_timer("start_child"):
        pid = os.fork()
        if pid == 0:  # the child: report what it sees, then leave without pytest's teardown
            try:
                os.close(read_end)
                for _ in range(1000):
                    with hierarchical_timer("child_step"):
                        pass
                report = {
                    "inherited_buffer": len(rt.pipeline.buffer),
                    "cap": recorder.buffer_cap,
                    "runtime": runtime.current() is not None,
                    # As with ML-Agents, the child's own tree goes on from the parent's.
                    "child_steps": get_timer_tree()["children"]["start_child"]["children"]
                    ["child_step"]["count"],
                }
                otel_rl.shutdown()  # the parent's run: nothing to flush or write from here
                os.write(write_end, json.dumps(report).encode())
            except BaseException as exc:
                os.write(write_end, repr(exc).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report = json.loads(data) if data.startswith(b"{") else data
    # The child records no spans at all (propagation is off: a fork is like a spawned child
    # nobody configured), so nothing piles up in the parent's buffer that nothing drains...
    assert report == {"inherited_buffer": buffered, "cap": 0, "runtime": False,
                      "child_steps": 1000}
    otel_rl.shutdown()
    # ...and the parent's unflushed records are exported once, by the parent only.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".otel-rl-run", "spans.otlp.jsonl", "timers.json"]  # .otel-rl-run: the run id
    spans = read_otlp_json_file(tmp_path / "spans.otlp.jsonl")
    assert len({s.span_id for s in spans}) == len(spans)
    assert sum(s.name == "before_fork" for s in spans) == 50
    assert not any(s.name == "child_step" for s in spans)
    assert {s.resource["process.pid"] for s in spans} == {os.getpid()}
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["before_fork"]["count"] == 50
    assert "children" not in tree["children"]["start_child"]


def test_reset_for_tests_forgets_the_run_and_every_stack(tmp_path: Path) -> None:
    otel_rl.configure(spans="all", output_dir=str(tmp_path))
    with hierarchical_timer("kept_by_nobody"):
        pass
    runtime.reset_for_tests()  # the runtime's name for the one reset (procstate's)
    assert runtime.current() is None
    assert recorder.buffer_cap == 0 and recorder.on_new_stack is None
    assert recorder.all_stacks() == []
    assert "children" not in get_timer_tree()


def test_the_carrier_is_a_leaf() -> None:
    graph = module_graph()
    assert graph["otel_rl._internal.carrier"] <= {"otel_rl._internal", "otel_rl._internal.log"}
    assert "otel_rl._internal.propagation" not in graph["otel_rl._internal.runtime"]


def test_testing_module_imports_without_pytest() -> None:
    code = ("import sys\n"
            "class NoPytest:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'pytest' or name.startswith(('pytest.', '_pytest')):\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, NoPytest())\n"
            "import otel_rl.testing as t\n"
            "from otel_rl.timers import hierarchical_timer\n"
            "with t.capture_spans() as c:\n"
            "    with hierarchical_timer('update'):\n"
            "        pass\n"
            "print(c.names(), hasattr(t, 'otel_rl_capture'), 'pytest' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['update',", "'run',", "'otel_rl", "aggregate']", "False",
                                  "False"]


def test_the_recorders_switches_have_one_writer() -> None:
    # Nobody assigns the recorder's module globals from outside...
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                assert not (isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "recorder"), f"{path}:{node.lineno}"
    # ...inside it no ``global`` statement: its state (`_State`: clock, ids, switches, tally)
    # is written by `_assign` alone, and the span switches only by arm() and disarm().
    from otel_rl._internal import recorder

    tree = ast.parse((PACKAGE / "_internal" / "recorder.py").read_text(encoding="utf-8"))
    assert [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Global)] == []
    state = set(recorder._State.__annotations__)
    assert {"perf_counter_ns", "_ids", "_other_ids", "buffer_cap", "tally"} <= state
    assert all(hasattr(recorder, name) for name in state)
    switches = {"buffer_cap", "on_new_stack", "on_merge"}
    writers = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
               for call in ast.walk(fn) if isinstance(call, ast.Call)
               and isinstance(call.func, ast.Name) and call.func.id == "_assign"
               and switches & {kw.arg for kw in call.keywords}}
    assert writers == {"arm", "disarm"}
    # A name `_assign` does not know is a type error (mypy) and would be a new global: the
    # state it names is what the hot path reads.
    recorder._assign(buffer_cap=recorder.buffer_cap)


SIGTERM_AT_FORK = """
import os, signal, sys, time
# One CPU for this process and its children: a forked child does not run before the parent's
# kill below, so the SIGTERM reaches it before CPython's after-fork code (which clears signals
# tripped before it ran). That is how Pool.terminate() caught a worker the scheduler had not
# run yet, and the worker stayed blocked on the task queue forever.
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import otel_rl
otel_rl.configure(output_dir=sys.argv[1])
assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # otel_rl's flush handler
children = []
for _ in range(12):
    pid = os.fork()
    if pid == 0:
        time.sleep(15)  # only if the SIGTERM was lost
        os._exit(0)
    os.kill(pid, signal.SIGTERM)
    children.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_sigterm_sent_to_a_child_just_forked_is_not_lost(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SIGTERM_AT_FORK, str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out) == [-15] * 12  # each child died of its SIGTERM, none slept it out


SIGTERM_WHILE_ASLEEP = """
import multiprocessing as mp, json, signal, sys, threading, time
import otel_rl
from otel_rl.timers import hierarchical_timer

def worker(lock):
    with hierarchical_timer("worker_block"):
        pass
    def trip():
        # SIGTERM's C handler runs on this thread while the main thread sleeps on the lock:
        # Python marks the signal for the main thread, which nothing wakes. The same happens
        # when it lands on the main thread just before it blocks (a pool worker's task queue).
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Thread(target=trip, daemon=True).start()
    lock.acquire()  # held by the parent for good

if __name__ == "__main__":
    otel_rl.configure(output_dir=sys.argv[1], spans="all")
    ctx = mp.get_context("fork")
    lock = ctx.Lock()
    lock.acquire()
    with hierarchical_timer("start"):
        p = ctx.Process(target=worker, args=(lock,))
        p.start()
        p.join(30)
    if p.exitcode is None:
        p.kill()
    otel_rl.shutdown()
    print(json.dumps(p.exitcode))
"""


def test_sigterm_marked_while_the_workers_main_thread_sleeps_still_flushes_and_ends_it(
        tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_ASLEEP, str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out) == -15
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["start"]["children"]["worker_block"]["count"] == 1


def _dirty_every_part() -> None:
    """Leave state in every part that keeps some: a merge point, a component, a scalar, a
    GPU pair waiting, and a run with a component open in a thread."""
    from otel_rl._internal import components, gpu, metrics, placement
    from otel_rl.timing import Timing

    placement._places[(1, 2)] = ("somewhere",)
    metrics.record_scalar("Environment/Reward", 1.0, 3)
    pair = gpu.Pending(None, None, 0, recorder.TimerNode("gpu_block"), 7)
    pair.state = gpu.GIVEN_UP
    gpu.spans[7] = pair

    def work() -> None:
        with Timing("RolloutWorker_w0 profile").add_time("step"):
            pass

    with hierarchical_timer("main_loop"):
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    assert components._stacks and placement.places() and metrics.scalar_state()


def _part_state() -> dict[str, object]:
    from otel_rl._internal import components, gpu, metrics, placement

    return {"places": placement.places(), "components": len(components._stacks),
            "scalars": metrics.scalar_state(), "gpu": len(gpu.spans)}


CLEAN = {"places": [], "components": 0, "scalars": [], "gpu": 0}


def test_one_fork_hook_runs_every_parts_reset_in_a_known_order(tmp_path: Path) -> None:
    otel_rl.configure(output_dir=str(tmp_path), propagate=False)
    from otel_rl._internal import components, gpu, metrics, placement  # noqa: F401 (registered)

    # The runtime last: it may make the child a worker, which uses the other parts.
    assert procstate.registered("after_in_child") == [
        "placement", "components", "metrics", "gpu", "runtime"]
    assert procstate.registered("before") == ["runtime"]
    assert procstate.registered("for_tests")[0] == "runtime"  # shuts the run down first
    # ...and it is the only fork hook otel_rl registers.
    callers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "register_at_fork":
                callers.append(path.name)
    assert callers == ["procstate.py"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_with_every_part_reset(tmp_path: Path) -> None:
    otel_rl.configure(output_dir=str(tmp_path), propagate=False)
    _dirty_every_part()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(_part_state()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    assert json.loads(data) == CLEAN
    assert _part_state() != CLEAN  # the parent keeps its own


def test_reset_for_tests_resets_every_part(tmp_path: Path) -> None:
    otel_rl.configure(output_dir=str(tmp_path), propagate=False)
    _dirty_every_part()
    procstate.reset_for_tests()
    assert _part_state() == CLEAN
    assert runtime.current() is None and recorder.all_stacks() == []


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError, match=r"add it to procstate\.ORDER"):
        procstate.register("mystery", after_in_child=lambda: None)


#: Modules that still rebind their own globals with ``global`` statements, and how many: the
#: runtime's run and signal state, Ray's patch state, components', the timing facade's, and
#: small once-only flags (see docs/DESIGN.md, "One owner of process state"). The recorder and
#: GPU timing have none: their state is a `_State` written by `_assign`. The list may shrink,
#: never grow: new process state gets an owner of its own.
GLOBAL_STATEMENTS_LEFT = {
    "_internal/runtime.py": 7, "_internal/ray_support/patches.py": 4,
    "_internal/ray_support/calls.py": 3, "_internal/ray_support/worker.py": 1,
    "_internal/components.py": 3, "timing.py": 3, "_internal/metrics.py": 2,
    "_internal/threads.py": 2, "_internal/procstate.py": 1, "_internal/propagation.py": 1,
    "_internal/tallyfile.py": 1, "_internal/torchrun.py": 1,
}


def test_global_statements_do_not_spread() -> None:
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        n = sum(isinstance(node, ast.Global) for node in ast.walk(tree))
        if n:
            found[str(path.relative_to(PACKAGE))] = n
    assert set(found) <= set(GLOBAL_STATEMENTS_LEFT)
    assert all(found[name] <= GLOBAL_STATEMENTS_LEFT[name] for name in found)
    assert "_internal/recorder.py" not in found and "_internal/gpu.py" not in found
