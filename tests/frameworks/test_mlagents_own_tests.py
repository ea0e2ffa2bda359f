"""ML-Agents' own `test_timers.py` (vendored in tests/vendor/) passes against the real
`mlagents_envs.timers` and against `otel_rl.timers`, in the ML-Agents venv (issue 16)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.frameworks.conftest import Venv

VENDORED = Path(__file__).resolve().parents[1] / "vendor" / "test_mlagents_timers.py"


def test_mlagents_own_test_timers_passes_against_both(
        venvs: Callable[[str], Venv], tmp_path: Path) -> None:
    venv = venvs("mlagents")
    text = VENDORED.read_text()
    original = (text.replace("from otel_rl import timers  # otel_rl: was "
                             "`from mlagents_envs import timers`", "from mlagents_envs import timers")
                .replace('"otel_rl.timers._get_thread_timer"',
                         '"mlagents_envs.timers._get_thread_timer"'))
    body = original.split("# ruff: noqa")[1]
    assert original != text and "otel_rl." not in body and "import timers  # otel_rl" not in body
    (tmp_path / "test_real.py").write_text(original)
    (tmp_path / "test_dropin.py").write_text(text)
    for name in ("test_real", "test_dropin"):
        result = venv.run(venv.python, "-c", f"import {name} as t; t.test_timers(); print('ok')",
                          cwd=tmp_path)
        assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
