"""The metrics' compiled column reader (`_metricsacc.c`) against the pure one (issue 18): the
same columns from the same records, and whole `Metrics` fed the same batches by each give the
same histograms, counts, paths, exemplars and the same encoded request, byte for byte.

Workloads are random nests of blocks in two threads of this process (names at one path and at
several, so both the by-name and the by-parent placement run), a relaying worker's batches (as
tuples and as the typed columns they arrive in), records with extras (run, cut-short and
error spans) and batches cut anywhere, so children are drained before their open parents.
"""

from __future__ import annotations

import copy
import os
import random
from typing import Any

import numpy as np
import pytest

from otel_rl._internal import metrics as m
from otel_rl._internal import metrics_columns, relay, semconv
from otel_rl._internal.metrics_paths import PathTable
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.record import OpenSpan
from otel_rl._internal.recorder import TimerNode
from otel_rl._internal.sinks.base import Stats

COMPILED = metrics_columns.COMPILED
pytestmark = pytest.mark.skipif(
    COMPILED is None and not os.environ.get("CI"),
    reason="the compiled column reader is not built here (python scripts/build_accel.py)")

PID = os.getpid()
WORKER = {"process.pid": PID + 100_000, "otel_rl.worker.role": "rollout",
          "otel_rl.worker.index": 1}
MARKED = {semconv.KIND, semconv.CUT_SHORT}
RUN_SPAN, BASES = 1, {7: 2, 8: 3}
EXTRAS: list[Any] = [{}, {"attrs": {semconv.KIND: "run"}}, {"attrs": {semconv.CUT_SHORT: True}},
                     {"error": ["Boom", "at depth", ""]}, {"sampled": "kept"},
                     {"attrs": {"other": 1}}]


def nests(rng: random.Random, count: int, shared: float, first_sid: int = 10) -> list[Any]:
    """(record, start event, end event) of random nests in threads 7 and 8, in end order:
    names by depth, with probability `shared` the name ``x`` (at several paths)."""
    out: list[Any] = []
    sid, clock, event = first_sid, 1_000, 0

    def block(parent: int, depth: int, tid: int) -> None:
        nonlocal sid, clock, event
        me, sid = sid, sid + 1
        name = "x" if rng.random() < shared else f"d{depth}_{rng.randrange(3)}"
        start, begun = clock, event
        event += 1
        clock += rng.choice((0, 1, 50, 3_000, 250_000, 7_000_000_000))
        for _ in range(rng.randrange(4) if depth < 4 else 0):
            block(me, depth + 1, tid)
        clock += rng.randrange(2_000)
        extra = rng.choice(EXTRAS) if rng.random() < 0.05 else None
        out.append(((me, parent, name, start, clock, tid, 5, copy.deepcopy(extra)), begun, event))
        event += 1

    for _ in range(count):
        tid = rng.choice((7, 8))
        block(BASES[tid], 0, tid)
    return out


def cut(rng: random.Random, items: list[Any]) -> list[tuple[list[Any], list[OpenSpan]]]:
    """Batches of consecutive records, each with the blocks open when it was drained."""
    batches, at = [], 0
    while at < len(items):
        size = rng.choice((1, 2, 17, 300, 4_000))
        chunk = items[at:at + size]
        at += len(chunk)
        drained = chunk[-1][2]
        open_now = [OpenSpan(PID, r[0], r[1], r[2], r[3], r[5]) for r, begun, ended in items
                    if begun < drained < ended]
        batches.append(([r for r, _, _ in chunk], open_now))
    return batches


def local_tree(items: list[Any]) -> list[TimerNode]:
    """This process's stacks' trees: the nodes of every block of `items`."""
    by_sid = {r[0]: r for r, _, _ in items}
    trees = {tid: TimerNode("root") for tid in BASES}
    for record, _, _ in items:
        if record[7]:
            continue
        chain, at = [], record
        while at is not None:
            chain.append(at[2])
            at = by_sid.get(at[1])
        node = trees[record[5]]
        for name in reversed(chain):
            node = node.get_child(name)
    return list(trees.values())


