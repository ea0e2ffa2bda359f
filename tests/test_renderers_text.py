"""The text renderers (tree view, cross-worker view) and the renderer registry."""

from __future__ import annotations

import re
from typing import Any

import pytest
from mlagents_envs import timers as ml

from otel_rl._internal.errors import UserError
from otel_rl._internal.tree import Tree
from otel_rl.renderers import crossworker, get_renderer, renderer_for_path, treeview
from otel_rl.renderers.treeview import format_seconds


def _worker(role: str, index: int, pid: int, step: float, sim: float, count: int = 10) -> Any:
    children: dict[str, Any] = {"sim": {"total": sim, "count": count}}
    return {
        "role": role,
        "index": index,
        "pid": pid,
        "path": ["rollout"],
        "tree": {
            "total": 0.0,
            "count": 0,
            "children": {
                "worker_step": {
                    "total": step,
                    "count": count,
                    "is_parallel": True,
                    "children": children,
                }
            },
        },
    }


def _tree_dict() -> dict[str, Any]:
    """A run in ML-Agents' schema: nesting, a parallel worker branch, gauges, metadata."""
    workers = [_worker("rollout", 0, 201, 1.0, 0.5), _worker("rollout", 1, 202, 2.0, 1.5)]
    return {
        "name": "root",
        "gauges": {"reward.mean": {"value": 1.5, "min": -2.0, "max": 3.25, "count": 10}},
        "metadata": {"timer_format_version": "0.1.0", "run_id": "ppo-7"},
        "total": 10.0,
        "count": 1,
        "self": 1.0,
        "children": {
            "env_step": {
                "total": 8.0,
                "count": 1000,
                "self": 999.0,  # wrong on purpose: self is recomputed
                "children": {
                    "policy": {"total": 3.0, "count": 1000, "self": 3.0},
                    "communicate": {"total": 4.0, "count": 1000, "self": 4.0},
                },
            },
            "rollout": {
                "total": 1.0,
                "count": 1,
                "self": 0.0,
                "children": {
                    "worker_step": {
                        "total": 3.0,
                        "count": 20,
                        "is_parallel": True,
                        "self": 1.0,
                        "children": {
                            "sim": {"total": 2.0, "count": 20, "is_parallel": True, "self": 2.0}
                        },
                    }
                },
            },
        },
        "workers": workers,
    }


def _rows(text: str) -> list[list[str]]:
    """Each table row as [name column, other cells...]; the name column's width is read off
    the header line (``block`` padded, then the right-aligned ``total`` column)."""
    rows = []
    width = 0
    for line in text.splitlines():
        if line.startswith("block "):
            width = line.index("total") - len("  ") - (11 - len("total"))
            continue
        if width and line.strip() and not line.startswith(("==", "gauges", "metadata")):
            rows.append([line[:width].rstrip(), *re.split(r"\s{2,}", line[width:].strip())])
        elif not line.strip():
            width = 0
    return rows


def _row(text: str, label: str) -> list[str]:
    """The cells of the first table row whose name column ends with `label`."""
    for cells in _rows(text):
        if cells[0].endswith(label):
            return cells
    raise AssertionError(f"no row for {label!r} in:\n{text}")


def _mlagents_tree() -> Tree:
    """A real ML-Agents timer tree with a trainer thread merged in as a parallel branch."""
    stack = ml.TimerStack()
    for _ in range(3):
        with ml.hierarchical_timer("env_step", stack):
            with ml.hierarchical_timer("communicator.exchange", stack):
                sum(range(500))
    with ml.hierarchical_timer("trainer_advance", stack):
        sum(range(100))
    ml.set_gauge("reward", 1.0, stack)
    worker = ml.TimerStack()
    with ml.hierarchical_timer("update_policy", worker):
        sum(range(300))
    stack.root.get_child("env_step").merge(worker.root, root_name="thread_root", is_parallel=True)
    return Tree.from_dict(ml.get_timer_tree(stack))


