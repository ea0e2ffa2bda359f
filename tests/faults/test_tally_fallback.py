"""Where a worker's tally lives (issue 16): /dev/shm; without a writable /dev/shm the temp dir
(still exact); without either, no tally: the parent counts a lower bound and says so.

A real workload (`workload.py`, a worker SIGKILLed 25 steps after its last report) in a mount
namespace of its own (``unshare -m``) where /dev/shm (and, for the last case, every temp dir)
is a read-only tmpfs. Needs root and ``unshare`` (CI runs as root); skipped otherwise, saying so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.collectors import wait_until
from tests.faults.helpers import ROOT, blocks, env, file_spans, ledger
from tests.faults.workload import expected_blocks

BLOCKS = 100
AFTER = 25
RO = "mount -t tmpfs -o ro,size=1m tmpfs"


def _no_folder(out: Path) -> str:
    """Shell steps making /dev/shm, /tmp, /var/tmp and the working directory read-only, with
    the output folder at /mnt/out and this checkout at /mnt/root (either may be under /tmp)."""
    return (f"mount -t tmpfs -o size=1m tmpfs /mnt && mkdir /mnt/out /mnt/root && "
            f"mount --bind {out} /mnt/out && mount --bind {ROOT} /mnt/root && "
            f"{RO} /dev/shm && {RO} /tmp && {RO} /var/tmp && cd /tmp && "
            "export PYTHONPATH=/mnt/root && ")


def _namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"{RO} /dev/shm"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


pytestmark = [
    pytest.mark.skipif(not _namespaces(), reason="needs root and `unshare -m` (mount "
                       "namespaces) to make /dev/shm and the temp dirs read-only"),
    pytest.mark.skipif(sys.executable.startswith(("/tmp/", "/var/tmp/")),
                       reason="this Python lives in a temp dir the tests make read-only"),
]


def _run(script: str, out: Path) -> subprocess.CompletedProcess[str]:
    args = " ".join(["--blocks", str(BLOCKS), "--kill-worker", "0", "--after-kill", str(AFTER)])
    environ = env()
    environ.pop("TMPDIR", None)
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script.format(python=sys.executable, out=out, args=args)],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=environ)


def test_without_a_writable_dev_shm_the_temp_dir_holds_the_tally_exactly(
        tmp_path: Path) -> None:
    proc = _run(f"{RO} /dev/shm && exec {{python}} -m tests.faults.workload {{out}} {{args}}",
                tmp_path)
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    assert book is not None
    assert book["upstream"] == {"killed worker": 2 * AFTER}  # exact, as with /dev/shm
    assert "were lost (counted)" in book["notes"][0]
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert blocks(spans) + 2 * AFTER == expected_blocks(BLOCKS) + 2 * AFTER
    print(f"LEDGER sigkill worker, no /dev/shm (temp dir): expected "
          f"{expected_blocks(BLOCKS) + 2 * AFTER} / delivered {blocks(spans)} / reported "
          f"{2 * AFTER} (exact)")


def test_without_any_writable_folder_the_count_is_a_lower_bound_said_as_such(
        tmp_path: Path) -> None:
    # No tally file can be made anywhere (`_no_folder`).
    script = (_no_folder(tmp_path).replace("{", "{{").replace("}", "}}")
              + "exec {python} -m tests.faults.workload /mnt/out {args}")
    proc = _run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    assert book is not None
    (note,) = book["notes"]
    assert "at least" in note and "a lower bound" in note and "no tally file" in note
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("otel_rl:")]
    assert "a lower bound" in line
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    killed = book["upstream"].get("killed worker", 0)
    # Lower bound: what it recorded after its last report is missing and not counted.
    assert blocks(spans) + killed <= expected_blocks(BLOCKS) + 2 * AFTER
    print(f"LEDGER sigkill worker, no writable folder: expected "
          f"{expected_blocks(BLOCKS) + 2 * AFTER} / delivered {blocks(spans)} / reported "
          f"at least {killed} (a lower bound, said)")


def test_main_killed_without_any_writable_folder_the_launcher_says_it_counted_nothing(
        tmp_path: Path) -> None:
    """`otel-rl run` whose main process is SIGKILLed where it could make no tally or ledger
    file: the launcher still says the main process died, with a lower bound, said as such."""
    out = tmp_path / "out"
    out.mkdir()
    script = (_no_folder(out) + f"exec {sys.executable} -m otel_rl run --output /mnt/out -- "
              f"{sys.executable} -m tests.faults.workload /mnt/out --zero-code --blocks 20 "
              "--hold 60 --ready /mnt/out/ready")
    environ = env()
    environ.pop("TMPDIR", None)
    environ.update(OTEL_RL_SPANS="all", OTEL_RL_FLUSH_INTERVAL="0.2")
    with open(tmp_path / "stderr", "w") as log:
        launcher = subprocess.Popen(["unshare", "-m", "sh", "-c", script], stdout=log,
                                    stderr=log, cwd=ROOT, env=environ)
        try:
            # `ready` (the workers' pids) is written after `ready.main`: wait for both.
            assert wait_until((out / "ready").exists, 90), (tmp_path / "stderr").read_text()
            os.kill(int((out / "ready.main").read_text()), signal.SIGKILL)
            launcher.wait(60)
        finally:
            launcher.kill()
        for pid in (out / "ready").read_text().split():  # the orphans end
            os.kill(int(pid), signal.SIGTERM)
    stderr = (tmp_path / "stderr").read_text()
    (line,) = [x for x in stderr.splitlines() if x.startswith("otel-rl run: the main process")]
    assert "killed by SIGKILL" in line and "a lower bound" in line and "not counted" in line
    print(f"LEDGER sigkill main, no writable folder: {line}")
