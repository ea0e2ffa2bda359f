"""The worker relay: private to the run, typed columns that round-trip exactly, malformed
frames cost only themselves."""

from __future__ import annotations

import os
import socket
import stat
import time
from typing import Any

import pytest

from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.relay import (
    FRAME_HEADER,
    RelayClient,
    RelayServer,
    decode_columns,
    encode_columns,
)
from otel_rl._internal.sinks import Stats

RECORDS = [
    (5, 3, "advance", 100, 200, 77, (1 << 127) + 9, None),
    (8, 0, "boom", 1, 2, 78, 5, {"error": ["ValueError", "bad", "tb"], "link": [1, 2]}),
    (9, 8, "ünïcødé", 3, 4, 2**63 + 5, 5, {"sampled": "outlier"}),
]


def test_columns_round_trip_exactly() -> None:
    batch = Batch({"service.name": "s", "process.pid": 7}, 123, RECORDS, {77: "Main", 78: "t"})
    frame = encode_columns(batch)
    again = decode_columns(frame[FRAME_HEADER.size:])
    assert [tuple(r) for r in again.records] == RECORDS
    assert again.thread_names == {77: "Main", 78: "t"}
    assert again.offset_ns == 123 and again.resource == {"service.name": "s", "process.pid": 7}


@pytest.mark.parametrize("cut", [1, 9, -1, -8])
def test_truncated_frames_are_rejected(cut: int) -> None:
    body = encode_columns(Batch({}, 0, RECORDS))[FRAME_HEADER.size:]
    with pytest.raises((ValueError, KeyError, IndexError)):
        decode_columns(body[:cut])


def test_relay_is_private_and_delivers_batches_and_snapshots() -> None:
    batches: list[Batch] = []
    snapshots: list[dict[str, Any]] = []
    server = RelayServer(batches.append, snapshots.append)
    try:
        folder = os.path.dirname(server.address)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(server.address).st_mode) & 0o077 == 0
        client = RelayClient(server.address, Stats())
        client.export([Batch({"service.name": "w"}, 5, RECORDS)], time.monotonic() + 5)
        client.send_snapshot({"pid": 42, "contributions": []})
        # A malformed frame in between is dropped; later frames still arrive.
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(server.address)
        raw.sendall(FRAME_HEADER.pack(5, 3) + b"junk!")
        raw.close()
        client.export([Batch({"service.name": "w"}, 5, RECORDS[:1])], time.monotonic() + 5)
        deadline = time.monotonic() + 10
        while (len(batches) < 2 or not snapshots) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [len(b.records) for b in batches] == [3, 1]
        assert snapshots == [{"pid": 42, "contributions": []}]
        client.shutdown(time.monotonic() + 1)
    finally:
        server.stop(time.monotonic() + 5)
    assert not os.path.exists(server.address)


def test_client_fails_fast_without_a_parent(tmp_path: Any) -> None:
    with pytest.raises(OSError):
        RelayClient(str(tmp_path / "nobody.sock"), Stats())


def test_a_relayed_snapshot_arrives_with_its_trees_as_nodes() -> None:
    # One in-process form of a contribution's tree: a node where it was made, the node read
    # back where it arrives (the JSON dict is only the wire form); a bad tree costs its frame.
    from otel_rl._internal.node import TreeNode

    sent = TreeNode("root")
    sent.child("update").add(0.25, 2)
    sent.child("update").child("gradient").add(0.125)
    snapshots: list[dict[str, Any]] = []
    server = RelayServer(lambda batch: None, snapshots.append)
    try:
        client = RelayClient(server.address, Stats())
        bad = {"pid": 7, "contributions": [{"path": [], "parallel": True,
                                            "tree": {"total": "x", "count": 1}}]}
        client.send_snapshot(bad)  # type: ignore[arg-type]
        good = {"pid": 8, "contributions": [{"path": ["run"], "parallel": True, "tree": sent,
                                             "pid": 8, "tid": 1}],
                "children": [{"pid": 9, "contributions": [{"path": [], "parallel": False,
                                                           "tree": sent}]}]}
        client.send_snapshot(good)  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while not snapshots and time.monotonic() < deadline:
            time.sleep(0.02)
        client.shutdown(time.monotonic() + 1)
    finally:
        server.stop(time.monotonic() + 5)
    assert [snap["pid"] for snap in snapshots] == [8]
    got = snapshots[0]["contributions"][0]["tree"]
    inner = snapshots[0]["children"][0]["contributions"][0]["tree"]
    assert isinstance(got, TreeNode) and isinstance(inner, TreeNode)
    assert got == sent == inner
    assert got.children["update"].children["gradient"].total == 0.125


def test_stop_reads_a_worker_that_connected_after_the_relay_thread_ended() -> None:
    # A worker's last words can reach the socket once the relay's own thread has stopped;
    # `stop` still reads them: it accepts the waiting connection and reads until its end.
    snapshots: list[dict[str, Any]] = []
    server = RelayServer(lambda batch: None, snapshots.append)
    server._stop.set()
    server._wake()
    server._thread.join(5)
    assert not server._thread.is_alive()
    client = RelayClient(server.address, Stats())
    client.send_snapshot({"pid": 42, "contributions": []})
    client.shutdown(time.monotonic() + 1)
    server.stop(time.monotonic() + 5)
    assert snapshots == [{"pid": 42, "contributions": []}]


def test_stop_reads_what_a_still_connected_worker_sent_last() -> None:
    # A worker still connected when the run stops (it is exiting too) may have sent more
    # since the relay's thread last looked: `stop` reads it before closing the connection.
    snapshots: list[dict[str, Any]] = []
    server = RelayServer(lambda batch: None, snapshots.append)
    client = RelayClient(server.address, Stats())
    client.send_snapshot({"pid": 1, "contributions": []})
    deadline = time.monotonic() + 10
    while not snapshots and time.monotonic() < deadline:
        time.sleep(0.01)
    server._stop.set()
    server._wake()
    server._thread.join(5)
    client.send_snapshot({"pid": 2, "contributions": []})
    try:
        server.stop(time.monotonic() + 5)
    finally:
        client.shutdown(time.monotonic() + 1)
    assert [snap["pid"] for snap in snapshots] == [1, 2]
