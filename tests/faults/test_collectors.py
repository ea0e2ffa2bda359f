"""Faulty collectors: every span of a run with a known block count ends delivered or counted
lost, per sink, and the spans file never waits behind the collector (issue 16).

The workload: a main process and 2 spawned workers x 4 threads (`workload.py`); its block
count is exact, and the ledger (timers.json's ``otel_rl_ledger``) must add up exactly:
recorded = delivered + lost, for the collector and for the file; the collector's delivered
count equals the spans it answered 200 for; the file's equals the spans in the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.collectors import Collector, collector, dead_endpoint
from tests.faults.helpers import (
    blocks,
    exit_lines,
    file_spans,
    ledger,
    lost,
    run_workload,
    shutdown_time,
)
from tests.faults.workload import expected_blocks

BLOCKS = 150
EXPECTED = expected_blocks(BLOCKS)  # 2,403


def check_file(out: Path, book: dict) -> int:
    """The file got everything, and the ledger says so; returns the spans recorded."""
    spans = file_spans(out / "spans.otlp.jsonl")
    assert blocks(spans) == EXPECTED
    file = book["sinks"]["file"]
    assert file["recorded"] == file["delivered"] == len(spans)
    assert lost(file) == 0 and file["pending"] == 0
    return len(spans)


def check_otlp(book: dict, recorded: int, accepted: int, reason: str | None) -> dict:
    otlp = book["sinks"]["otlp"]
    assert otlp["recorded"] == recorded
    assert otlp["delivered"] == accepted
    assert otlp["delivered"] + lost(otlp) + otlp.get("unconfirmed", 0) == recorded
    if reason is not None:
        assert set(otlp["lost"]) <= {reason}  # (all of it may be unconfirmed)
    return otlp


def test_healthy_collector_gets_everything(tmp_path: Path) -> None:
    with collector("ok") as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks", str(BLOCKS))
        accepted = c.accepted
    assert proc.returncode == 0, proc.stderr
    assert ledger(tmp_path) is None  # nothing lost: timers.json says so by saying nothing
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert blocks(spans) == EXPECTED and accepted == len(spans)
    assert exit_lines(proc.stderr) == []
    print(shutdown_time(proc.stderr))
    print(f"LEDGER healthy: expected {len(spans)} / otlp delivered {accepted} / file "
          f"{len(spans)} / lost 0")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_dead_collector(tmp_path: Path, protocol: str) -> None:
    proc, _ = run_workload(tmp_path, "--endpoint", dead_endpoint(), "--blocks", str(BLOCKS),
                           "--shutdown-timeout", "2", "--protocol", protocol)
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    recorded = check_file(tmp_path, book)  # the file did not wait behind the collector
    otlp = check_otlp(book, recorded, 0, "unreachable")
    assert lost(otlp) == recorded
    (line,) = exit_lines(proc.stderr)
    assert f"otlp {otlp['sink']}: {recorded} of {recorded} lost (unreachable {recorded})" in line
    assert f"file {tmp_path}/spans.otlp.jsonl: all {recorded} delivered" in line
    print(shutdown_time(proc.stderr))
    print(f"LEDGER dead ({protocol}): expected {recorded} / otlp delivered 0 / lost {lost(otlp)} "
          f"/ file {recorded}")


def test_collector_that_never_answers_keeps_the_deadline(tmp_path: Path) -> None:
    with collector("never") as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks",
                                     str(BLOCKS), "--shutdown-timeout", "2")
        received = c.received
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    recorded = check_file(tmp_path, book)
    otlp = check_otlp(book, recorded, 0, "timed out")
    # The request it read and never answered: unconfirmed, exactly what it holds.
    assert otlp["unconfirmed"] == received > 0
    print(shutdown_time(proc.stderr))
    print(f"LEDGER never: expected {recorded} / otlp delivered 0 / lost {lost(otlp)} / "
          f"unconfirmed {otlp['unconfirmed']} (the collector received {received})")


@pytest.mark.parametrize("retry_after", [None, 8])
@pytest.mark.parametrize("status", [500, 503])
def test_erroring_collector(tmp_path: Path, status: int, retry_after: int | None) -> None:
    with collector("status", status=status, retry_after=retry_after) as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks", str(BLOCKS),
                               "--shutdown-timeout", "2")
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    recorded = check_file(tmp_path, book)
    otlp = check_otlp(book, recorded, 0, "rejected")
    (line,) = exit_lines(proc.stderr)
    assert "unreachable" not in line and f"HTTP {status}" in line
    if retry_after and status == 503:
        assert "asked to retry after 8 s" in line
    print(shutdown_time(proc.stderr))
    print(f"LEDGER http {status} retry-after {retry_after}: expected {recorded} / otlp "
          f"delivered 0 / lost {lost(otlp)} {otlp['lost']}")


def test_slow_collector_in_time_gets_everything_and_the_file_does_not_wait(
        tmp_path: Path) -> None:
    # Each request answered after 0.5 s on a kept-alive connection: slower than the flushes,
    # within the export deadline. Nothing is lost; the file is whole.
    with collector("slow", delay=0.5) as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks", str(BLOCKS),
                               "--shutdown-timeout", "20")
        accepted = c.accepted
    assert proc.returncode == 0, proc.stderr
    assert ledger(tmp_path) is None
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert blocks(spans) == EXPECTED and accepted == len(spans)
    print(shutdown_time(proc.stderr))
    print(f"LEDGER slow 0.5 s: expected {len(spans)} / otlp delivered {accepted} / lost 0")


@pytest.mark.parametrize("mode", ["slow", "trickle", "keepalive"])
def test_collector_slower_than_the_deadline(tmp_path: Path, mode: str) -> None:
    # Answers after 60 s (or a byte every 2 s; or at once at first, then after 60 s on the
    # same kept-alive connection): shutdown gives up at its deadline and counts every span
    # it could not deliver.
    kind = "slow" if mode == "keepalive" else mode
    with collector(kind, delay=2.0 if mode == "trickle" else 60.0,
                   fast_first=1 if mode == "keepalive" else 0) as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks",
                               str(BLOCKS), "--shutdown-timeout", "2")
        accepted, received = c.accepted, c.received
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    recorded = check_file(tmp_path, book)
    otlp = check_otlp(book, recorded, accepted, "timed out")
    assert (accepted > 0) == (mode == "keepalive")
    # The request on the wire when the deadline came is "unconfirmed", not lost: the
    # collector has exactly those spans beyond the ones it answered.
    assert otlp["unconfirmed"] > 0
    assert received == accepted + otlp["unconfirmed"]
    (line,) = exit_lines(proc.stderr)
    assert f"{otlp['unconfirmed']} unconfirmed (sent, no answer before the deadline)" in line
    print(shutdown_time(proc.stderr))
    print(f"LEDGER {mode}: expected {recorded} / otlp delivered {accepted} / lost {lost(otlp)}"
          f" / unconfirmed {otlp['unconfirmed']} (the collector received {received})")


def test_small_buffer_with_a_slow_collector_counts_buffer_full_for_it_only(
        tmp_path: Path) -> None:
    with collector("slow", delay=1.0) as c:
        proc, _ = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks", str(BLOCKS),
                               "--shutdown-timeout", "3", "--max-buffer", "1000",
                               "--flush", "0.05")
        accepted, received = c.accepted, c.received
    assert proc.returncode == 0, proc.stderr
    book = ledger(tmp_path)
    otlp = book["sinks"]["otlp"]
    file = book["sinks"]["file"]
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert file["delivered"] == len(spans)
    assert file["delivered"] + lost(file) == file["recorded"] == otlp["recorded"]
    # The request in flight when the deadline passes may still be answered 200 just as the
    # client gives up on it: "unconfirmed", neither delivered nor lost; the collector has
    # exactly the delivered and the unconfirmed spans.
    unconfirmed = otlp.get("unconfirmed", 0)
    assert received == otlp["delivered"] + unconfirmed
    assert otlp["delivered"] <= accepted <= otlp["delivered"] + unconfirmed
    assert otlp["delivered"] + lost(otlp) + unconfirmed == otlp["recorded"]
    print(shutdown_time(proc.stderr))
    print(f"LEDGER small buffer + slow: recorded {otlp['recorded']} / otlp delivered "
          f"{accepted} lost {otlp['lost']} / file delivered {len(spans)} lost {file['lost']}")


def test_collector_timing_is_measured(tmp_path: Path) -> None:
    """Not a timing assertion: the deadline is kept because the ledger settles what is left
    (a stuck send is abandoned and counted); this records how long exit took."""
    c = Collector("never")
    try:
        proc, elapsed = run_workload(tmp_path, "--endpoint", c.endpoint, "--blocks", "10",
                                     "--shutdown-timeout", "2")
    finally:
        c.close()
    assert proc.returncode == 0
    print(f"TIMING never-answering collector, shutdown_timeout 2: run took {elapsed:.1f} s; "
          f"{shutdown_time(proc.stderr)}")
