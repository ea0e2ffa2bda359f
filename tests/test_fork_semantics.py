"""A forked child's own `get_timer_tree()` is ML-Agents': it starts from a copy of the parent's
stack (blocks open at the fork included), with otel_rl on as without it. The whole-run tree
still counts each block once: the child's blocks under the block that started it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlagents_envs")

PROGRAM = textwrap.dedent(
    """
    import json, multiprocessing as mp, sys
    if sys.argv[1] == "otel_rl":
        import otel_rl
        from otel_rl import timers
        otel_rl.configure(output_dir=sys.argv[2], spans="all")
    else:
        from mlagents_envs import timers

    def child(conn):
        with timers.hierarchical_timer("child_step"):
            pass
        first = timers.get_timer_tree()
        timers.reset_timers()
        with timers.hierarchical_timer("child_step"):
            pass
        conn.send([first, timers.get_timer_tree()])

    if __name__ == "__main__":
        with timers.hierarchical_timer("before"):
            pass
        with timers.hierarchical_timer("setup"):
            parent_conn, child_conn = mp.get_context("fork").Pipe()
            p = mp.get_context("fork").Process(target=child, args=(child_conn,))
            p.start()
            trees = parent_conn.recv()
            p.join()
        print(json.dumps(trees))
    """
)


def shape(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    result = {}
    for name, child in (tree.get("children") or {}).items():
        result[(*path, name)] = child["count"]
        result.update(shape(child, (*path, name)))
    return result


def run(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trees: list[dict[str, Any]] = json.loads(done.stdout)
    return trees


def test_forked_childs_timer_tree_is_mlagents_own(tmp_path: Path) -> None:
    mlagents = run(tmp_path, "mlagents")
    ours = run(tmp_path, "otel_rl")
    assert [shape(t) for t in ours] == [shape(t) for t in mlagents]
    # What ML-Agents shows: the parent's blocks, the open one, the child's block inside it.
    assert shape(ours[0]) == {("before",): 1, ("setup",): 0, ("setup", "child_step"): 1}
    assert shape(ours[1]) == {("child_step",): 1}


def test_whole_run_counts_the_forked_childs_blocks_once_where_they_ran(tmp_path: Path) -> None:
    run(tmp_path, "otel_rl")
    tree = json.loads((tmp_path / "out" / "timers.json").read_text())
    assert shape(tree) == {("before",): 1, ("setup",): 1, ("setup", "child_step"): 2}
    assert tree["children"]["setup"]["children"]["child_step"]["is_parallel"]


QUEUED = textwrap.dedent(
    """
    import multiprocessing as mp, sys
    import otel_rl
    from otel_rl import timers
    otel_rl.configure(output_dir=sys.argv[1], spans="all")

    def child(conn):
        with timers.hierarchical_timer("child_step"):
            pass
        timers.reset_timers()
        conn.send("done")

    if __name__ == "__main__":
        for _ in range(5):  # queued by each reset, not yet in the retired tree at the fork
            with timers.hierarchical_timer("parent_step"):
                pass
            timers.reset_timers()
        with timers.hierarchical_timer("setup"):
            parent_conn, child_conn = mp.get_context("fork").Pipe()
            p = mp.get_context("fork").Process(target=child, args=(child_conn,))
            p.start()
            parent_conn.recv()
            p.join()
    """
)


def test_roots_the_parent_queued_before_a_fork_are_counted_once(tmp_path: Path) -> None:
    # A reset queues its old root; a child forked before they are added to the retired tree
    # has a copy of the queue, which is the parent's: the whole run counts them once.
    script = tmp_path / "program.py"
    script.write_text(QUEUED)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    tree = json.loads((tmp_path / "out" / "timers.json").read_text())
    assert shape(tree) == {("parent_step",): 5, ("setup",): 1, ("setup", "child_step"): 1}
