"""A relaying worker lays its records out in the relay's columns between flushes
(`relay_columns.Packs`, `Pipeline.pack`; issue 19): the frame is byte for byte the one writing
all of a flush's records at once gives, every record goes out once and the ledger counts it,
and records held as tuples no longer make the worker's garbage collector run more often. A main
process packs its records for its windows in the thread that recorded them (never its main
thread).
"""

from __future__ import annotations

import gc
import random
import threading
import time
from typing import Any

import pytest

from otel_rl._internal import relay, relay_columns
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.pipeline import Pipeline
from otel_rl._internal.record import SPAN_ID
from otel_rl._internal.sinks.base import Sink, Stats
from tests.test_relay_columns import random_batches, reference
from tests.test_relay_columns import writer as writer  # the fixture


class Keep(Sink):
    """Keeps the batches it was given."""

    name = label = "relay"

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.batches: list[Batch] = []

    def export(self, batches: list[Batch], deadline: float) -> None:  # type: ignore[override]
        self.batches.extend(batches)
        self.stats.add_exported(self.name, sum(len(b.records) for b in batches))

    def shutdown(self, deadline: float) -> None:
        pass

    def records(self) -> list[Any]:
        return [r for b in self.batches for r in b.records]


def packing_pipeline(stats: Stats, sink: Sink, flush_interval: float = 3600) -> Pipeline:
    pipeline = Pipeline(resource={"service.name": "w"}, offset_ns=0, thread_names={1: "Main"},
                        sinks=[sink], stats=stats, flush_interval=flush_interval,
                        max_relayed=1 << 20)
    pipeline.packs = relay_columns.Packs()
    pipeline.pack_between = True  # a relaying worker's
    return pipeline


