"""`scripts/python-matrix.sh`, the test runner of `scripts/test.sh`: a missing interpreter is one
line (a failure under CI, a skip locally), and the last line holds the totals of every run in
pytest's summary form (what CI reads)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ONE_TEST = "test_the_carrier_is_a_leaf"  # tests/test_process_state.py: quick, no set-up


def run_matrix(ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["OTEL_RL_PYTHONS"] = "2.1"  # no such interpreter anywhere
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "python-matrix.sh"), sys.executable, "-q",
         "-p", "no:cacheprovider", "-k", ONE_TEST, "tests/test_process_state.py"],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env, check=False)


@pytest.mark.parametrize("ci", [False, True])
def test_a_missing_interpreter_is_one_line_and_the_last_line_has_the_totals(ci: bool) -> None:
    done = run_matrix(ci)
    lines = done.stdout.strip().splitlines()
    missing = [line for line in lines if "Python 2.1" in line and "not found" in line]
    main = ".".join(map(str, sys.version_info[:3]))
    # The test runs twice on the main interpreter: as is, and on the pure-Python hot path.
    assert lines[-1].startswith("===== 0 failed, 2 passed")
    assert lines[-1].endswith(" =====")
    if ci:
        assert done.returncode == 1, done.stdout + done.stderr
        assert missing == ["python-matrix: Python 2.1 not found (pyenv prefix 2.1; python2.1): "
                           "FAILED under CI", "  Python 2.1: interpreter not found"]
        assert re.search(rf", 1 error in [0-9.]+s \(Python 2\.1, {main}, {main}-pure\) =====$",
                         lines[-1])
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert missing == ["python-matrix: Python 2.1 not found (pyenv prefix 2.1; python2.1): "
                           "skipped"]
        assert re.search(rf" in [0-9.]+s \(Python {main}, {main}-pure\) =====$", lines[-1])
    assert f"  Python {main}: 1 passed" in done.stdout
    assert f"  Python {main}-pure: 1 passed" in done.stdout
