"""`compare`/`render` of two trees, and `otel-rl diff` as a CI gate (exit codes)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlagents_envs import timers as ml

from otel_rl._internal.tree import Tree
from otel_rl.renderers.diff import compare, regressions, render

REPO = Path(__file__).resolve().parent.parent


def _tree(env: float, policy: float, update: float, extra: dict[str, Any] | None = None) -> Any:
    children: dict[str, Any] = {
        "env_step": {
            "total": env,
            "count": 100,
            "children": {"policy": {"total": policy, "count": 100}},
        },
        "update": {"total": update, "count": 10},
    }
    children.update(extra or {})
    return {"name": "root", "total": env + update + 1.0, "count": 1, "children": children}


def _diff_cli(tmp_path: Path, a: Any, b: Any, *args: str) -> subprocess.CompletedProcess[str]:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    for path, data in ((pa, a), (pb, b)):
        path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "otel_rl", "diff", str(pa), str(pb), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_diffs_are_sorted_by_absolute_total_change_then_self() -> None:
    a = Tree.from_dict(_tree(env=10.0, policy=4.0, update=5.0))
    b = Tree.from_dict(_tree(env=10.0, policy=6.0, update=2.0))
    diffs = compare(a, b)
    # update -3 s, root -3 s (tie on total: root's self is unchanged, update's moved 3 s),
    # policy +2 s, env_step 0 total but -2 s self.
    assert [d.path for d in diffs] == [("update",), (), ("env_step", "policy"), ("env_step",)]
    policy = diffs[2]
    assert (policy.before_total, policy.after_total, policy.delta_total) == (4.0, 6.0, 2.0)
    assert policy.relative_total == pytest.approx(0.5)
    assert diffs[3].delta_total == 0.0 and diffs[3].delta_self == -2.0


def test_nodes_only_in_one_tree_are_included() -> None:
    a = Tree.from_dict(_tree(1.0, 0.5, 1.0, extra={"old_block": {"total": 0.2, "count": 1}}))
    b = Tree.from_dict(_tree(1.0, 0.5, 1.0, extra={"new_block": {"total": 0.3, "count": 4}}))
    by_path = {d.path: d for d in compare(a, b)}
    added, removed = by_path[("new_block",)], by_path[("old_block",)]
    assert added.status == "added" and added.before_total is None and added.after_count == 4
    assert math.isinf(added.relative_total)
    assert removed.status == "removed" and removed.after_total is None
    assert removed.delta_total == pytest.approx(-0.2)
    rows = {line.split()[0]: line.split() for line in render(compare(a, b)).splitlines()[1:]}
    # block, before, after, delta, change, ...
    assert rows["new_block"][1:6] == ["-", "300.00", "ms", "+300.00", "ms"]
    assert rows["new_block"][6] == "new"
    assert rows["old_block"][1:7] == ["200.00", "ms", "-", "-200.00", "ms", "gone"]


def test_regression_needs_both_percent_and_absolute_growth() -> None:
    a = Tree.from_dict(_tree(env=10.0, policy=0.001, update=5.0))
    b = Tree.from_dict(_tree(env=10.0, policy=0.002, update=5.4))
    diffs = compare(a, b)
    # policy doubled but by 1 ms; update grew 8 % by 0.4 s
    assert {d.path for d in regressions(diffs, threshold=5.0, min_seconds=0.01)} == {("update",)}
    assert regressions(diffs, threshold=10.0, min_seconds=0.01) == []
    flagged = {d.path for d in regressions(diffs, threshold=10.0, min_seconds=0.0)}
    assert ("env_step", "policy") in flagged


def test_self_time_growth_alone_is_a_regression() -> None:
    # Same total, but 2 s moved out of `policy` into env_step's own code.
    a = Tree.from_dict(_tree(env=10.0, policy=4.0, update=5.0))
    b = Tree.from_dict(_tree(env=10.0, policy=2.0, update=5.0))
    flagged = {d.path for d in regressions(compare(a, b), threshold=10.0, min_seconds=0.01)}
    assert flagged == {("env_step",)}


def test_render_marks_regressions_and_respects_limit() -> None:
    a = Tree.from_dict(_tree(env=10.0, policy=4.0, update=5.0))
    b = Tree.from_dict(_tree(env=10.0, policy=6.0, update=2.0))
    text = render(compare(a, b), threshold=10.0, min_seconds=0.01, limit=2)
    lines = text.splitlines()
    assert lines[1].startswith("  update") and "-3.000 s" in lines[1] and "-60.0%" in lines[1]
    assert lines[2].startswith("  root")
    # policy (+50 %) is past the limit but shown: it is why the gate fails.
    assert lines[3].startswith("! env_step / policy")
    assert lines[4] == "  ... and 1 more node"
    assert lines[-1].startswith("! 1 node(s) grew by more than 10% and by more than 10.00 ms")
    marked = render(compare(a, b), threshold=10.0)
    assert any(line.startswith("! env_step / policy") for line in marked.splitlines())


def test_identical_mlagents_trees_have_no_change() -> None:
    stack = ml.TimerStack()
    for _ in range(5):
        with ml.hierarchical_timer("env_step", stack):
            with ml.hierarchical_timer("communicator.exchange", stack):
                sum(range(1000))
    data = ml.get_timer_tree(stack)
    diffs = compare(Tree.from_dict(data), Tree.from_dict(data))
    assert len(diffs) == 3
    assert all(d.delta_total == 0 and d.delta_self == 0 for d in diffs)
    assert regressions(diffs, threshold=0.0) == []


def test_cli_exits_1_when_a_node_grew_beyond_threshold(tmp_path: Path) -> None:
    result = _diff_cli(tmp_path, _tree(10.0, 4.0, 5.0), _tree(10.0, 4.0, 7.0), "--threshold", "20")
    assert result.returncode == 1, result.stderr
    assert "! update" in result.stdout
    assert "grew by more than 20%" in result.stdout


def test_cli_exits_0_when_growth_is_under_threshold(tmp_path: Path) -> None:
    result = _diff_cli(tmp_path, _tree(10.0, 4.0, 5.0), _tree(10.0, 4.0, 5.5), "--threshold", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no node grew by more than 20%" in result.stdout


def test_cli_ignores_growth_under_min_seconds(tmp_path: Path) -> None:
    a, b = _tree(10.0, 0.001, 5.0), _tree(10.0, 0.003, 5.0)  # policy x3, by 2 ms
    assert _diff_cli(tmp_path, a, b, "--min-seconds", "0.01").returncode == 0
    assert _diff_cli(tmp_path, a, b, "--min-seconds", "0.001").returncode == 1


def test_cli_faster_run_passes(tmp_path: Path) -> None:
    result = _diff_cli(tmp_path, _tree(10.0, 4.0, 5.0), _tree(8.0, 3.0, 4.0))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("b", "args", "message", "code"),
    [
        ("{not json", (), "b.json", 4),
        ({"name": "root", "total": "slow", "count": 1}, (), "'total' must be a number", 4),
        ([1, 2, 3], (), "b.json", 4),
        ("", (), "empty file", 4),
        (None, ("--threshold", "-5"), "--threshold must be a non-negative number", 2),
    ],
)
def test_cli_bad_input_is_a_one_line_error_never_exit_1(
    tmp_path: Path, b: Any, args: tuple[str, ...], message: str, code: int
) -> None:
    good = _tree(1.0, 0.5, 1.0)
    result = _diff_cli(tmp_path, good, good if b is None else b, *args)
    assert result.returncode == code
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("otel-rl diff: ")
    assert message in result.stderr


def test_cli_missing_file_is_exit_4(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_tree(1.0, 0.5, 1.0)))
    result = subprocess.run(
        [sys.executable, "-m", "otel_rl", "diff", str(tmp_path / "a.json"), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 4
    assert result.stderr.strip() == f"otel-rl diff: {tmp_path / 'nope'}: no such file"
