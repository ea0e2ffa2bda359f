"""The main process SIGKILLed under ``otel-rl run`` (issue 16): the launcher outlives it and
counts what it held (its own unflushed blocks, its open blocks, the workers' records it had
received, its sinks' queues) from its tally and ledger files (`mainledger`); its workers
become orphans and export the rest themselves. For the collector and for the spans files:
expected blocks = delivered + reported lost, exactly.

Workload: `workload.py` under ``otel-rl run`` (zero-code: settings from the environment), a
main process with 4 threads of its own and 2 spawned workers x 4 threads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import mainledger, tallyfile
from tests.faults.collectors import collector, wait_until
from tests.faults.helpers import ROOT, blocks, cli, env, file_spans
from tests.faults.workload import expected_blocks

BLOCKS = 100
MAIN_STEPS = 150
THREADS = 4


#: Workers relay batches (every 0.02 s) when the main process dies.
BUSY = ("busy", "auto")


def expected(mode: str) -> int:
    return expected_blocks(2 * BLOCKS if mode in BUSY else BLOCKS) + THREADS * MAIN_STEPS * 2


def _launch(out: Path, endpoint: str, ready: Path, done: Path,
            log: Any, mode: str) -> subprocess.Popen[str]:
    if mode == "code":  # configure() in code, no `otel-rl run`: its watcher counts
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.workload", str(out), "--count-if-killed",
             "--endpoint", endpoint, "--blocks", str(BLOCKS), "--main-steps", str(MAIN_STEPS),
             "--ready", str(ready), "--hold", "60", "--workers-done", str(done)],
            stdout=log, stderr=log, text=True, cwd=ROOT, env=env())
    environ = env()
    environ.update(OTEL_RL_SPANS="all", OTEL_RL_FLUSH_INTERVAL="0.2", OTEL_RL_ENDPOINT=endpoint,
                   OTEL_RL_PROTOCOL="http/protobuf", OTEL_RL_SHUTDOWN_TIMEOUT="3")
    program = [sys.executable, "-m", "tests.faults.workload", str(out), "--zero-code",
               "--blocks", str(BLOCKS), "--main-steps", str(MAIN_STEPS), "--ready", str(ready)]
    if mode in BUSY:  # the workers relay batches (every 0.02 s) when the main process dies
        environ["OTEL_RL_FLUSH_INTERVAL"] = "0.02"
        if mode == "auto":  # time windows of 0.1 s, one in 3 kept: most are left out
            environ.update(OTEL_RL_SPANS="auto", OTEL_RL_WINDOW="0.1", OTEL_RL_SAMPLE_EVERY="3")
        program += ["--step-sleep", "0.01", "--blocks", str(2 * BLOCKS)]
    else:  # the workers' blocks reached it; they wait
        program += ["--hold", "60", "--workers-done", str(done)]
    shell = mode == "shell"
    if shell:  # the main process a grandchild of the launcher (a shell in between)
        program = ["sh", "-c", " ".join(program) + "; exit $?"]
    return subprocess.Popen(
        [sys.executable, "-m", "otel_rl", "run", "--output", str(out), "--", *program],
        # To a file: the orphans keep the launcher's stderr open after it ended.
        stdout=log, stderr=log, text=True, cwd=ROOT, env=environ)


def _book(out: Path) -> dict[str, Any]:
    tree = json.loads((out / "timers.json").read_text())
    assert tree["complete"] is False
    assert "the main process (pid" in tree["notes"][0]
    return json.loads(tree["metadata"]["otel_rl_ledger"])  # type: ignore[no-any-return]


def _made_up(spans: list[dict[str, Any]]) -> int:
    """Spans the time windows made up (continuations, window spans): records, not blocks."""
    return sum(1 for s in spans if any(
        a["key"] == "otel_rl.continuation"
        or (a["key"] == "otel_rl.kind" and a["value"].get("stringValue") == "window")
        for a in s.get("attributes") or ()))


def _relay_lost(timers: Path) -> int:
    """What an orphan says its dead parent never read (its relay's "killed main"); it lost
    nothing else of its own."""
    text = json.loads(timers.read_text())["metadata"].get("otel_rl_ledger")
    if text is None:
        return 0
    book = json.loads(text)
    for name, sink in book["sinks"].items():
        assert set(sink["lost"]) <= ({"killed main"} if name == "relay" else set()), book
    return int(book["sinks"].get("relay", {}).get("lost", {}).get("killed main", 0))


@pytest.mark.parametrize("mode", ["ok", "slow", "shell", "group", "busy", "auto", "code"])
def test_sigkill_of_the_main_process_is_counted_by_the_launcher(tmp_path: Path,
                                                                mode: str) -> None:
    out = tmp_path / "out"
    ready, done = tmp_path / "ready", tmp_path / "done"
    # "slow": every request answered after 1 s, so the collector's queue holds spans and a
    # request is on the wire when the main process dies.
    with collector(mode, delay=1.0 if mode == "slow" else 0.0) as c, \
            open(tmp_path / "stderr", "w") as log:
        launcher = _launch(out, c.endpoint, ready, done, log, mode)
        try:
            assert wait_until(ready.exists, 90), (tmp_path / "stderr").read_text()
            main_pid = int(Path(f"{ready}.main").read_text())
            if mode == "group":  # its workers die with it (a process group, a cgroup OOM)
                for pid in ready.read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
            os.kill(main_pid, signal.SIGKILL)  # right after its own steps: some unflushed
            launcher.wait(60)
        finally:
            launcher.kill()
        if mode == "code":  # the program itself; its watcher says it, then ends
            assert launcher.returncode == -signal.SIGKILL
            assert wait_until(lambda: "otel-rl: the main process (pid" in
                              (tmp_path / "stderr").read_text(), 60)
        else:
            assert launcher.returncode == 128 + signal.SIGKILL
        workers = [int(p) for p in ready.read_text().split()] if mode != "group" else []
        time.sleep(1.0)  # the orphans notice at their next flush (every 0.2 s)
        for pid in workers if mode not in BUSY else ():  # they end, their `worker` blocks
            os.kill(pid, signal.SIGTERM)  # cut short (busy ones end by themselves)
        assert wait_until(lambda: all((out / f"timers.{pid}.json").exists()
                                      for pid in workers), 60)
        time.sleep(0.5)
        collected, collected_made_up = c.blocks, c.made_up
    stderr = (tmp_path / "stderr").read_text()
    (line,) = [x for x in stderr.splitlines()
               if x.startswith(("otel-rl run: the main process", "otel-rl: the main process"))]
    assert "[exact" in line
    assert ("ended without its shutdown" if mode in ("shell", "code") else "killed by SIGKILL") \
        in line
    book = _book(out)
    file, otlp = book["sinks"]["file"], book["sinks"]["otlp"]
    for sink in (file, otlp):  # the launcher's own books add up, per sink
        assert sink["delivered"] + sum(sink["lost"].values()) + sink.get("unconfirmed", 0) \
            == sink["recorded"]
        assert set(sink["lost"]) <= {"killed main", "killed worker"}
        assert ("killed worker" in sink["lost"]) == (mode == "group")
    main_file = out / "spans.otlp.jsonl"
    in_main_file = file_spans(main_file) if main_file.exists() else []
    # The file: every line written was counted delivered (one written when it died too: the
    # launcher looks at the file; a torn one it cuts off, lost).
    orphans = sum(blocks(file_spans(p)) for p in out.glob("spans.*.otlp.jsonl"))
    file_lost = sum(file["lost"].values())
    assert file["delivered"] == len(in_main_file)
    # What the orphans had written into the relay and the main process never read: counted
    # lost by them ("killed main" of their relay, in their timers.<pid>.json).
    gap = sum(_relay_lost(out / f"timers.{pid}.json") for pid in workers)
    # Under spans=auto, what its windows had left out for good (not lost: the policy's).
    left_out = int(book.get("left_out", 0))
    assert (left_out > 0) == (mode == "auto")
    if left_out:
        assert f"{left_out} left out by spans=auto, not lost" in line
    # The ledger counts records: of those its windows made up (not blocks), what is not in
    # the file was lost with the rest (in a queue, or made in the flush under way).
    made_up = int(book.get("made_up", 0))
    file_made_up_lost = made_up - _made_up(in_main_file)
    assert 0 <= file_made_up_lost <= file_lost
    assert blocks(in_main_file) + orphans + file_lost - file_made_up_lost + gap \
        + file.get("unconfirmed", 0) + left_out == expected(mode)
    # The collector: what it read (from the main process and the orphans) plus what the
    # launcher said was lost; a request on the wire when it died is unconfirmed and read.
    otlp_lost = sum(otlp["lost"].values())
    # A request on the wire when it died is unconfirmed: the collector may have read it.
    unsure = otlp.get("unconfirmed", 0)
    otlp_made_up_lost = made_up - collected_made_up  # (or unconfirmed, and then not read)
    assert collected + otlp_lost - otlp_made_up_lost + gap + left_out <= expected(mode) \
        <= collected + otlp_lost - otlp_made_up_lost + gap + left_out + unsure
    # The readers say partial, with the count.
    result = cli("report", str(out / "timers.json"))
    assert result.returncode == 3 and "the main process (pid" in result.stdout + result.stderr
    # Nothing left behind in the shared-memory folder for this run.
    run_id = json.loads((out / "timers.json").read_text())["metadata"].get("otel_rl_run_id")
    if run_id:
        assert not list(Path(tallyfile._folder()).glob(f"{tallyfile._prefix(run_id)}*"))
    print(f"LEDGER sigkill main ({mode} collector): expected {expected(mode)} blocks / delivered "
          f"file {blocks(in_main_file)} + orphans {orphans}, otlp {collected} / reported lost "
          f"file {file_lost} unconfirmed {file.get('unconfirmed', 0)}, otlp {otlp_lost} "
          f"unconfirmed {otlp.get('unconfirmed', 0)}; lost in the relay, said by the orphans: "
          f"{gap}; left out by spans=auto {left_out}, made up by it {made_up} (not in the "
          f"file: {file_made_up_lost}) (exact; the unconfirmed ones may or may not have "
          "arrived)")
    assert mainledger.KILLED_MAIN == "killed main"


def test_an_sdk_exporters_call_under_way_at_the_kill_is_unconfirmed(tmp_path: Path) -> None:
    """A standard SpanExporter's export() that had not returned when the main process was
    SIGKILLed may have sent its spans: unconfirmed, not lost; the rest it held is lost."""
    out, ready = tmp_path / "out", tmp_path / "ready"
    with open(tmp_path / "stderr", "w") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "otel_rl", "run", "--output", str(out), "--",
             sys.executable, "-m", "tests.faults.sdk_workload", str(out), str(ready)],
            stdout=log, stderr=log, text=True, cwd=ROOT, env=env())
        try:
            assert wait_until(ready.exists, 90), (tmp_path / "stderr").read_text()
            os.kill(int(ready.read_text()), signal.SIGKILL)
            launcher.wait(60)
        finally:
            launcher.kill()
    calls = [int(n) for n in Path(f"{ready}.calls").read_text().split()]
    assert len(calls) == 2
    book = _book(out)
    sdk, file = book["sinks"]["exporter:HangsOnSecond"], book["sinks"]["file"]
    assert set(sdk["lost"]) <= {"killed main"} and set(file["lost"]) <= {"killed main"}
    # Its first call answered; its second never did: exactly that one's spans unconfirmed.
    assert sdk["delivered"] == calls[0]
    assert sdk.get("unconfirmed", 0) == calls[1]
    assert sdk["delivered"] + sum(sdk["lost"].values()) + calls[1] == sdk["recorded"]
    # The same records, counted through the file (which also holds the few spans of the
    # zero-code runtime that configure() replaced, settled by that one).
    assert file["delivered"] <= len(file_spans(out / "spans.otlp.jsonl"))
    assert file["delivered"] + sum(file["lost"].values()) + file.get("unconfirmed", 0) \
        == file["recorded"] == sdk["recorded"]
    (line,) = [x for x in (tmp_path / "stderr").read_text().splitlines()
               if x.startswith("otel-rl run: the main process")]
    assert "[exact]" in line and f"{calls[1]} unconfirmed (being sent when it died)" in line
    print(f"LEDGER sigkill main, SDK exporter: recorded {sdk['recorded']} / delivered "
          f"{sdk['delivered']} / lost {sum(sdk['lost'].values())} / unconfirmed {calls[1]} "
          f"(its call under way); file delivered {file['delivered']} lost "
          f"{sum(file['lost'].values())}")


def _watchers_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"otel_rl._internal.watcher" in argv and str(pid).encode() in argv:
                found.append(int(entry))
    return found


def test_count_if_killed_after_a_normal_end_says_nothing_and_its_watcher_ends(
        tmp_path: Path) -> None:
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults.workload", str(out), "--count-if-killed",
         "--blocks", "20", "--ready", str(ready)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env())
    assert proc.returncode == 0, proc.stderr
    main_pid = int(Path(f"{ready}.main").read_text())
    assert wait_until(lambda: not _watchers_of(main_pid), 30)
    assert "the main process (pid" not in proc.stderr
    assert blocks(file_spans(out / "spans.otlp.jsonl")) == expected_blocks(20)
    tree = json.loads((out / "timers.json").read_text())
    assert tree.get("complete", True) is not False and "otel_rl_ledger" not in tree["metadata"]
    run_id = tree["metadata"]["otel_rl_run_id"]
    assert not list(Path(tallyfile._folder()).glob(f"{tallyfile._prefix(run_id)}*"))


def test_more_than_128_workers_killed_with_a_main_configured_in_code_are_counted(
        tmp_path: Path) -> None:
    """140 forked workers and their main process (count_if_killed) SIGKILLed at once, as a
    process group: the watcher counts every worker's blocks that had not reached the main
    process, past the first 128 too."""
    from tests.faults.many_workers import AFTER, BEFORE

    out, ready, workers = tmp_path / "out", tmp_path / "ready", 140
    with open(tmp_path / "stderr", "w") as log:
        program = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.many_workers", str(out), str(ready),
             str(workers)], stdout=log, stderr=log, text=True, cwd=ROOT, env=env(),
            start_new_session=True)
        try:
            assert wait_until(ready.exists, 120), (tmp_path / "stderr").read_text()
            os.killpg(program.pid, signal.SIGKILL)
            program.wait(60)
            assert wait_until(lambda: "otel-rl: the main process (pid" in
                              (tmp_path / "stderr").read_text(), 60)
        finally:
            try:
                os.killpg(program.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    (line,) = [x for x in (tmp_path / "stderr").read_text().splitlines()
               if x.startswith("otel-rl: the main process")]
    book = _book(out)
    file = book["sinks"]["file"]
    spans = file_spans(out / "spans.otlp.jsonl")
    assert file["delivered"] == len(spans)
    assert file["lost"]["killed worker"] == workers * AFTER
    assert f"{workers} worker(s) died with it: {workers * AFTER} of their block(s)" in line
    assert blocks(spans) + sum(file["lost"].values()) == workers * (BEFORE + AFTER)
    run_id = json.loads((out / "timers.json").read_text())["metadata"].get("otel_rl_run_id")
    if run_id:
        assert not list(Path(tallyfile._folder()).glob(f"{tallyfile._prefix(run_id)}*"))
    print(f"LEDGER sigkill of a main (count_if_killed) and its {workers} workers: expected "
          f"{workers * (BEFORE + AFTER)} blocks / delivered {blocks(spans)} / reported lost "
          f"{sum(file['lost'].values())} ({file['lost']})")
