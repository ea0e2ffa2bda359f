"""Process faults: a worker SIGKILLed, the parent SIGKILLed or SIGTERMed (its workers become
orphans and export on their own), two runs in one folder (issue 16).

Workload: `workload.py` (a main process, 2 spawned workers x 4 threads, known block count).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from otel_rl._internal import tallyfile
from tests.faults.collectors import collector, wait_until
from tests.faults.helpers import (
    ROOT,
    blocks,
    cli,
    env,
    exit_lines,
    file_spans,
    kind,
    ledger,
    run_workload,
    shutdown_time,
    start_workload,
)
from tests.faults.workload import expected_blocks

BLOCKS = 150
EXPECTED = expected_blocks(BLOCKS)


def all_lines_whole(path: Path) -> None:
    """Every line of a spans file is a whole JSON document ending in a newline."""
    text = path.read_text()
    assert text.endswith("\n")
    for line in text.splitlines():
        json.loads(line)


def test_sigkill_of_a_worker_is_counted_exactly_and_its_open_block_cut_short(
        tmp_path: Path) -> None:
    after = 25  # steps the worker records after its last report, then it is killed
    with collector("ok") as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks", str(BLOCKS),
                               "--kill-worker", "0", "--after-kill", str(after))
        accepted = c.accepted
    assert proc.returncode == 0, proc.stderr
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    # Delivered: every block of the workload; the killed worker's open `worker` block cut
    # short by the parent (it knew it from the worker's last report), saying so.
    assert blocks(spans) == EXPECTED
    (cut,) = [s for s in spans if any(a["key"] == "otel_rl.died" for a in s["attributes"])]
    assert cut["name"] == "worker"
    attrs = {a["key"]: a["value"] for a in cut["attributes"]}
    assert attrs["otel_rl.cut_short"] == {"boolValue": True}
    assert "killed by signal 9" in attrs["otel_rl.died"]["stringValue"]
    book = ledger(tmp_path)
    assert book is not None
    # Exactly what it recorded after its last report (2 blocks per step), for each sink.
    assert book["upstream"] == {"killed worker": 2 * after}
    for name, delivered in (("file", len(spans)), ("otlp", accepted)):
        sink = book["sinks"][name]
        assert sink["lost"] == {"killed worker": 2 * after}
        assert sink["delivered"] == delivered == sink["recorded"] - 2 * after
    (note,) = book["notes"]
    assert f"died before it finished (killed by signal 9): {2 * after} of its" in note
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("otel_rl:")]
    assert "killed by signal 9" in line and f"killed worker {2 * after}" in line
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["complete"] is False and "killed by signal 9" in tree["notes"][0]
    # Both readers say partial: timers.json and the tree rebuilt from the spans file.
    assert cli("report", str(tmp_path / "timers.json")).returncode == 3
    assert cli("tree", str(tmp_path / "spans.otlp.jsonl"), "-o",
               str(tmp_path / "b.json")).returncode == 3
    # The parent removed the worker's tally file once it had read it.
    assert not list(Path(tallyfile._folder()).glob(f"otel-rl-*-{_killed_pid(note)}.tally"))
    print(f"LEDGER sigkill worker: expected {EXPECTED + 2 * after} blocks / delivered "
          f"{blocks(spans)} (1 cut short) file, {accepted} spans otlp / reported lost "
          f"{2 * after} killed worker (exact)")


def test_a_worker_killed_before_its_first_report_is_counted_too(tmp_path: Path) -> None:
    after = 25
    # No flush during the run (30 s): the parent has only the worker's first word.
    proc, _ = run_workload(tmp_path, "--blocks", str(BLOCKS), "--kill-worker", "0",
                           "--after-kill", str(after), "--flush", "30", "--kill-at-once")
    assert proc.returncode == 0, proc.stderr
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    book = ledger(tmp_path)
    assert book is not None
    killed = book["upstream"]["killed worker"]
    # All it recorded: its `worker` block (open), 4 threads x BLOCKS steps x 2, the last steps.
    assert killed == 1 + 4 * BLOCKS * 2 + 2 * after
    assert blocks(spans) + killed == EXPECTED + 2 * after
    file = book["sinks"]["file"]
    assert file["delivered"] == len(spans) == file["recorded"] - killed
    assert "killed by signal 9" in book["notes"][0]
    assert cli("report", str(tmp_path / "timers.json")).returncode == 3
    print(f"LEDGER sigkill worker before its first report: expected {EXPECTED + 2 * after} "
          f"blocks / delivered {blocks(spans)} / reported lost {killed} killed worker (exact)")


def test_a_workers_own_worker_killed_is_counted_in_the_run(tmp_path: Path) -> None:
    from tests.faults import nested_workload as nested

    proc = subprocess.run([sys.executable, "-m", "tests.faults.nested_workload", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env())
    assert proc.returncode == 0, proc.stderr
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    book = ledger(tmp_path)
    assert book is not None
    # Counted by the child (its worker), reported up in its snapshot.
    assert book["upstream"] == {"killed worker": 2 * nested.AFTER}
    assert blocks(spans) + 2 * nested.AFTER == nested.EXPECTED
    file = book["sinks"]["file"]
    assert file["delivered"] == len(spans) == file["recorded"] - 2 * nested.AFTER
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["complete"] is False and "killed by signal 9" in tree["notes"][0]
    print(f"LEDGER sigkill of a worker's worker: expected {nested.EXPECTED} blocks / delivered "
          f"{blocks(spans)} / reported lost {2 * nested.AFTER} killed worker (exact)")


def _killed_pid(note: str) -> int:
    return int(note.split("(pid ")[1].split(")")[0])


def _orphan_files(out: Path) -> list[Path]:
    return sorted(out.glob("spans.*.otlp.jsonl"))


def test_sigkill_of_the_parent_leaves_readable_files_and_orphans_export_their_own(
        tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start_workload(tmp_path, "--blocks", str(BLOCKS), "--hold", "60", "--ready",
                          str(ready), "--timers-interval", "0.5")
    try:
        assert wait_until(ready.exists, 60)
        time.sleep(2.5)  # the workers' blocks have reached the parent's file
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    pids = [int(p) for p in ready.read_text().split()]
    time.sleep(2.0)  # the orphans notice at their next flush (every 0.2 s)
    for pid in pids:  # stop them while their `worker` blocks are open
        os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: len(_orphan_files(tmp_path)) == 2
                      and all((tmp_path / f"timers.{pid}.json").exists() for pid in pids), 60)
    main = tmp_path / "spans.otlp.jsonl"
    all_lines_whole(main)
    ids = set()
    cut_short = 0
    for path in [main, *_orphan_files(tmp_path)]:
        all_lines_whole(path)
        for span in file_spans(path):
            if kind(span) is None:
                ids.add(span["spanId"])
                cut_short += any(a["key"] == "otel_rl.cut_short" for a in span["attributes"])
    # Every block but the parent's own `main` (open when it died); the orphans exported
    # their open `worker` blocks cut short, into their own files.
    assert len(ids) == EXPECTED - 1
    assert cut_short == 2
    for path in [main, *_orphan_files(tmp_path)]:
        assert cli("tree", str(path), "-o", str(tmp_path / "t.json")).returncode == 3
    # The parent's own outputs say it never finished: its last periodic timers.json and the
    # tree rebuilt from its spans file (its last aggregate is not a final one), one line each.
    for args in (("report", str(tmp_path / "timers.json")),
                 ("tree", str(main), "-o", str(tmp_path / "t.json"))):
        result = cli(*args)
        assert result.returncode == 3, result.stderr
        assert "the main process never finished" in result.stdout + result.stderr, args
    print(f"LEDGER sigkill parent: expected {EXPECTED} blocks / in files {len(ids)} (2 cut "
          f"short by the orphans) / lost 1 (the parent's open block, died with it)")


def test_sigterm_of_the_parent(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start_workload(tmp_path, "--blocks", str(BLOCKS), "--hold", "4", "--ready",
                          str(ready))
    try:
        assert wait_until(ready.exists, 60)
        time.sleep(2.5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM
    pids = [int(p) for p in ready.read_text().split()]
    assert wait_until(lambda: all((tmp_path / f"timers.{pid}.json").exists() for pid in pids), 60)
    # The parent flushed: its timers.json, no spurious loss (blocks ending after the run
    # was over are not "buffer full"), and nothing lost for its file.
    assert ledger(tmp_path) is None, stderr
    # (The orphans share its stderr: they lost nothing either, having written their own.)
    assert exit_lines(stderr) == []
    main = tmp_path / "spans.otlp.jsonl"
    ids = set()
    for path in [main, *_orphan_files(tmp_path)]:
        all_lines_whole(path)
        ids.update(s["spanId"] for s in file_spans(path) if kind(s) is None)
    # The parent's `main` block was cut short (exported, count 0); the workers' `worker`
    # blocks ended later, in their own files.
    assert len(ids) == EXPECTED
    print(f"LEDGER sigterm parent: expected {EXPECTED} blocks / in files {len(ids)} / lost 0")


def test_two_runs_in_one_folder_never_overwrite(tmp_path: Path) -> None:
    first, _ = run_workload(tmp_path, "--blocks", "5", "--workers", "1")
    assert first.returncode == 0, first.stderr
    before = (tmp_path / "timers.json").read_text()
    second, _ = run_workload(tmp_path, "--blocks", "5", "--workers", "1")
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "timers.json").read_text() == before
    (line,) = [x for x in second.stderr.splitlines() if "already holds run" in x]
    run_id = json.loads(before)["metadata"]["otel_rl_run_id"]
    assert run_id in line
    moved = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(moved) == 1 and (moved[0] / "timers.json").exists()
    assert json.loads((moved[0] / "timers.json").read_text())["metadata"][
        "otel_rl_run_id"] == moved[0].name
    print(shutdown_time(second.stderr))


def test_a_worker_that_dies_between_its_report_and_its_records_is_counted(
        tmp_path: Path) -> None:
    """Over the real relay: a worker reports 100 records, 60 arrive, its connection closes
    without a final report. The parent counts 40 lost ("killed worker") for every sink."""
    import otel_rl
    from otel_rl._internal import runtime
    from otel_rl._internal.otlp.records import Batch
    from otel_rl._internal.relay import RelayClient
    from otel_rl._internal.sinks.base import Stats
    from otel_rl.timers import hierarchical_timer

    otel_rl.configure(output_dir=str(tmp_path), spans="all", propagate=True,
                      flush_interval=0.05)
    with hierarchical_timer("main"):
        rt = runtime.active()
        assert rt is not None
        address = rt.ensure_relay()
        assert address is not None
        client = RelayClient(address, Stats())
        pid = 999_999_001
        client.send_snapshot({"pid": pid, "role": "fake", "index": 0, "contributions": [],
                              "gauges": {}, "recorded": 100, "final": False})
        records = [(i + 1, rt.run_span_id, "step", 10 + i, 20 + i, 1, rt.trace.trace_id, None)
                   for i in range(60)]
        client.export([Batch({"process.pid": pid, "service.name": "fake"}, rt.offset_ns,
                             records, {1: "main"})], 0.0)  # type: ignore[arg-type]
        client.shutdown(0.0)  # the connection closes, no final report: it died
        assert wait_until(lambda: pid in rt.ledger_state.died, 30)
    otel_rl.shutdown()
    book = ledger(tmp_path)
    assert book is not None
    assert book["upstream"] == {"killed worker": 40}
    file = book["sinks"]["file"]
    assert file["lost"] == {"killed worker": 40}
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert file["delivered"] == len(spans) == file["recorded"] - 40
    assert sum(1 for s in spans if s["name"] == "step") == 60
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["complete"] is False and "fake 0" in tree["notes"][0]


def test_a_rerun_with_the_same_run_id_does_not_overwrite_either(tmp_path: Path) -> None:
    environ = env()
    environ["OTEL_RL_RUN_ID"] = "fixed-id"
    script = ("import otel_rl\nfrom otel_rl.timers import hierarchical_timer as h\n"
              f"otel_rl.configure(output_dir={str(tmp_path)!r})\nwith h('x'):\n    pass\n")
    runs = []
    for _ in range(2):
        runs.append(subprocess.run([sys.executable, "-c", script], capture_output=True,
                                   text=True, timeout=120, cwd=ROOT, env=environ))
        assert runs[-1].returncode == 0, runs[-1].stderr
        if len(runs) == 1:
            first = (tmp_path / "timers.json").read_text()
    assert "already holds run fixed-id" in runs[1].stderr
    (moved,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert moved.name == f"fixed-id-{moved.name.rsplit('-', 1)[1]}"
    assert (moved / "timers.json").exists()
    assert (tmp_path / "timers.json").read_text() == first  # the first run's, untouched
