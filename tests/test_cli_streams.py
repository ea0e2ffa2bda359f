"""A command's own standard streams can be hostile too: closed, a full disk, read-only.

Output that cannot be written is the "unavailable" failure (exit 5) with one line, like an
output file that cannot be written; a closed stdin for ``tree -`` is bad input (exit 4). Never
an internal error (70) or a second complaint from the interpreter at exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_fuzz_cli import base_timers

REPO = Path(__file__).resolve().parent.parent


def _run(shell_redirect: str, args: list[str], cwd: Path) -> tuple[int, str]:
    """`otel-rl args` with its streams redirected by `shell_redirect` (sh syntax)."""
    command = f'"$0" -m otel_rl "$@" {shell_redirect}; echo "rc=$?" >&2'
    done = subprocess.run(
        ["sh", "-c", command, sys.executable, *args],
        capture_output=True, cwd=cwd, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    err = done.stderr.decode("utf-8", "replace")
    body, _, rc = err.rpartition("rc=")
    return int(rc), body


@pytest.mark.parametrize(
    ("redirect", "reason"),
    [(">/dev/full", "No space left on device"), (">&-", "it is closed"),
     ("1</dev/null", "Bad file descriptor")],
)
@pytest.mark.parametrize("command", ["report", "tree", "diff"])
def test_a_stdout_that_cannot_take_the_output_is_one_line_and_exit_5(
    tmp_path: Path, redirect: str, reason: str, command: str
) -> None:
    timers = tmp_path / "timers.json"
    timers.write_text(json.dumps(base_timers()))
    spans = tmp_path / "spans.jsonl"
    subprocess.run(
        [sys.executable, "-m", "otel_rl", "import", str(timers), "--output", str(spans)],
        check=True, capture_output=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    args = {"report": [str(timers)], "tree": [str(spans)], "diff": [str(timers), str(timers)]}
    rc, err = _run(redirect, [command, *args[command]], tmp_path)
    assert rc == 5, err
    assert err.splitlines() == [f"otel-rl {command}: cannot write to standard output ({reason})"]


def test_a_closed_stdin_is_one_line_and_exit_4(tmp_path: Path) -> None:
    rc, err = _run("<&-", ["tree", "-"], tmp_path)
    assert rc == 4, err
    assert err.splitlines() == ["otel-rl tree: <stdin>: standard input is closed"]