def feed(accelerated: bool, seed: int, exponential: bool) -> m.Metrics:
    rng = random.Random(seed)
    mine = nests(rng, 60, shared=rng.choice((0.0, 0.1, 0.5)))
    theirs = nests(rng, 40, shared=0.2, first_sid=2**64 - 10_000)  # ids near the top
    trees = local_tree(mine)
    opened: list[OpenSpan] = []
    metrics = m.Metrics(resource={"otel_rl.run.id": "r", "service.name": "s"}, start_ns=1,
                        stats=Stats(), gauges=dict, scalars=list, exponential=exponential,
                        open_blocks=lambda: opened, roots=lambda: {RUN_SPAN, *BASES.values()},
                        local=lambda: trees, accelerated=accelerated)
    work = [(Batch({"process.pid": PID}, 17, records, {7: "MainThread", 8: "t"}), now)
            for records, now in cut(rng, mine)]
    for records, now in cut(rng, theirs):
        batch = Batch(WORKER, 23, records, {7: "MainThread"} if rng.random() < 0.5 else None)
        if rng.random() < 0.5:  # as a relayed batch arrives: typed columns
            frame = relay.encode_columns(batch)
            batch = relay.decode_columns(frame[relay.FRAME_HEADER.size:])
        work.append((batch, [OpenSpan(WORKER["process.pid"], *o[1:]) for o in now]))
    metrics.blocks = sum(  # type: ignore[attr-defined]
        not (r[7] or {}).get("attrs", {}).keys() & MARKED for r, _, _ in mine + theirs)
    rng.shuffle(work)  # the two processes' batches interleave
    for i, (batch, now) in enumerate(work):
        opened[:] = now
        metrics.observe([batch], exemplars=rng.random() < 0.3, final=i == len(work) - 1)
        if rng.random() < 0.4:  # what a window exported: a subset, its own ids
            metrics.exported([Batch(batch.resource, batch.offset_ns,
                                    [r for r in batch.records if rng.random() < 0.5],
                                    batch.thread_names)])
    return metrics


def state(metrics: m.Metrics) -> dict[str, Any]:
    paths = metrics.paths.paths
    def exemplar(e: Any) -> Any:
        return e and (e.value, e.time_ns, e.trace_id, e.span_id)

    return {(paths[code], role, index): (h.counts, h.sum, h.exp, h.zero, exemplar(h.exemplar))
            for (code, role, index), h in metrics.hists.items()}


@pytest.mark.parametrize("seed", range(12))
def test_metrics_fed_by_either_reader_are_the_same(seed: int) -> None:
    exponential = seed % 3 == 0
    fast, pure = feed(True, seed, exponential), feed(False, seed, exponential)
    assert fast.reader is COMPILED and pure.reader is metrics_columns.PURE
    assert state(fast) == state(pure)
    assert any(h.exemplar is not None for h in pure.hists.values())
    assert fast.paths.paths == pure.paths.paths  # made in the same order
    assert fast.resolver.unplaced == pure.resolver.unplaced
    assert fast.encode(10**18) == pure.encode(10**18)
    # Every block of both processes was counted, none of the marked spans.
    blocks = fast.blocks  # type: ignore[attr-defined]
    assert sum(sum(h.counts) for h in fast.hists.values()) == blocks > 100


@pytest.mark.parametrize("seed", range(20))
def test_each_column_is_the_pure_readers(seed: int) -> None:
    assert COMPILED is not None
    rng = random.Random(seed)
    records = [r for r, _, _ in nests(rng, 30, shared=0.3, first_sid=rng.choice((1, 2**63 - 5,
                                                                                2**64 - 10_000)))]
    if seed % 4 == 0:
        records = records[:rng.randrange(3)]  # empty and tiny batches too
    pure, fast = metrics_columns.PURE, COMPILED
    by_name = {"d0_0": 4, "d1_1": 9}

    class Missing(dict[str, int]):
        def __missing__(self, name: str) -> int:
            return -1

    def same(a: Any, b: Any) -> None:
        assert type(a) is type(b)
        if isinstance(a, tuple):
            for x, y in zip(a, b, strict=True):
                same(x, y)
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.tolist() == b.tolist()
        else:
            assert a == b

    same(fast.extras(records), pure.extras(records))
    same(fast.durations(np, records), pure.durations(np, records))
    same(fast.named(np, records, Missing(by_name)), pure.named(np, records, Missing(by_name)))
    same(fast.codes(np, records, Missing(by_name)), pure.codes(np, records, Missing(by_name)))
    same(fast.ids(np, records), pure.ids(np, records))
    same(fast.ids(np, records, False), pure.ids(np, records, False))
    # New names get ids in record order: the same table either way.
    tables = PathTable(), PathTable()
    same(fast.parents(np, records, tables[0].name_ids),
         pure.parents(np, records, tables[1].name_ids))
    assert tables[0].name_ids.names == tables[1].name_ids.names


