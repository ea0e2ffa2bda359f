"""The relay's compiled column writer (`_relaycols.c`) against the pure one (issue 19): the same
frame, byte for byte, from the same records, as the plain loops the relay used before; records
it does not take as they are go to the pure writer, which raises what it always raised; a real
worker process relays through it to a real parent.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from array import array
from collections.abc import Iterator
from typing import Any

import pytest

from otel_rl._internal import relay, relay_columns
from otel_rl._internal.otlp.records import Batch

COMPILED = relay_columns.compiled_module()
needs_compiled = pytest.mark.skipif(
    COMPILED is None and not os.environ.get("CI"),
    reason="the compiled column writer is not built here (python scripts/build_accel.py)")
EXTRAS: list[Any] = [{}, {"attrs": {"k": 1}}, {"error": ["E", "m", "tb"]}, {"sampled": "kept"}]


def reference(batch: Batch) -> bytes:
    """The frame as `relay.encode_columns` wrote it before the column writers (a transpose,
    an array per column, names and traces numbered by a loop)."""
    records = batch.records
    sids, psids, names, starts, ends, tids, traces, extras = zip(*records, strict=True)
    name_ix: dict[Any, int] = {}
    trace_ix: dict[int, int] = {}
    columns = (
        array("Q", sids), array("Q", psids),
        array("I", [name_ix.setdefault(n, len(name_ix)) for n in names]),
        array("q", starts), array("q", ends), array("Q", tids),
        array("I", [trace_ix.setdefault(t, len(trace_ix)) for t in traces]),
    )
    header = json.dumps({
        "resource": dict(batch.resource), "offset_ns": batch.offset_ns,
        "threads": {str(k): v for k, v in batch.thread_names.items()}, "n": len(records),
        "names": list(name_ix), "traces": [f"{t:x}" for t in trace_ix],
        "extras": {str(i): e for i, e in enumerate(extras) if e is not None},
    }, separators=(",", ":")).encode("utf-8")
    body = b"".join([relay._LEN.pack(len(header)), header, *(c.tobytes() for c in columns)])
    return relay.FRAME_HEADER.pack(len(body), relay.KIND_COLUMNS) + body


def random_batches(seed: int) -> Iterator[Batch]:
    rng = random.Random(seed)
    for _ in range(60):
        names = [f"n{i}" for i in range(rng.choice((1, 3, 40)))] + ["ünï", ""]
        traces = [rng.getrandbits(128) | 1 for _ in range(rng.choice((1, 1, 2, 5)))]
        records = []
        for _ in range(rng.choice((1, 2, 17, 500))):
            start = rng.choice((0, -5, rng.getrandbits(62), -(1 << 63), (1 << 63) - 1))
            records.append((
                rng.choice((1, rng.getrandbits(64), (1 << 64) - 1)),
                rng.choice((0, rng.getrandbits(64))),
                rng.choice(names), start, rng.choice((start, start // 2 + 7)),
                rng.choice((0, 140_001, (1 << 64) - 1)), rng.choice(traces),
                rng.choice(EXTRAS) if rng.random() < 0.1 else None))
        yield Batch({"service.name": "w", "process.pid": 7}, rng.randrange(-9, 1 << 61),
                    records, {140_001: "MainThread"})


@pytest.fixture
def writer(request: pytest.FixtureRequest) -> Iterator[bool]:
    before = relay_columns.in_use()
    compiled = bool(request.param)
    if compiled and COMPILED is None:
        pytest.skip("the compiled column writer is not built here")
    assert relay_columns.use(compiled) is compiled
    yield compiled
    relay_columns.use(before)


@pytest.mark.parametrize("writer", [False, True], indirect=True, ids=["pure", "compiled"])
@pytest.mark.parametrize("seed", range(4))
def test_frames_are_byte_for_byte_the_plain_loops_frames(writer: bool, seed: int) -> None:
    for batch in random_batches(seed):
        frame = relay.encode_columns(batch)
        assert frame == reference(batch)
        again = relay.decode_columns(frame[relay.FRAME_HEADER.size:])
        assert list(again.records) == list(batch.records)


@needs_compiled
def test_compiled_and_pure_writers_agree_on_every_part() -> None:
    assert COMPILED is not None
    for seed in range(3):
        for batch in random_batches(100 + seed):
            assert COMPILED.columns(batch.records) == relay_columns.pure(batch.records)


BAD: dict[str, list[Any]] = {
    "a short record": [(1, 0, "a", 1, 2, 3, 4)],
    "a float start": [(1, 0, "a", 1.5, 2, 3, 4, None)],
    "a negative span id": [(-1, 0, "a", 1, 2, 3, 4, None)],
    "a span id past 64 bits": [(1 << 64, 0, "a", 1, 2, 3, 4, None)],
    "an end past int64": [(1, 0, "a", 1, 1 << 63, 3, 4, None)],
    "a str id": [(1, 0, "a", 1, 2, "3", 4, None)],
}


@needs_compiled
@pytest.mark.parametrize("case", list(BAD))
def test_records_the_compiled_writer_declines_raise_as_before(case: str) -> None:
    assert COMPILED is not None
    records = [(1, 0, "a", 1, 2, 3, 4, None), *BAD[case]]
    assert COMPILED.columns(records) is None
    batch = Batch({}, 0, records)
    with pytest.raises(Exception) as now:
        relay.encode_columns(batch)
    with pytest.raises(Exception) as before:
        reference(batch)
    assert type(now.value) is type(before.value)


class Name(str):
    pass


@needs_compiled
def test_unusual_records_take_the_pure_path_with_the_same_bytes() -> None:
    records = [(1, 0, Name("sub"), 1, 2, 3, 4, None), (2, 1, "a", 1, 2, 3, True, None),
               [3, 1, "a", 1, 2, 3, 4, None]]
    assert COMPILED is not None and COMPILED.columns(records) is None
    batch = Batch({}, 0, records)
    assert relay.encode_columns(batch) == reference(batch)


def test_a_real_worker_relays_through_the_writer_in_use(tmp_path: Any) -> None:
    """A worker process encodes with the writer the ``accelerator`` setting picks (compiled
    where built) and its parent gets every record back exactly, with either writer."""
    script = textwrap.dedent("""
        import json, os, sys
        from otel_rl._internal import relay, relay_columns
        from otel_rl._internal.otlp.records import Batch
        from otel_rl._internal.sinks import Stats
        records = [(i + 1, i, f"b{i % 3}", 10 * i, 10 * i + 5, 77, 1 << 100 | i % 2,
                    {"attrs": {"i": i}} if i % 7 == 0 else None) for i in range(1000)]
        client = relay.RelayClient(sys.argv[1], Stats())
        client.export([Batch({"process.pid": os.getpid()}, 5, records, {77: "M"})], 0.0)
        client.shutdown(0.0)
        print(json.dumps({"compiled": relay_columns.in_use()}))
    """)
    received: list[Batch] = []
    server = relay.RelayServer(received.append, lambda snapshot: None)
    try:
        for setting in ("true", "false"):
            received.clear()
            env = {**os.environ, "OTEL_RL_ACCELERATOR": setting}
            done = subprocess.run([sys.executable, "-c", script, server.address], env=env,
                                  capture_output=True, text=True, timeout=60, check=True)
            assert json.loads(done.stdout)["compiled"] is (setting == "true"
                                                          and COMPILED is not None)
            deadline = time.monotonic() + 10
            while not received and time.monotonic() < deadline:
                time.sleep(0.02)
            got = [record for batch in received for record in batch.records]
            assert got == [(i + 1, i, f"b{i % 3}", 10 * i, 10 * i + 5, 77, 1 << 100 | i % 2,
                            {"attrs": {"i": i}} if i % 7 == 0 else None) for i in range(1000)]
    finally:
        server.stop(time.monotonic() + 5)


@needs_compiled
@pytest.mark.parametrize("seed", range(3))
def test_any_record_gets_the_pure_writers_frame_or_its_error(seed: int) -> None:
    """Random fields of every kind (ints past their column's range, floats, bools, None,
    strings, str subclasses, odd tuple lengths): the frame is the pure writer's, or the
    error is of the pure writer's type."""
    rng = random.Random(seed)
    values: list[Any] = [0, 1, -1, (1 << 64) - 1, 1 << 64, (1 << 63) - 1, -(1 << 63),
                         -(1 << 63) - 1, 2.0, True, None, "x", Name("y"), b"z", (1 << 100)]

    def record() -> Any:
        fields = [rng.getrandbits(40), 0, "a", 5, 9, 3, 1 << 90, None]
        for _ in range(rng.randrange(3)):
            fields[rng.randrange(8)] = rng.choice(values)
        if rng.random() < 0.05:
            fields.append(None)
        return tuple(fields)

    def outcome(encode: Any, batch: Batch) -> Any:
        try:
            return encode(batch)
        except Exception as exc:
            return type(exc)

    before = relay_columns.in_use()
    try:
        for _ in range(300):
            batch = Batch({}, 0, [record() for _ in range(rng.randrange(1, 6))])
            frames = {}
            for compiled in (True, False):
                relay_columns.use(compiled)
                frames[compiled] = outcome(relay.encode_columns, batch)
            assert frames[True] == frames[False] == outcome(reference, batch)
    finally:
        relay_columns.use(before)
