"""The killed main process's mirror (`mainledger.Mirror`, issue 16): what it received from
each worker is kept for any number of workers (its table grows past the first 128), in a real
shared file read back the way the launcher and an orphan read it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from otel_rl._internal import mainledger, tallyfile
from otel_rl._internal.ledger import Ledger


def test_the_mirror_keeps_every_workers_received_count_past_its_first_table() -> None:
    run_id = f"mirror-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    mainledger.share(ledger, run_id, None, "all", None, 0)
    assert ledger.mirror is not None
    try:
        workers = {3_000_000 + i: i % 17 + 1 for i in range(300)}  # (no such processes)
        for _ in range(3):
            for pid, n in workers.items():
                ledger.taken(n, source=pid)
        dead = 3_000_000 + 250  # its death was counted by the main process: not again
        ledger.taken(0, outside=5, source=dead, counted=True)
        (path,) = tallyfile.run_files(run_id, ".ledger")
        assert os.path.getsize(path) > 8192 + 16 * 128  # it grew
        parent = os.getpid()
        for pid, n in workers.items():
            expected = None if pid == dead else 3 * n
            assert mainledger.received_from(run_id, parent, pid) == expected, pid
        assert mainledger.received_from(run_id, parent, 4_000_000) == 0  # sent nothing
    finally:
        tallyfile.remove_run(run_id)



def test_what_ray_workers_reported_and_a_killed_driver_never_received_is_counted_lost() -> None:
    """A Ray driver's mirror: the workers' batches it took in count as held (as a relaying
    worker's), and what their latest reports said they recorded beyond that is lost with it,
    "killed worker", for every sink; once Ray is shut down nothing more is."""
    run_id = f"mirror-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    ledger.add_sink("file", "spans.otlp.jsonl")
    mainledger.share(ledger, run_id, None, "all", None, 0)
    try:
        ledger.taken(40)  # drained from Ray workers, not flushed yet
        ledger.held_elsewhere(7)
        (path,) = tallyfile.run_files(run_id, ".ledger")
        read = mainledger._read(path)
        assert read is not None
        summary = mainledger.count(read[0], read[1], 5)  # 5 of its own
        file = summary["sinks"]["file"]
        assert file["recorded"] == 52 and file["delivered"] == 0
        assert file["lost"] == {mainledger.KILLED_MAIN: 45, "killed worker": 7}
        assert summary["notes"] == ["Ray workers had reported 7 block(s) it had not received"]
        ledger.held_elsewhere(None)  # ray.shutdown() settled them
        read = mainledger._read(path)
        assert read is not None
        summary = mainledger.count(read[0], read[1], 5)
        assert summary["sinks"]["file"]["lost"] == {mainledger.KILLED_MAIN: 45}
    finally:
        tallyfile.remove_run(run_id)


def test_the_launcher_waits_for_workers_dying_with_the_main_and_for_orphans_to_take_over(
        tmp_path: Path) -> None:
    """A process group's SIGKILL reaches its members one by one: a worker not yet gone when
    the launcher looks would pass for an orphan (which counts itself) and be counted by
    nobody; an orphan killed before its next flush (where it takes over) likewise. The
    launcher waits until each worker with a tally file has ended or removed the file."""
    import subprocess
    import sys

    def worker(path: Path, code: str) -> tuple[subprocess.Popen[bytes], str]:
        path.write_text("tally")
        return subprocess.Popen([sys.executable, "-c", code]), str(path)

    dying, dying_tally = worker(tmp_path / "a", "import time; time.sleep(0.4)")
    orphan, orphan_tally = worker(  # takes over at its "flush": reads, removes its tally
        tmp_path / "b", f"import os, time; time.sleep(0.6); os.remove({str(tmp_path / 'b')!r});"
                        " time.sleep(30)")
    try:
        mainledger._settle([(dying.pid, dying_tally), (orphan.pid, orphan_tally)])
        assert not mainledger.alive(dying.pid)  # ended (a zombie until reaped: dead)
        assert mainledger.alive(orphan.pid) and not os.path.exists(orphan_tally)
    finally:
        orphan.kill()
        orphan.wait()
        dying.wait()


_KILLED_IN_A_WRITE = """
import os, signal, sys
os.environ.update(OTEL_RL_SURVIVOR="1", OTEL_RL_ZEROCODE_MAIN=f"pid:{os.getpid()}",
                  OTEL_RL_RUN_ID=sys.argv[2])
import otel_rl
from otel_rl._internal.sinks import file as file_sink
from otel_rl.timers import hierarchical_timer

write, torn = file_sink.FileSink._write_line, sys.argv[3] == "torn"

def write_then_die(self, line):
    if b'"name":"last"' not in line:
        return write(self, line)
    if torn:  # half the line on disk
        os.write(self._fd, line[:len(line) // 2])
    else:
        write(self, line)
    os.kill(os.getpid(), signal.SIGKILL)  # before the line is counted

file_sink.FileSink._write_line = write_then_die
otel_rl.configure(output_dir=sys.argv[1], spans="all", flush_interval=60)
for _ in range(50):
    with hierarchical_timer("step"):
        pass
otel_rl.force_flush()
for _ in range(30):
    with hierarchical_timer("last"):
        pass
otel_rl.force_flush()
"""


@pytest.mark.parametrize("line", ["whole", "torn"])
def test_a_line_the_main_process_wrote_before_it_was_killed_is_read_from_the_file(
        tmp_path: Path, line: str) -> None:
    """SIGKILLed between writing a line of its spans file and counting it: the survivor
    looks at the file. A whole line is delivered (it is there to read); a torn one is cut
    off and lost. Either way no "unconfirmed" is left for the file, and what the file holds
    is what the ledger says was delivered."""
    import json
    import signal
    import subprocess
    import sys

    from tests.faults.helpers import ROOT, env, file_spans

    out, run_id = tmp_path / "out", f"line-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_IN_A_WRITE, str(out), run_id, line],
                             cwd=ROOT, env=env(), stderr=subprocess.PIPE, text=True)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, stderr
    try:
        said = mainledger.after_main(child.pid, run_id, child.returncode, str(out))
    finally:
        tallyfile.remove_run(run_id)
    assert said is not None and "[exact" in said, said
    book = json.loads(json.loads((out / "timers.json").read_text())["metadata"][
        mainledger.LEDGER_KEY])
    file = book["sinks"]["file"]
    spans = file_spans(out / "spans.otlp.jsonl")  # (it fails on a torn line)
    assert "unconfirmed" not in file
    assert file["recorded"] == 80 and file["delivered"] == len(spans)
    assert len(spans) == (80 if line == "whole" else 50)
    assert sum(file["lost"].values()) == (0 if line == "whole" else 30)
