"""One atomic file writer, used by the runtime and by every command (issue 10)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import otel_rl
from otel_rl._internal import atomic

PACKAGE = Path(otel_rl.__file__).parent


def test_a_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "timers.json"
    target.write_text("old", encoding="utf-8")
    atomic.write_text(target, "new \udcff text")  # a lone surrogate does not fail the write
    assert target.read_text(encoding="utf-8") == "new \\udcff text"
    assert [p.name for p in tmp_path.iterdir()] == ["timers.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask  # as a plain open() would


def test_a_failed_write_keeps_what_was_there_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.mkdir()  # the rename fails after the text was written beside it
    (target / "keep").write_text("old", encoding="utf-8")
    with pytest.raises(OSError):
        atomic.write_text(target, "new")
    assert (target / "keep").read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    with pytest.raises(OSError):
        atomic.write_text(tmp_path / "missing" / "x.json", "text")


def test_no_other_module_renames_files_into_place() -> None:
    writers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if "os.replace(" in p.read_text(encoding="utf-8"))
    assert writers == ["_internal/atomic.py"]