def test_tree_view_row_has_total_self_count_mean_and_share_of_parent() -> None:
    text = treeview.render(Tree.from_dict(_tree_dict()))
    assert _row(text, "policy") == [
        "│  ├─ policy",
        "3.000 s",
        "3.000 s",
        "1,000",
        "3.00 ms",
        "37.5%",
    ]
    # self = total - children, whatever the file said
    assert _row(text, "env_step")[1:4] == ["8.000 s", "1.000 s", "1,000"]
    assert _row(text, "root")[:4] == ["root", "10.000 s", "1.000 s", "1"]


def test_tree_view_lists_every_mlagents_node_in_tree_order() -> None:
    tree = _mlagents_tree()
    text = treeview.render(tree)
    rows = _rows(text)[1:]  # after the root
    walked = list(tree.root.walk())
    assert len(rows) == len(walked) == 5
    for (path, node), cells in zip(walked, rows, strict=True):
        assert cells[0].endswith(path[-1])
        assert cells[1] == format_seconds(node.total)
        assert cells[2] == format_seconds(node.self_time)
        assert cells[3] == f"{node.count:,}"


def test_parallel_branches_are_marked_and_explained() -> None:
    text = treeview.render(_mlagents_tree())
    assert "∥ thread_root" in text
    assert "∥ update_policy" in text
    assert "∥ communicator.exchange" not in text
    assert "its % parent is a multiple of the parent's time" in text
    ascii_text = treeview.render(_mlagents_tree(), ascii_only=True)
    assert "|| thread_root" in ascii_text
    assert ascii_text.isascii()


def test_parallel_branch_share_is_a_multiple_of_its_parent_never_a_percentage_past_100() -> None:
    text = treeview.render(Tree.from_dict(_tree_dict()))
    assert _row(text, "worker_step")[-1] == "3.00×"
    assert not re.search(r"\d{4}\.\d%", text)
    assert _row(treeview.render(Tree.from_dict(_tree_dict()), ascii_only=True), "worker_step")[-1] == "3.00x"


def test_gauges_and_metadata_are_summarised_at_the_end() -> None:
    text = treeview.render(Tree.from_dict(_tree_dict()))
    tail = text[text.index("gauges") :]
    assert re.search(r"reward\.mean\s+1\.5\s+-2\s+3\.25\s+10", tail)
    assert "run_id: ppo-7" in tail
    assert "timer_format_version: 0.1.0" in tail


def test_control_characters_in_names_are_escaped_not_printed() -> None:
    data = _tree_dict()
    data["children"]["evil\x1b[2J\nname"] = {"total": 0.5, "count": 1}
    data["metadata"]["cmd"] = "train\r\n--fake"
    text = treeview.render(Tree.from_dict(data))
    assert "\x1b" not in text and "\r" not in text
    assert "evil\\x1b[2J\\nname" in text
    assert "cmd: train\\r\\n--fake" in text


def test_incomplete_tree_is_never_presented_as_complete() -> None:
    data = _tree_dict()
    data["complete"] = False
    data["notes"] = ["3 spans had a missing parent"]
    text = treeview.render(Tree.from_dict(data))
    assert text.startswith("INCOMPLETE")
    assert "3 spans had a missing parent" in text
    assert "INCOMPLETE" not in treeview.render(Tree.from_dict(_tree_dict()))


def test_long_names_are_shortened_to_keep_columns_aligned() -> None:
    data = _tree_dict()
    data["children"]["x" * 300] = {"total": 0.5, "count": 1}
    lines = treeview.render(Tree.from_dict(data)).splitlines()
    header, long_row = lines[0], next(line for line in lines if "xxx" in line)
    assert "…" in long_row
    assert len(long_row) == len(header)
    assert len(long_row) < 160