@pytest.mark.parametrize("seed", range(10))
def test_the_compiled_histogram_is_numpys(seed: int) -> None:
    assert COMPILED is not None
    rng = random.Random(seed)
    bounds = m._bounds_ns()
    kinds = rng.randrange(1, 40)
    n = rng.choice((1, 7, 5_000))  # never empty: the metrics return before
    # Durations on, just above and below the bounds, 0, negative, huge.
    pool = [*bounds.tolist(), *(b + 1 for b in bounds.tolist()), *(b - 1 for b in bounds.tolist()),
            0, -5, 2**62, 999_999_999_999_999]
    durations = np.array([rng.choice(pool) if rng.random() < 0.5 else
                          int(rng.lognormvariate(9, 4)) for _ in range(n)], np.int64)
    codes = np.array([rng.randrange(kinds) for _ in range(n)], np.int64)
    fast = COMPILED.histogram(np, codes, durations, bounds, kinds)
    pure = metrics_columns.PURE.histogram(np, codes, durations, bounds, kinds)
    for a, b in zip(fast, pure, strict=True):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()  # float sums exactly equal
    assert int(fast[0].sum()) == n


@pytest.mark.parametrize("seed", range(20))
def test_the_compiled_settle_places_records_as_numpys(seed: int) -> None:
    """Random forests in a batch (records before their parents, some parents outside with
    codes known or not, some in another thread): the same codes, and `make` called for the
    same keys in the same order."""
    assert COMPILED is not None
    rng = random.Random(seed)
    n = rng.choice((1, 5, 200, 3_000))
    names = rng.randrange(1, 12)
    parent = np.zeros(n, np.int64)
    same = np.zeros(n, bool)
    parent_codes = np.full(n, -1, np.int64)
    for i in range(n):
        if i + 1 < n and rng.random() < 0.7:  # a parent later in the batch (it ended later)
            parent[i], same[i] = rng.randrange(i + 1, n), rng.random() < 0.9
            parent_codes[i] = 0 if not same[i] else -1  # another thread: top-level
        else:
            parent_codes[i] = rng.choice((-1, 0, 0, 3, 7))  # outside: unknown, root, known
    name_codes = np.array([rng.randrange(names) for _ in range(n)], np.int64)
    start = np.full(n, -1, np.int64)
    start[[i for i in range(n) if rng.random() < 0.1]] = 5  # a few have codes by name
    start[-1], parent_codes[-1] = -1, 0  # the outermost: top-level
    sub = np.arange(n) if rng.random() < 0.5 else np.flatnonzero(start < 0)
    results = []
    for reader in (COMPILED, metrics_columns.PURE):
        calls: list[int] = []

        def make(key: int, calls: list[int] = calls) -> int:
            calls.append(key)
            return 100 + len(calls)

        codes = start.copy()
        reader.settle(np, codes, sub, same[sub], parent[sub], parent_codes[sub],
                      name_codes[sub], names, make)
        results.append((codes.tolist(), calls))
    assert results[0] == results[1]
    assert results[0][1]  # something was placed


def test_the_compiled_reader_refuses_what_is_not_a_record() -> None:
    assert COMPILED is not None
    good = (1, 0, "a", 0, 5, 7, 5, None)
    with pytest.raises(TypeError, match="record 1 is not a span record"):
        COMPILED.durations(np, [good, (1, 2, 3)])
    with pytest.raises(KeyError):  # a plain dict has no __missing__: as names[name] raises
        COMPILED.named(np, [good], {"b": 1})
    for reader in (COMPILED, metrics_columns.PURE):  # ids are uint64: both refuse others
        for bad in (-1, 2**64):
            with pytest.raises(OverflowError):
                reader.ids(np, [(bad, *good[1:])])
    records = [good, (2, 0, "new", 0, 5, 7, 5, None), good]

    class Emptying(dict[str, int]):
        def __missing__(self, name: str) -> int:
            records.clear()  # Python code run in the middle of the pass: no crash
            return 3

    codes = np.zeros(3, np.int64)
    assert COMPILED._fill(records, Emptying(a=1), codes, None, None, None, None) == []
    assert codes.tolist() == [1, 3, 0]  # read up to the record whose name cleared the list
    with pytest.raises(ValueError, match="code 3 is out of range"):
        COMPILED.histogram(np, np.array([0, 3], np.int64), np.zeros(2, np.int64),
                           m._bounds_ns(), 3)
    one = np.zeros(1, np.int64)
    with pytest.raises(IndexError, match="out of range"):  # a parent outside the batch
        COMPILED.settle(np, np.full(1, -1, np.int64), one, np.ones(1, bool),
                        np.array([5], np.int64), one, one, 3, int)
    with pytest.raises(ValueError, match="8-byte items"):
        COMPILED._fill([good], None, None, np.empty(2, np.int64), None, None, None)


def test_the_accelerator_setting_picks_the_reader() -> None:
    def make(accelerated: bool) -> m.Metrics:
        return m.Metrics(resource={}, start_ns=1, stats=Stats(), gauges=dict, scalars=list,
                         accelerated=accelerated)

    assert make(False).reader is metrics_columns.PURE
    assert make(True).reader is COMPILED
    assert make(True).resolver.reader is COMPILED
    assert metrics_columns.reader(False) is metrics_columns.PURE
