"""The package builds without a warning from the build backend and installs from its wheel.

The sdist and the wheel are built with ``python -m build`` (isolated: the backend comes from
``[build-system]``) from a copy of the project, so nothing is written into the checkout; the
wheel goes into a clean venv with its dependencies, where otel_rl imports and the ``otel-rl``
command runs. Needs the package index (the build's and the venv's dependencies), like
``pip install .``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")


def _run(*args: str | Path, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def test_sdist_and_wheel_build_without_warnings_and_the_wheel_installs_and_runs(
    tmp_path: Path,
) -> None:
    pytest.importorskip("build", reason="the test extra installs `build`")
    source = tmp_path / "source"
    source.mkdir()
    for name in PROJECT_FILES:
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "otel_rl", source / "otel_rl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))

    output = _run(sys.executable, "-m", "build", "--outdir", tmp_path / "dist", source,
                  cwd=tmp_path)
    # setuptools' deprecations (the license table until 2027-02-18, and any later one) say
    # "Deprecat..." or "SetuptoolsWarning"; "byte-compiling is disabled" is only the
    # environment's PYTHONDONTWRITEBYTECODE.
    warnings = [line for line in output.splitlines()
                if re.search(r"deprecat|SetuptoolsWarning|UserWarning", line, re.IGNORECASE)]
    assert warnings == []
    sdist, = (tmp_path / "dist").glob("otel_rl-*.tar.gz")
    # With the compiled hot path (a compiler is here): a wheel for this interpreter.
    wheel, = (tmp_path / "dist").glob("otel_rl-*.whl")
    with tarfile.open(sdist) as tar:
        assert any(name.endswith("/LICENSE") for name in tar.getnames())
        for source in ("_hotpath.c", "_metricsacc.c", "_relaycols.c", "_timingacc.c", "_accel.h"):
            assert any(name.endswith(f"/otel_rl/_internal/{source}") for name in tar.getnames())
    with zipfile.ZipFile(wheel) as zf:
        metadata = next(zf.read(n).decode() for n in zf.namelist() if n.endswith("/METADATA"))
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in zf.namelist())
        assert "otel_rl/py.typed" in zf.namelist()
        assert "otel_rl/_internal/_hotpath.pyi" in zf.namelist()
        assert "otel_rl/_internal/_metricsacc.pyi" in zf.namelist()
        assert "otel_rl/_internal/_relaycols.pyi" in zf.namelist()
        assert "otel_rl/_internal/_timingacc.pyi" in zf.namelist()
        assert sorted(n for n in zf.namelist() if n.endswith(".so")) == [
            f"otel_rl/_internal/{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
            for name in ("_hotpath", "_metricsacc", "_relaycols", "_timingacc")]
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel,
         cwd=tmp_path)
    where = _run(python, "-c", "import otel_rl; print(otel_rl.__file__)", cwd=tmp_path)
    assert where.strip().startswith(str(venv))
    # The metrics' compiled column reader loads from the wheel too.
    reader = _run(python, "-c", "from otel_rl._internal import metrics_columns as m; "
                  "print(m.reader().compiled, m.COMPILED.__class__.__name__)", cwd=tmp_path)
    assert reader.split() == ["True", "_Compiled"]
    # And the compiled Timing.
    timing = _run(python, "-c", "import otel_rl.timing as t; print(t.accelerated())", cwd=tmp_path)
    assert timing.strip() == "True"
    usage = _run(venv / "bin" / "otel-rl", "--help", cwd=tmp_path)
    assert usage.startswith("usage: otel-rl") and "demo" in usage
    version = _run(venv / "bin" / "otel-rl", "--version", cwd=tmp_path)
    assert re.fullmatch(r"otel-rl \S+ \(hot path: compiled \(otel_rl._internal._hotpath\); "
                        r"Sample Factory Timing: compiled \(otel_rl._internal._timingacc\)\)",
                        version.strip())