def test_per_process_view_takes_worker_blocks_out_of_the_main_process() -> None:
    text = treeview.render(Tree.from_dict(_tree_dict()), per_process=True)
    main, worker0, worker1 = text.split("\n== ")[0], *text.split("\n== ")[1:3]
    assert main.startswith("== main process ==")
    # 3 s of worker_step, of which the workers ran 1 + 2: nothing is left for the main process.
    assert "worker_step" not in main
    assert "policy" in main
    assert worker0.startswith("worker rollout #0 (pid 201), started under rollout ==")
    assert _row(worker0, "worker_step")[1] == "1.000 s"
    assert _row(worker1, "sim")[1:4] == ["1.500 s", "1.500 s", "10"]


def test_cross_worker_view_shows_min_mean_max_and_slowest() -> None:
    data = _tree_dict()
    data["workers"].append(_worker("rollout", 2, 203, 6.0, 0.25, count=30))
    del data["workers"][0]["tree"]["children"]["worker_step"]["children"]["sim"]
    text = crossworker.render(Tree.from_dict(data))
    assert text.startswith("== rollout: 3 workers (pids 201, 202, 203), started under rollout ==")
    step = _row(text, "worker_step")
    assert step[1:5] == ["3/3", "1.000 s", "3.000 s", "6.000 s"]
    assert step[5] == "2.00x"
    assert step[6:9] == ["10", "16.7", "30"]
    assert step[-1] == "#2 (pid 203)"
    sim = _row(text, "sim")
    assert sim[1:5] == ["2/3", "250.00 ms", "875.00 ms", "1.500 s"]
    assert sim[-1] == "#1 (pid 202)"


def test_cross_worker_summary_groups_workers_by_role() -> None:
    data = _tree_dict()
    data["workers"].append(_worker("learner", 0, 301, 5.0, 4.0))
    summaries = crossworker.summarize(Tree.from_dict(data))
    assert [s.role for s in summaries] == ["rollout", "learner"]
    rollout = summaries[0]
    assert [s.path for s in rollout.nodes] == [(), ("worker_step",), ("worker_step", "sim")]
    assert rollout.nodes[1].totals == [1.0, 2.0]
    assert rollout.nodes[1].slowest.pid == 202
    assert "== learner: 1 workers" in crossworker.render(Tree.from_dict(data))


def test_cross_worker_view_without_workers_says_so() -> None:
    assert crossworker.render(_mlagents_tree()) == "no worker processes in this tree\n"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (12.3456, "12.346 s"),
        (0.00825, "8.25 ms"),
        (4.12e-4, "412.0 µs"),
        (5e-8, "50 ns"),
    ],
)
def test_durations_are_shown_in_a_readable_unit(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_registry_picks_renderers_by_name_and_extension() -> None:
    tree = Tree.from_dict(_tree_dict())
    assert get_renderer("text")(tree) == treeview.render(tree)
    assert get_renderer("workers")(tree) == crossworker.render(tree)
    assert Tree.from_json(get_renderer("json")(tree)).to_dict() == tree.to_dict()
    assert get_renderer(renderer_for_path("out/Report.HTML"))(tree).startswith("<!DOCTYPE html>")
    assert renderer_for_path("timers.json") == "json"
    with pytest.raises(UserError, match="unknown report format 'pdf'"):
        get_renderer("pdf")
    with pytest.raises(UserError, match="cannot tell the report format"):
        renderer_for_path("report.pdf")


def test_inside_a_parallel_branch_shares_are_percentages_again() -> None:
    tree = Tree.from_dict(
        {
            "total": 10.0,
            "count": 1,
            "children": {
                "env": {
                    "total": 5.0,
                    "count": 1,
                    "children": {
                        "worker": {
                            "total": 20.0,
                            "count": 4,
                            "is_parallel": True,
                            "children": {"step": {"total": 18.0, "count": 40, "is_parallel": True}},
                        }
                    },
                }
            },
        }
    )
    text = treeview.render(tree)
    assert _row(text, "worker")[-1] == "4.00×"  # where the branch starts: beside its parent
    assert _row(text, "step")[-1] == "90.0%"  # within the branch: a share of it
