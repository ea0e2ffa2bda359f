"""Reading what a faulted run left behind: the ledger in timers.json and the spans file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from otel_rl._internal.readers.boundary import parse_json

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (``"3m"``) mounted at `folder`/disk, unmounted afterwards: a disk
    that fills for real (needs root, as CI has; the test is skipped otherwise, saying so)."""
    import pytest  # (here: the workloads this module serves run where pytest may be absent)

    mount = folder / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def env() -> dict[str, str]:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
    for key in list(environ):
        if key.startswith(("OTEL_RL_", "OTEL_EXPORTER", "TRACEPARENT")):
            del environ[key]
    # These collectors count every POST as spans: the run's OTLP metrics (on by default with
    # an endpoint) are not what these tests are about (tests/test_metrics.py covers them).
    environ["OTEL_RL_METRICS"] = "false"
    return environ


def run_workload(out: Path, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tests.faults.workload", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env())
    return proc, time.monotonic() - started


def start_workload(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.faults.workload", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=env())


def ledger(out: Path) -> dict[str, Any] | None:
    """The ledger timers.json records (None: it says nothing was lost)."""
    # Through the readers' deep-safe JSON (a timers.json may be 10,000 blocks deep).
    tree = parse_json((out / "timers.json").read_text(), "timers.json")
    text = tree["metadata"].get("otel_rl_ledger")
    assert (text is None) == ("otel_rl_dropped_spans" not in tree["metadata"])
    return None if text is None else json.loads(text)


def file_spans(path: Path) -> list[dict[str, Any]]:
    """Every span in a spans file (each line one OTLP-JSON request)."""
    spans = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans.extend(ss["spans"])
    return spans


def kind(span: dict[str, Any]) -> str | None:
    for attr in span.get("attributes") or ():
        if attr["key"] == "otel_rl.kind":
            return str(attr["value"].get("stringValue"))
    return None


def blocks(spans: list[dict[str, Any]]) -> int:
    """Spans of timed blocks (not the run, process, aggregate, window spans otel_rl adds, nor
    the continuations a kept window makes of blocks that started before it)."""
    return sum(1 for s in spans if kind(s) is None and not any(
        a["key"] == "otel_rl.continuation" for a in s.get("attributes") or ()))


def lost(sink: dict[str, Any]) -> int:
    return sum(sink["lost"].values())


def exit_lines(stderr: str) -> list[str]:
    """The ledger's exit line(s): headed by what was lost or, when nothing was lost but a
    request had no answer by the deadline, by what was sent but not confirmed."""
    return [line for line in stderr.splitlines()
            if "were not exported" in line or "were sent but not confirmed" in line]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_rl", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env())


def shutdown_time(stderr: str) -> str:
    """The workload's own measure of its `otel_rl.shutdown()` (printed, not asserted)."""
    for line in stderr.splitlines():
        if line.startswith("workload: shutdown took"):
            return line.removeprefix("workload: ")
    return "shutdown time not printed"


def say_ready(path: str, text: str) -> None:
    """Write `text` to `path` in one step (a test waiting for the file reads it whole)."""
    with open(f"{path}.tmp", "w") as f:
        f.write(text)
    os.replace(f"{path}.tmp", path)
