"""The real frameworks, each in its own virtual environment (built and cached by
``scripts/setup-frameworks.sh``), with otel_rl installed there by a plain ``pip install`` of
this checkout — no pins, no ``--no-deps`` — as a user would install it beside them.

Every test in this folder is marked ``frameworks``. Locally they are skipped, with the reason,
only when a venv cannot be built (no network on a fresh machine, say); under CI (``CI`` set, as
``.ci/run`` is started) that is a failure: CI must train with both frameworks.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup-frameworks.sh"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.frameworks)


@dataclass
class Venv:
    name: str
    python: Path

    @property
    def bin(self) -> Path:
        return self.python.parent

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for commands of this venv: its bin first on PATH, nothing of the
        test process's own Python (PYTHONPATH would make the checkout's otel_rl win over the
        installed one)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "OTEL_", "VIRTUAL_ENV", "PYTEST"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONWARNINGS"] = "ignore"
        env.update(extra)
        return env

    def run(self, *args: str | Path, cwd: Path, timeout: float = 300,
            **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in args], cwd=cwd, env=self.env(**extra),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


_built: dict[str, Venv] = {}
#: Open lock files, one per venv used by this test session (released when it exits): two
#: sessions on one machine must not reinstall otel_rl under each other's running tests.
_locks: list[Any] = []


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)


def framework_venv(target: str, tmp_root: Path) -> Venv:
    """The venv of `target` (sf, mlagents, ray, otel-oldest, otel-newest) with this checkout's
    otel_rl freshly installed by a plain ``pip install``."""
    if target in _built:
        return _built[target]
    try:
        built = subprocess.run(["bash", str(SETUP), target], capture_output=True, text=True,
                               timeout=3600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        _unavailable(f"scripts/setup-frameworks.sh {target} did not finish within an hour")
    if built.returncode != 0:
        tail = (built.stderr or built.stdout).strip().splitlines()[-3:]
        _unavailable(f"cannot build the {target} venv (scripts/setup-frameworks.sh {target}): "
                    + " | ".join(tail))
    python = Path(built.stdout.split()[-1])
    lock = open(python.parent.parent / ".otel-rl-tests.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    _locks.append(lock)
    venv = Venv(target, python)
    quiet = ("-m", "pip", "--disable-pip-version-check", "-q")
    venv.run(python, *quiet, "uninstall", "-y", "otel-rl", cwd=tmp_root)
    # Built from a copy: pip builds in place, and the checkout must stay clean.
    source = tmp_root / f"otel-rl-src-{target}"
    _copy_source(source)
    spec = str(source) + ("[otlp]" if target.startswith("otel-") else "")
    installed = venv.run(python, *quiet, "install", spec, cwd=tmp_root, timeout=900)
    assert installed.returncode == 0, installed.stderr[-2000:]
    _built[target] = venv
    return venv


def _copy_source(dest: Path) -> None:
    """The files git knows (tracked or not ignored) of this checkout, copied to `dest`."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True)
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / rel
        if not src.is_file() or not (rel.startswith("otel_rl/") or "/" not in rel):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())


@pytest.fixture(scope="session")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Venv]:
    root = tmp_path_factory.mktemp("venvs")
    return lambda target: framework_venv(target, root)


# --- reading results --------------------------------------------------------------------------

def walk(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                               dict[str, Any]]]:
    for name, child in (node.get("children") or {}).items():
        yield (*path, name), child
        yield from walk(child, (*path, name))


def shape(tree: dict[str, Any]) -> dict[tuple[str, ...], bool]:
    """Every node path with its is_parallel flag."""
    return {path: bool(node.get("is_parallel")) for path, node in walk(tree)}


def counts(tree: dict[str, Any]) -> dict[tuple[str, ...], tuple[int, bool]]:
    return {path: (node["count"], bool(node.get("is_parallel"))) for path, node in walk(tree)}


def node_at(tree: dict[str, Any], *path: str) -> dict[str, Any]:
    node = tree
    for name in path:
        children = node.get("children") or {}
        assert name in children, f"no {name!r} under {path}: {sorted(children)}"
        node = children[name]
    return node


def assert_tree_from_spans_equals_timers_json(venv: Venv, out: Path, root: Path,
                                              allow_partial: bool = False) -> None:
    """`otel-rl tree` on the run's spans file gives back its timers.json: every node's count,
    is_parallel, total and self (to 1e-9 s), and the workers list."""
    rebuilt = root / "rebuilt.json"
    partial = ["--allow-partial"] if allow_partial else []
    done = venv.run(venv.bin / "otel-rl", "tree", *partial, out / "spans.otlp.jsonl", "-o",
                    rebuilt, cwd=root)
    assert done.returncode == 0, done.stderr
    tree, again = load(out / "timers.json"), load(rebuilt)
    assert counts(again) == counts(tree)
    for path, node in walk(tree):
        other = node_at(again, *path)
        for key in ("total", "self"):
            assert abs(other[key] - node[key]) <= 1e-9, (path, key, other[key], node[key])
    assert sorted((w["role"], w["index"], w["path"]) for w in again["workers"]) == \
        sorted((w["role"], w["index"], w["path"]) for w in tree["workers"])


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def span_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Each span of an OTLP-JSON spans file as {name, span_id, parent_span_id, attributes,
    resource}."""
    def value(v: dict[str, Any]) -> Any:
        for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if key in v:
                return int(v[key]) if key == "intValue" else v[key]
        return None

    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        for rs in json.loads(line).get("resourceSpans", []):
            resource = {a["key"]: value(a["value"]) for a in rs["resource"].get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    attrs = {a["key"]: value(a["value"]) for a in span.get("attributes", [])}
                    yield {"name": span["name"], "span_id": span.get("spanId"),
                           "parent_span_id": span.get("parentSpanId"), "attributes": attrs,
                           "resource": resource}