def record(i: int, name: str = "step", extra: Any = None) -> tuple[Any, ...]:
    return (i, i // 3, name, 10 * i, 10 * i + 4, 1, 0xABC, extra)


@pytest.mark.parametrize("writer", [False, True], indirect=True, ids=["pure", "compiled"])
@pytest.mark.parametrize("seed", range(3))
def test_packs_give_the_frame_of_all_the_records_written_at_once(writer: bool,
                                                                 seed: int) -> None:
    rng = random.Random(seed)
    for batch in random_batches(200 + seed):
        records = list(batch.records)
        packs = relay_columns.Packs()
        at = 0
        while at < len(records):
            step = rng.choice((1, 2, 7, 100, len(records)))
            packs.add(records[at:at + step])
            at += step
        assert packs.count == len(records)
        packed = packs.take()
        assert packed is not None and packs.count == 0 and packs.take() is None
        assert (packed.raw, packed.names, packed.traces, packed.positions) == \
            relay_columns.write(records)
        assert list(packed) == records
        sent = Batch(batch.resource, batch.offset_ns, packed, batch.thread_names)
        frame = relay.encode_columns(sent)
        assert frame == reference(batch)
        assert list(relay.decode_columns(frame[relay.FRAME_HEADER.size:]).records) == records


def test_a_flush_sends_what_was_packed_and_what_came_after_as_one_batch() -> None:
    stats = Stats()
    sink = Keep(stats)
    pipeline = packing_pipeline(stats, sink)
    pipeline.start()
    try:
        made = [record(i, extra={"attrs": {"k": i}} if i % 97 == 0 else None)
                for i in range(1, 2501)]
        for start in range(0, 2000, 500):
            pipeline.buffer.extend(made[start:start + 500])
            pipeline.pack()
            assert not pipeline.buffer
        pipeline.buffer.extend(made[2000:])  # the flush's own, packed with the rest
        pipeline.flush(time.monotonic() + 10)
    finally:
        pipeline.shutdown(time.monotonic() + 10, 10)
    assert len(sink.batches) == 1
    assert isinstance(sink.batches[0].records, relay_columns.Packed)
    assert sink.records() == made
    assert pipeline.drained == len(made)
    assert stats.ledger.totals()["relay"]["delivered"] == len(made)


def test_the_flusher_packs_between_flushes_by_itself() -> None:
    stats = Stats()
    sink = Keep(stats)
    pipeline = packing_pipeline(stats, sink)  # a flush only at shutdown
    pipeline.start()
    n = 0
    packs = pipeline.packs
    assert packs is not None
    try:
        until = time.monotonic() + 10  # (a machine too busy to run the flusher for 10 s)
        while packs.count == 0 and time.monotonic() < until:
            for _ in range(100):  # ~10,000 records a second, as a busy worker's
                n += 1
                pipeline.buffer.append(record(n))  # type: ignore[arg-type]
            time.sleep(0.01)
        assert packs.count > 0, "the flusher never packed"
    finally:
        pipeline.shutdown(time.monotonic() + 10, 10)
    assert [r[SPAN_ID] for r in sink.records()] == list(range(1, n + 1))
    assert stats.ledger.totals()["relay"]["delivered"] == n


def test_records_a_pack_cannot_lay_out_go_out_as_they_are() -> None:
    stats = Stats()
    sink = Keep(stats)
    pipeline = packing_pipeline(stats, sink)
    good = [record(i) for i in range(1, 4)]
    odd = (9, 0, "float start", 1.5, 2, 1, 0xABC, None)  # the writers raise on it
    pipeline.buffer.extend(good)
    pipeline.pack()
    pipeline.buffer.append(odd)  # type: ignore[arg-type]
    pipeline.pack()
    pipeline.flush(time.monotonic() + 10)
    pipeline.shutdown(time.monotonic() + 10, 10)
    assert sink.records() == [*good, odd]
    assert stats.ledger.totals()["relay"]["delivered"] == 4


def test_shutdown_counts_what_the_packs_held_when_the_flusher_is_stuck() -> None:
    stats = Stats()
    sink = Keep(stats)
    pipeline = packing_pipeline(stats, sink)
    pipeline.buffer.extend(record(i) for i in range(1, 11))
    pipeline.pack()
    pipeline.buffer.extend(record(i) for i in range(11, 14))
    stuck = threading.Lock()
    stuck.acquire()
    pipeline._flush_lock = stuck  # a flush busy past the deadline
    pipeline.shutdown(time.monotonic() + 0.05, 0.05)
    assert sink.records() == []
    line = stats.ledger.totals()["relay"]
    assert line["recorded"] == 13 and line["delivered"] == 0
    assert line["lost"] == {"timed out": 13}


def collections_while_holding(records: int, pack: bool) -> int:
    """Gen-0 collections while `records` tuples are recorded into a relaying worker's
    pipeline, packed every 1,000 records or held until the flush."""
    stats = Stats()
    pipeline = packing_pipeline(stats, Keep(stats))
    if not pack:
        pipeline.packs = None
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    for i in range(1, records + 1):
        pipeline.buffer.append((i, 0, "step", i, i + 1, 1, 7, None))
        if pack and i % 1000 == 0:
            pipeline.pack()
    made = gc.get_stats()[0]["collections"] - before
    pipeline.flush(time.monotonic() + 10)
    pipeline.shutdown(time.monotonic() + 10, 10)
    return made


def test_packed_records_do_not_make_the_garbage_collector_run() -> None:
    if not gc.isenabled():
        pytest.skip("the cyclic garbage collector is off here")
    threshold = gc.get_threshold()[0]
    held = collections_while_holding(30_000, pack=False)
    packed = collections_while_holding(30_000, pack=True)
    assert held >= 30_000 // threshold // 2, held
    assert packed <= max(2, held // 8), (packed, held)


def windowed_pipeline(stats: Stats, sink: Sink, pack: bool) -> tuple[Pipeline, Any]:
    """A main process's pipeline under ``auto``: its drained batches go through windows
    (1 s wide, every 3rd kept, a budget of 400 spans) at a fixed moment per flush."""
    from otel_rl._internal.windows import Windower

    pipeline = packing_pipeline(stats, sink)
    if not pack:
        pipeline.packs = None
    windower = Windower(run_id="run-packed", t0_ns=0, window_s=1.0, every=3,
                        budget=lambda: 400, main=True, run_span=(0xABC, 0x123), lag_s=0.5,
                        own=Batch({"service.name": "w"}, 0, []))
    clock = {"now": 0}
    pipeline.transform = lambda batches, final: windower.process(batches, clock["now"], final)
    return pipeline, clock


def test_a_main_process_packing_its_own_records_exports_what_holding_them_exports() -> None:
    """The windows place a packed batch by its columns, as a relayed one: the exported spans,
    their order and the ledger are those of the same records held as tuples until the flush
    (records with extras, an outlier, several kept windows and trims)."""
    rng = random.Random(7)
    made = []
    for i in range(1, 12_001):
        start = i * 1_000_000 + rng.randrange(1000)  # 12 s of blocks, 1,000 a second
        duration = 400_000_000 if i % 3001 == 0 else rng.randrange(20_000, 90_000)
        extra = {"attrs": {"step": i}} if i % 97 == 0 else None
        made.append((i, i - i % 10 if i % 10 else 0, f"b{i % 5}", start, start + duration,
                     1, 0xABC, extra))
    outputs = []
    for pack in (True, False):
        stats = Stats()
        sink = Keep(stats)
        pipeline, clock = windowed_pipeline(stats, sink, pack)
        for second in range(12):
            part = made[second * 1000:(second + 1) * 1000]
            for at in range(0, len(part), 250):
                pipeline.buffer.extend(part[at:at + 250])
                pipeline.pack()  # (nothing to do when not packing)
            clock["now"] = (second + 2) * 1_000_000_000
            pipeline.flush(time.monotonic() + 10)
        clock["now"] = 20 * 1_000_000_000
        pipeline.shutdown(time.monotonic() + 10, 10)
        outputs.append((sink.records(), stats.ledger.totals()["relay"]))
    assert outputs[0] == outputs[1]
    records, line = outputs[0]
    assert 400 < len(records) < len(made) and line["delivered"] == len(records)


PROGRAM_WAKES = r"""
import gc
import multiprocessing as mp
import sys
import tempfile
import threading
import time

import otel_rl
from otel_rl.timers import hierarchical_timer
from otel_rl._internal import recorder, runtime


def loop(blocks):
    for _ in range(blocks // 1000):  # ~20,000 blocks a second: a relaying worker packs ~20 times
        for _ in range(1000):
            with hierarchical_timer("step"):
                pass
        time.sleep(0.05)


def time_blocks(out=None):
    rt = runtime.current()
    packers = set()
    if rt.relay_client is None:
        pack_full = rt.pipeline.pack_full
        def spy(sink):  # (seen by the hot path from the next block on)
            packers.add(threading.current_thread().name)
            pack_full(sink)
        recorder._assign(on_full=spy)
        loop(5000)  # the main thread's blocks: held until a flush or another thread's block
        main_held = len(rt.pipeline.buffer)
    else:
        main_held = -1
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    if rt.relay_client is None:  # a thread of the program, as ML-Agents' trainer thread
        thread = threading.Thread(target=loop, args=(20_000,), name="recorder")
        thread.start()
        thread.join()
    else:
        loop(20_000)
    collections = gc.get_stats()[0]["collections"] - before
    seen = (rt.relay_client is not None, rt.pipeline.pack_between, main_held,
            len(rt.pipeline.buffer), rt.pipeline.packs.count, collections,
            ",".join(sorted(packers)) or "-")
    if out is not None:
        out.put(seen)
    return seen


if __name__ == "__main__":
    otel_rl.configure(output_dir=tempfile.mkdtemp(), spans="auto", flush_interval=60)
    main = time_blocks()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    worker = ctx.Process(target=time_blocks, args=(out,))
    worker.start()
    relaying = out.get()
    worker.join()
    otel_rl.shutdown()
    rt = runtime.current()
    line = rt.stats.ledger.totals()["file"]
    print(*main, *relaying, line["recorded"], line["delivered"], sum(line["lost"].values()),
          gc.get_threshold()[0], worker.exitcode)
"""


def test_a_main_process_packs_its_records_in_the_thread_that_recorded_them(
        tmp_path: Any) -> None:
    """A main process under `auto` lays its records out in the relay's columns for its windows
    in the thread whose block fills its buffer past `PACK_RECORDS`, other than the main thread
    (where Python runs signal handlers between any two bytecodes): its flusher does not wake
    between flushes (each wake would take the GIL from the training's threads), and the records
    never wait as tuples for its flush, so they never make its garbage collector run more
    often. The main thread's own blocks leave theirs for such a block or the flush. A spawned
    worker of it, relaying the same blocks at the same rate, packs them by waking its flusher.
    What the windows keep reaches the spans file, none lost."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from otel_rl._internal.pipeline import PACK_RECORDS

    repo = Path(__file__).resolve().parents[1]
    program = tmp_path / "wakes.py"
    program.write_text(PROGRAM_WAKES)
    out = subprocess.run([sys.executable, str(program)], cwd=repo, timeout=120,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.returncode == 0, out.stderr[-2000:]
    fields = out.stdout.split()
    keys = ("relays", "between", "main_held", "held", "packed", "collections", "packers")
    main = dict(zip(keys, fields[:7], strict=True))
    worker = dict(zip(keys, fields[7:14], strict=True))
    recorded, delivered, lost, threshold, exitcode = map(int, fields[14:19])
    assert main["relays"] == "False" and worker["relays"] == "True" and exitcode == 0
    # The main process: its main thread's 5,000 blocks held, then packed by the other thread's
    # (no flusher wakes), at most PACK_RECORDS records held after it.
    assert main["between"] == "False" and main["packers"] == "recorder", main
    assert int(main["main_held"]) >= 5000, main
    assert int(main["held"]) <= PACK_RECORDS and int(main["packed"]) >= 25_000 - PACK_RECORDS
    if threshold:  # held as tuples until the flush, they made ~20,000 / threshold collections
        assert int(main["collections"]) <= max(2, 20_000 // threshold // 4), main
    # The worker: its flusher packs (no hook in a relaying worker's recorder).
    assert worker["between"] == "True" and worker["packers"] == "-", worker
    assert 0 < int(worker["packed"]) and int(worker["held"]) < 20_000, worker
    assert recorded == delivered > 0 and lost == 0  # (what the kept window's budget holds)
