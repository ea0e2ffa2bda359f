"""The common ending of a benchmark script: print the tables, save the results, exit code;
and the module a benchmark compares against, as it was at an earlier revision."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from types import ModuleType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_at_revision(rev: str, into: str, *paths: str) -> bool:
    """Extract the ``otel_rl`` package (and `paths` of the repository) as of git revision
    `rev` into the folder `into` (to run a whole program against it); whether git could give
    it."""
    archive = os.path.join(into, "otel_rl.tar")
    try:
        subprocess.run(["git", "archive", "-o", archive, rev, "otel_rl", *paths], cwd=ROOT,
                       capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    os.remove(archive)
    return True


def built_package_at_revision(rev: str, into: str, python: str) -> str | None:
    """`package_at_revision` with its compiled modules built in place for `python` by that
    revision's own ``scripts/build_accel.py``: None if git cannot give the package, else what
    that otel_rl runs ("compiled", or "pure Python" and why)."""
    if not package_at_revision(rev, into, "scripts/build_accel.py"):
        if not package_at_revision(rev, into):
            return None
        return "pure Python (no scripts/build_accel.py at that revision)"
    done = subprocess.run([python, os.path.join(into, "scripts", "build_accel.py")],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        return f"pure Python (its build failed: {(done.stdout + done.stderr).strip()[-200:]})"
    return "compiled"


def module_at_revision(rev: str, path: str, name: str) -> ModuleType | None:
    """The module at `path` (relative to the repository) as of git revision `rev`, loaded under
    `name`; None if git cannot give it or it does not import on its own."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True,
                                text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source.stdout)
    try:
        spec = importlib.util.spec_from_file_location(name, f.name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:
        return None
    finally:
        os.unlink(f.name)
    return module


def failures(results: dict[str, Any]) -> list[str]:
    """Every failed check of any variant, once each."""
    return sorted({c for row in results["summary"].values() for c in row["checks"]})


def failed_checks_lines(results: dict[str, Any]) -> list[str]:
    """Lines that mark a table whose checks failed as not a valid result (none if all passed)."""
    failed = failures(results)
    if not failed:
        return []
    return ["**CHECKS FAILED — these numbers are not a valid result:**", "",
            *(f"- {c}" for c in failed)]


def finish(results: dict[str, Any], json_path: str | None,
           render: Callable[[dict[str, Any]], str]) -> int:
    """Print `render(results)`, write them to `json_path` if given; 1 if any check failed."""
    print()
    print(render(results))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 1 if failures(results) else 0
