"""Issue 19: the main process places relayed batches in the `auto` windows in bulk, on their
typed columns (`windows_bulk`), instead of record by record. Differential tests: the same
batches through a windower in bulk and through one record by record give the same exported
batches (records, ids, parents, order), the same kept windows and the same counts — on crafted
workloads that reach every branch (rings, scheduled windows cut by the budget, outliers, late
and long records, pass-through spans, open blocks) and on a real multi-process run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import relay, semconv
from otel_rl._internal.mainledger import LEDGER_KEY
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.otlp.rows import Rows
from otel_rl._internal.record import EXTRA, PARENT_ID, THREAD_ID, TRACE_ID, OpenSpan
from otel_rl._internal.windows import Windower, beyond, remap
from otel_rl._internal.windows_bulk import OWN_BULK, with_columns
from tests.test_long_runs import assert_same_tree, tree_cli

REPO = Path(__file__).resolve().parents[1]
SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND


def relayed(batch: Batch) -> Batch:
    """`batch` as the main process gets it from a worker: through a real relay frame."""
    frame = relay.encode_columns(batch)
    return relay.decode_columns(frame[relay.FRAME_HEADER.size:])


def workload(seed: int, seconds: int = 24, rate: int = 3000) -> list[tuple[int, list[Batch]]]:
    """Flushes (now, batches) of two relaying workers and the main process's own records:
    short blocks under a few parents, some long enough to span windows, outliers, late
    arrivals (a worker's batch held back a few flushes), extras and a process marker span."""
    rng = random.Random(seed)
    names = [f"block_{i}" for i in range(6)]
    offsets = {101: 5_000, 102: -7_000, 1: 0}
    held: list[Batch] = []
    flushes = []
    sid = 1 << 40
    for s in range(seconds):
        batches = []
        for pid in (101, 102, 1):
            records = []
            base = T0 + s * SECOND - offsets[pid]
            parent = 0
            for i in range(rate if pid != 1 else rate // 10):
                sid += 1
                start = base + i * (SECOND // rate) + rng.randrange(1000)
                duration = rng.randrange(2_000, 60_000)
                roll = rng.random()
                if roll < 0.002:
                    duration = rng.randrange(15, 80) * 1_000_000  # an outlier (or not)
                elif roll < 0.004:
                    duration = rng.randrange(1, 4) * SECOND  # spans windows
                extra: Any = None
                if i % 97 == 0:
                    extra = {"attrs": {"step": i}}
                elif i % 389 == 0:
                    extra = {"error": ["ValueError", "bad", "trace"]}
                if i % 10 == 0:
                    parent = sid
                    # Some under the block that started worker 101 (`bases`), which is in no
                    # window: those hang under the window span, marked (`_starter_ended`).
                    psid = 1 << 39 if pid == 101 and i % 50 == 0 else 0
                else:
                    psid = parent
                records.append((sid, psid, names[rng.randrange(len(names))], start,
                                start + duration, 7000 + pid, 0xFEED, extra))
            if pid != 1 and s == 3:
                sid += 1
                records.append((sid, 0, "process", base, base + 10, 7000 + pid, 0xFEED,
                                {"attrs": {semconv.KIND: semconv.KIND_PROCESS}}))
            for at in range(0, len(records), 10):  # a parent is recorded after its children
                records[at:at + 10] = records[at + 1:at + 10] + records[at:at + 1]
            batch = Batch({semconv.PROCESS_PID: pid, "service.name": "w"}, offsets[pid],
                          records, {7000 + pid: "MainThread"})
            if pid == 1:
                batches.append(batch)
            elif pid == 102 and s % 7 == 5:
                held.append(relayed(batch))  # arrives late, after its windows closed
            else:
                batches.append(relayed(batch))
        if s % 7 == 0 and held:
            batches.extend(held)
            held = []
        rng.shuffle(batches)
        flushes.append((T0 + (s + 1) * SECOND, batches))
    flushes.append((T0 + (seconds + 4) * SECOND, held))
    return flushes


def windower(bulk: bool, budget: int, every: int, main: bool = True, t0: int = T0) -> Windower:
    opened = [OpenSpan(101, 1 << 39, 0, "main_loop", T0 - 10 * SECOND, 7101)]
    asked = []

    def open_blocks() -> list[OpenSpan]:
        # The block that started worker 101 ends after the fourth kept window: its children
        # in later kept windows hang under the window span (`bases`).
        asked.append(1)
        return opened if len(asked) <= 4 else []

    w = Windower(run_id="run-diff", t0_ns=t0, window_s=1.0, every=every,
                 budget=lambda: budget, main=main, run_span=(0xABC, 0x123), lag_s=1.5,
                 own=Batch({semconv.PROCESS_PID: 1}, 0, []),
                 open_blocks=open_blocks, window_attributes=lambda: {"g": 1},
                 bases=lambda: {101: {1 << 39}})
    w.bulk = bulk
    return w


def assert_starter_ended_hang_under_window_spans(w: Windower, records: list[Any]) -> int:
    """Every exported span marked `STARTER_ENDED` hangs under its kept window's span, and
    every other span of worker 101 there is a continuation; how many are marked."""
    window_span = {w.trace_id(k): remap(w.run_span, k) for k in w.kept}
    marked = 0
    for r in records:
        attrs = (r[EXTRA] or {}).get("attrs") or {}
        if attrs.get(semconv.STARTER_ENDED):
            marked += 1
            assert r[PARENT_ID] == window_span[r[TRACE_ID]], r
        elif r[THREAD_ID] == 7101 and r[PARENT_ID] == window_span.get(r[TRACE_ID]):
            assert attrs.get(semconv.CONTINUATION), r
    return marked


def copy(batch: Batch) -> Batch:
    return Batch(batch.resource, batch.offset_ns, list(batch.records), batch.thread_names)


def run_both(seed: int, budget: int, every: int, main: bool = True) -> tuple[Windower, int]:
    bulk, reference = windower(True, budget, every, main), windower(False, budget, every, main)
    own_in_bulk = []  # the main process's own batches (plain records) placed in bulk
    take_columns = bulk.take_columns

    def counted(key: Any, batch: Batch) -> None:
        if not isinstance(batch.records, Rows):
            own_in_bulk.append(len(batch.records))
        take_columns(key, batch)

    bulk.take_columns = counted  # type: ignore[method-assign]
    flushes = workload(seed)
    exported = 0
    made: list[Any] = []
    for i, (now, batches) in enumerate(flushes):
        final = i == len(flushes) - 1
        got = bulk.process(batches, now, final)  # relayed batches' records not made yet
        want = reference.process([copy(b) for b in batches], now, final)
        assert [(b.resource, b.records) for b in got] == [(b.resource, b.records) for b in want]
        # What the open windows hold (the killed-main ledger's "waiting") is the same too.
        assert ({k: w.held() for k, w in bulk.windows.items()}
                == {k: w.held() for k, w in reference.windows.items()})
        exported += sum(len(b.records) for b in got)
        made.extend(r for b in got for r in b.records)
    marked = assert_starter_ended_hang_under_window_spans(bulk, made)
    if budget > 1000:  # (kept windows after the starter ended hold its children)
        assert marked > 0
    assert bulk.kept == reference.kept
    assert bulk.stats == reference.stats
    assert bulk._durations == reference._durations
    assert own_in_bulk and min(own_in_bulk) >= OWN_BULK  # (its 300-record batches)
    return bulk, exported


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("budget", "every"), [(10_000, 4), (400, 3), (60, 2)])
def test_bulk_windows_equal_record_by_record(seed: int, budget: int, every: int) -> None:
    w, exported = run_both(seed, budget, every)
    # The workload reached what it is there for: rings dropped, windows kept by schedule and
    # by outliers, budgets cut, late records, continuations.
    assert exported and w.stats["sampled_out"] and w.stats["continuations"]
    assert "schedule" in w.kept.values()
    if budget == 10_000:
        assert "outlier" in w.kept.values()


def test_bulk_windows_equal_record_by_record_in_a_process_exporting_on_its_own() -> None:
    w, exported = run_both(4, 500, 3, main=False)
    assert exported and set(w.kept.values()) == {"schedule"} and not w._durations


@pytest.mark.parametrize(("budget", "every"), [(10_000, 4), (400, 3), (60, 2)])
def test_relayed_records_are_made_only_for_the_windows_that_keep_them(
        budget: int, every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # A relayed record becomes a record tuple (`Rows.take`, or all of a batch's at once) only
    # when a kept window exports it or when it is taken one by one (a record spanning
    # windows, an outlier, a late one, a process span: under 2 % of this workload): not while
    # its window waits, not for a window dropped, and not for what a kept window's budget
    # cuts. Held as tuples they were most of a long run's main-process garbage collections.
    made = [0]
    take, whole = Rows.take, Rows._all

    def counted_take(rows: Rows, positions: list[int]) -> Any:
        made[0] += 0 if rows.made else len(positions)
        return take(rows, positions)

    def counted_whole(rows: Rows) -> Any:
        made[0] += 0 if rows.made else len(rows)
        return whole(rows)

    monkeypatch.setattr(Rows, "take", counted_take)
    monkeypatch.setattr(Rows, "_all", counted_whole)
    w = windower(True, budget, every)
    flushes = workload(7)
    relayed_in = relayed_out = 0
    for i, (now, batches) in enumerate(flushes):
        relayed_in += sum(len(b.records) for b in batches if isinstance(b.records, Rows))
        out = w.process(batches, now, i == len(flushes) - 1)
        relayed_out += sum(len(b.records) for b in out if b.resource[semconv.PROCESS_PID] != 1)
    assert relayed_out and "schedule" in w.kept.values()
    assert made[0] <= relayed_out + relayed_in // 50, (made[0], relayed_out, relayed_in)


def test_a_ring_fed_in_bulk_holds_what_it_would_hold_record_by_record() -> None:
    # One window, not scheduled, far more records than its ring holds, in chunks of every
    # size around the ring's length: its count and (once an outlier keeps it) its records.
    for sizes in ([5, 3, 40, 1], [39, 1, 1], [100], [1, 1, 1, 60, 2], [1, 29], [2, 28, 1]):
        outputs = []
        for bulk in (True, False):
            w = windower(bulk, budget=20, every=10)  # ring of 2 x (20 - 5) = 30
            sid = 100
            for size in sizes:
                records = []
                for _ in range(size):
                    sid += 1
                    start = T0 + SECOND + sid * 1000
                    records.append((sid, 0, "step", start, start + 500, 1, 9, None))
                w.process([relayed(Batch({semconv.PROCESS_PID: 5}, 0, records))],
                          T0 + SECOND)
            held = w.windows[1].held()
            outlier = [(sid + 1, 0, "step", T0 + SECOND, T0 + SECOND + 90_000_000, 1, 9,
                        None)]
            w._durations["step"] = [100, 100 * 500, 100 * 500 * 500]
            out = w.process([relayed(Batch({semconv.PROCESS_PID: 5}, 0, outlier))],
                            T0 + 10 * SECOND, final=True)
            outputs.append((held, w.kept, [b.records for b in out], w.stats))
        assert outputs[0] == outputs[1]
        held, kept, records, _stats = outputs[0]
        assert held == min(30, sum(sizes)) and kept[1] == "outlier"
        steps = [r for batch in records for r in batch if r[2] == "step"]
        assert len(steps) == 15  # the kept window's budget (20, less its reserve) of the ring


@pytest.mark.parametrize("first", [True, False])
def test_an_outlier_slicing_a_ring_with_made_and_pending_items_keeps_what_one_by_one_keeps(
        first: bool) -> None:
    # The outlier's slice of a ring that holds records taken one by one (items made already
    # when they came `first`, before any chunk; one chunk behind the others if not) and
    # chunks pending beyond its length: the slice keeps what one by one keeps, and the ring
    # pushes out what the whole chunks would have (`_Window.keep_from`).
    for sizes, cut_at in (([25, 20], 110), ([25, 20], 101), ([10, 40, 5], 140), ([28, 3], 131),
                          ([5, 3], 104)):
        outputs = []
        for bulk in (True, False):
            w = windower(bulk, budget=20, every=10)  # ring of 2 x (20 - 5) = 30
            sid = 100
            for n, size in enumerate(sizes):
                records = []
                for _ in range(size):
                    sid += 1
                    start = T0 + SECOND + sid * 1000
                    records.append((sid, 0, "step", start, start + 500, 1, 9, None))
                if n == 0:  # into the next window: taken one by one, three in a row
                    at = 0 if first else len(records)
                    records[at:at] = [(sid + 1000 + j, 0, "span", T0 + SECOND + 2000 + j,
                                       T0 + 2 * SECOND + 5000, 1, 9, None) for j in range(3)]
                w.process([relayed(Batch({semconv.PROCESS_PID: 5}, 0, records))],
                          T0 + SECOND)
            start = T0 + SECOND + cut_at * 1000
            outlier = [(sid + 1, 0, "step", start, T0 + SECOND + 90_000_000, 1, 9, None)]
            w._durations["step"] = [100, 100 * 500, 100 * 500 * 500]
            out = w.process([relayed(Batch({semconv.PROCESS_PID: 5}, 0, outlier))],
                            T0 + 10 * SECOND, final=True)
            outputs.append((w.kept, [b.records for b in out], w.stats))
        assert outputs[0] == outputs[1], (sizes, cut_at)
        assert outputs[0][0][1] == "outlier"


def test_a_process_own_records_get_the_columns_a_relayed_batch_arrives_with() -> None:
    own = next(b for _now, batches in workload(6, seconds=2) for b in batches
               if b.resource[semconv.PROCESS_PID] == 1)
    made, sent = with_columns(own).columns, relayed(own).columns
    assert made is not None and sent is not None
    for field in ("sids", "psids", "name_idx", "starts", "ends", "tids"):
        assert list(getattr(made, field)) == list(getattr(sent, field)), field
    assert made.names == sent.names and made.extras == sent.extras and made.extras
    assert with_columns(own).records is own.records  # placed from the records it has


@pytest.mark.parametrize("bad", ["negative id", "short tuple"])
def test_own_records_that_cannot_be_laid_out_in_columns_go_record_by_record(bad: str) -> None:
    records: list[Any] = [(i + 1, 0, "step", T0 + i * 1000, T0 + i * 1000 + 500, 1, 9, None)
                          for i in range(OWN_BULK)]
    records[5] = (-3, *records[5][1:]) if bad == "negative id" else records[5][:7]
    batch = Batch({semconv.PROCESS_PID: 1}, 0, records)
    assert with_columns(batch) is batch
    if bad == "negative id":  # (a short record fails either way, as it always did)
        outputs = []
        for bulk in (True, False):
            w = windower(bulk, budget=100, every=2)
            out = w.process([copy(batch)], T0 + 10 * SECOND, final=True)
            outputs.append(([b.records for b in out], w.kept, w.stats))
        assert outputs[0] == outputs[1] and outputs[0][1][0] == "schedule"


@pytest.mark.parametrize("seed", range(5))
def test_the_exact_outlier_rule_is_the_streaming_mean_and_deviation(seed: int) -> None:
    # `beyond` (integers) against the float rule it replaced, away from its boundary.
    rng = random.Random(seed)
    durations = [rng.randrange(1, 5_000_000) for _ in range(200)]
    for candidate in [rng.randrange(1, 50_000_000) for _ in range(200)]:
        n = len(durations)
        mean = sum(durations) / n
        std = (sum((d - mean) ** 2 for d in durations) / (n - 1)) ** 0.5
        threshold = max(mean + 3 * std, 1.5 * mean)
        if abs(candidate - threshold) < 10:
            continue
        assert beyond(n, sum(durations), sum(d * d for d in durations), candidate) == (
            candidate > threshold)


def test_bulk_windows_equal_record_by_record_in_a_real_run(tmp_path: Path) -> None:
    """Two spawned rollout workers, a learner thread and the main thread (the long-run
    workload) with small windows; every flush of the main process's windows is compared.
    The windows are short enough for a fast run (the compiled Timing runs the workers' 40,000
    blocks each in well under a second) to span several scheduled windows and flushes, and
    the workers go on for a second at least (`min_s`), resting between blocks past their
    40,000th (`rest_s`): the flushes happen while the run does, not only as it ends, and a
    loaded machine's flusher is not given a run's worth of records at once (a run at full
    speed for half a second gave two flushes of ~150,000 records beside another copy)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.windows_shadow", str(report), "sf", str(tmp_path / "run"),
         "n=40000", "workers=2", "min_s=1.0", "rest_s=0.002", "window=0.04", "sample_every=3",
         "flush_interval=0.05"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["windowers"] == 1 and result["flushes"] >= 3
    assert result["bulk_records"] >= 80_000  # both workers' records went through the bulk path
    assert result["mismatches"] == []
    (stats, _reference), = result["stats"]
    assert stats["exported"] and stats["sampled_out"]
    (kept, _reference_kept), = result["kept"]
    assert len(kept) >= 2
    # Nothing lost (the ledger says so in timers.json only when something was), and the tree
    # rebuilt from the spans file is timers.json.
    tree = json.loads((tmp_path / "run" / "timers.json").read_text())
    assert tree["children"] and LEDGER_KEY not in tree.get("metadata", {})
    rc, rebuilt, err = tree_cli(str(tmp_path / "run" / "spans.otlp.jsonl"))
    assert rc == 0, err
    assert rebuilt is not None
    assert_same_tree(rebuilt, tree)


@pytest.mark.parametrize("before", [18, 19, 20, 21])
@pytest.mark.parametrize("split", [None, 7])
def test_an_outlier_needs_twenty_durations_before_it_in_bulk_as_one_by_one(
        before: int, split: int | None) -> None:
    # `before` steps of 1 ms, then one of 50 ms and one more step, in window 1 (not
    # scheduled): kept as an outlier only once 20 durations came before the long one, whether
    # they came in one batch or two.
    kept = []
    for bulk in (True, False):
        w = windower(bulk, budget=10_000, every=10)
        records = []
        for i in range(before + 2):  # (and one step after it)
            start = T0 + SECOND + i * 2_000_000
            records.append((1000 + i, 0, "step", start,
                            start + (50_000_000 if i == before else 1_000_000), 1, 9, None))
        parts = [records] if split is None else [records[:split], records[split:]]
        for part in parts:
            w.process([relayed(Batch({semconv.PROCESS_PID: 5}, 0, part))], T0 + SECOND)
        w.process([], T0 + 10 * SECOND, final=True)
        kept.append(w.kept.get(1))
    assert kept[0] == kept[1] == ("outlier" if before >= 20 else None)


def test_a_block_continued_while_open_gets_no_second_continuation_when_its_record_comes() -> None:
    # Worker 5's block B starts in window 1 and is still open when window 2 (kept) closes: it
    # is continued there. A batch of the worker's other records comes next, then B's own
    # record: window 2 holds B's continuation once, in bulk as record by record.
    b_sid, pid = 1 << 41, 5
    b_start = T0 + 1_500_000_000
    results = []
    for bulk in (True, False):
        opened: list[OpenSpan] = []
        w = Windower(run_id="run-cont", t0_ns=T0, window_s=1.0, every=2,
                     budget=lambda: 1000, main=True, run_span=(0xABC, 0x123), lag_s=1.5,
                     own=Batch({semconv.PROCESS_PID: 1}, 0, []),
                     open_blocks=lambda opened=opened: list(opened))
        w.bulk = bulk

        def batch(*records: Any) -> Batch:
            return relayed(Batch({semconv.PROCESS_PID: pid}, 0, list(records), {9: "main"}))

        def step(i: int, at: int) -> Any:
            return (b_sid + 1 + i, b_sid, "step", at, at + 1_000_000, 9, 0xFEED, None)

        out = w.process([batch(step(0, T0 + 100_000_000))], T0 + 500_000_000)
        opened.append(OpenSpan(pid, b_sid, 0, "B", b_start, 9))
        out += w.process([batch(step(1, b_start + 10))], T0 + 5 * SECOND)  # closes window 2
        out += w.process([batch(step(2, T0 + 4_200_000_000))], T0 + 5_500_000_000)
        opened.clear()
        out += w.process([batch((b_sid, 0, "B", b_start, T0 + 5_600_000_000, 9, 0xFEED, None))],
                         T0 + 6 * SECOND)
        out += w.process([], T0 + 12 * SECOND, final=True)
        records = [r for b in out for r in b.records]
        in_two = [r for r in records if r[2] == "B" and r[TRACE_ID] == w.trace_id(2)]
        assert len(in_two) == 1 and in_two[0][EXTRA]["attrs"][semconv.CONTINUATION]
        results.append(records)
    assert results[0] == results[1]


@pytest.mark.parametrize("size", [50, 600])  # (many positions are taken column by column)
def test_relayed_records_are_made_on_first_need_and_equal_the_records_sent(size: int) -> None:
    rng = random.Random(5)
    records = [((1 << 63) + i, i, f"n{i % 3}", 10 * i - 7, 10 * i + 5, 7 + i % 2,
                (1 << 127) + 0xAB if i % 2 else 0xCD,
                {"attrs": {"i": i}} if i % 4 == 0 else None) for i in range(size)]
    sent = Batch({semconv.PROCESS_PID: 3}, 11, records, {7: "main"})
    for _ in range(3):
        rows = relayed(sent).records
        positions = rng.sample(range(size), size // 2)
        assert rows.take(positions) == [records[i] for i in positions]  # type: ignore[attr-defined]
        assert rows[-1] == records[-1] and rows[7] == records[7] and len(rows) == size
        assert not rows.made  # type: ignore[attr-defined]
        assert list(rows) == records and rows == records and rows[3:9] == records[3:9]
        assert rows.take(positions) == [records[i] for i in positions]  # type: ignore[attr-defined]
    with pytest.raises(IndexError):
        relayed(sent).records[size]


def test_a_frame_naming_a_block_name_it_does_not_have_is_refused_whole() -> None:
    frame = relay.encode_columns(Batch({}, 0, [(1, 0, "a", 1, 2, 3, 4, None)]))
    body = bytearray(frame[relay.FRAME_HEADER.size:])
    after = 8 * 3 + 4  # the columns after the name index: starts, ends, thread ids, traces
    assert relay.decode_columns(bytes(body)).records[0][2] == "a"
    body[-after - 4:-after] = (9).to_bytes(4, sys.byteorder)  # a name index past the names
    with pytest.raises(ValueError, match="index out of range"):
        relay.decode_columns(bytes(body))


def test_times_past_what_int64_arithmetic_holds_go_record_by_record() -> None:
    # A worker's clock offset plus its times past 2**63: no numpy wrap-around, the same
    # windows as record by record (which computes in Python integers).
    huge = (1 << 62) + 12345
    records = [(i + 1, 0, "step", huge + i * SECOND // 10, huge + i * SECOND // 10 + 500, 1, 9,
                None) for i in range(30)]
    outputs = []
    for bulk in (True, False):
        w = windower(bulk, budget=100, every=2, t0=2 * huge)
        out = w.process([relayed(Batch({semconv.PROCESS_PID: 5}, huge, records))],
                        2 * huge + 10 * SECOND, final=True)
        outputs.append(([b.records for b in out], w.kept, w.stats))
    assert outputs[0] == outputs[1]
    exported, kept, _stats = outputs[0]
    assert kept[0] == kept[2] == "schedule" and 1 not in kept
    assert sum(r[2] == "step" for batch in exported for r in batch) == 20  # windows 0 and 2


BLAS_CHILD = r"""
import os, sys, time
import numpy  # OpenBLAS starts its threads here; they spin a while after starting
from otel_rl._internal import semconv
from otel_rl._internal.otlp.records import Batch
from tests.test_windows_bulk import SECOND, T0, relayed, windower


def others() -> float:
    me, cpu = str(os.getpid()), 0
    for tid in os.listdir(f"/proc/{me}/task"):
        if tid != me:
            with open(f"/proc/{me}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += int(fields[11]) + int(fields[12])
    return cpu / os.sysconf("SC_CLK_TCK")


time.sleep(0.5)
before = others()
w = windower(True, 1000, 10)
sid = 1 << 40
for flush in range(6):  # a worker's flushes of 30,000 blocks of one name (one verdict group)
    start = T0 + flush * SECOND
    records = [(sid + i, 0, "step", start + i * 30_000, start + i * 30_000 + 20_000, 7, 0xFEED,
                None) for i in range(30_000)]
    sid += 30_000
    w.process([relayed(Batch({semconv.PROCESS_PID: 101}, 0, records, {7: "MainThread"}))],
              start + SECOND)
    time.sleep(0.05)
time.sleep(0.3)
print(others() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread CPU from /proc")
def test_the_outlier_statistics_wake_no_blas_threads() -> None:
    """The windows' outlier statistics over a large batch use no BLAS call: a BLAS dot product
    of over ~10,000 items wakes OpenBLAS's threads (numpy 2's spin ~40 ms of CPU each time on
    this machine), CPU the program pays for nothing. Measured as the CPU of every thread but
    the main one while a fresh interpreter places six 30,000-record batches (numpy's own
    start-up spin before)."""
    out = subprocess.run([sys.executable, "-c", BLAS_CHILD], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 0.05
