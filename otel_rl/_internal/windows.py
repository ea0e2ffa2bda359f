"""The `auto` policy, off the hot path: whole-run time windows kept on a schedule.

The recorder appends the same records under `auto` as under `all`; the pipeline passes every
drained batch through a `Windower`, which holds each open window's records until the window has
been closed for `lag` and then exports a kept window into its own trace (see docs/DESIGN.md,
"Long runs"). Ids are re-mapped per window (`remap`), so a child anywhere finds its parent's
span in the same window; blocks that started earlier and are open in a kept window appear there
as clipped continuation spans.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import compress, repeat
from time import perf_counter_ns
from typing import Any

from otel_rl._internal import semconv
from otel_rl._internal.aggregates import derive_trace_id
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.record import (
    END,
    EXTRA,
    NAME,
    SPAN_ID,
    START,
    STARTER_ENDED,
    OpenSpan,
    Record,
    make,
)
from otel_rl._internal.windows_bulk import OWN_BULK, BulkWindows, beyond, with_columns

_MASK64 = (1 << 64) - 1
_PASS_KINDS = frozenset((semconv.KIND_RUN, semconv.KIND_PROCESS, semconv.KIND_AGGREGATE))
_CONTINUATION = {semconv.CONTINUATION: True}
_NO_SOURCE = object()


def mix(k: int) -> int:
    """The per-window id mask (never 0): window `k`'s span ids are ``id ^ mix(k)``."""
    return ((k + 1) * 0x9E3779B97F4A7C15) & _MASK64 or 1


def remap(span_id: int, k: int) -> int:
    return (span_id ^ mix(k)) or 1


def scheduled(k: int, every: int) -> bool:
    """Kept by schedule: window 0 (start-up) and every `every`-th after it."""
    return k % every == 0


class _Window:
    """An open window's records. A scheduled window keeps its earliest starts. Any other
    keeps the latest arrivals (a ring) until an outlier ends in it; from then on it keeps the
    outlier, what contains its start (its ancestors) and what starts after it — the slice a
    kept outlier window shows, closed under parents.

    Held records are items, (source, record, start epoch ns, end epoch ns), in `records`, then
    the later arrivals in `chunks`, not made into records until the window is kept (`settled`):
    relayed batches' positions (`windows_bulk`) and, once there are chunks, every later arrival.
    A window that is not kept (most of them) never makes its records, which is what a long run's
    main process would otherwise spend its time and its garbage collections on."""

    __slots__ = ("chunks", "cut", "long", "outlier", "pending", "records", "since")

    def __init__(self, scheduled: bool, cap: int) -> None:
        self.records: Any = [] if scheduled else deque(maxlen=cap)
        # (source, records, positions, starts, ends), oldest first: `records` the batch's and
        # the `positions` in it, or (positions None) the records themselves; their times as
        # arrays; `pending` items in all (a ring's: never more than it keeps).
        self.chunks: list[tuple[Any, Any, Any, Any, Any]] = []
        self.pending = 0
        self.long: list[tuple[Any, Any]] = []  # records that started earlier and end here
        self.cut: int | None = None  # records starting at/after this epoch ns are out
        self.outlier = 0  # duration (ns) of the outlier this window keeps, if any
        self.since: int | None = None  # outlier window: its outlier's start (epoch ns)

    @property
    def ring(self) -> bool:
        return isinstance(self.records, deque)

    def admits(self, start: int, end: int) -> bool:
        if self.cut is not None and start >= self.cut:
            return False
        since = self.since
        return since is None or start >= since or end >= since

    def add_chunk(self, key: Any, records: Any, positions: Any, starts: Any,
                  ends: Any) -> None:
        """Arrivals from a relayed batch (or a process's own, in columns), their times as
        arrays, made into items only if the window is kept; chunks a ring would have pushed out
        entirely are forgotten."""
        self.chunks.append((key, records, positions, starts, ends))
        self.pending += len(starts)
        if self.ring:
            self._forget()

    def _forget(self) -> None:
        cap = self.records.maxlen
        while self.pending - len(self.chunks[0][3]) >= cap:
            self.pending -= len(self.chunks.pop(0)[3])

    def append(self, key: Any, record: Record, start: int, end: int) -> None:
        """One arrival: an item, or behind the chunks already waiting (arrivals one by one in
        a row, of one source, share a chunk, their times as lists)."""
        chunks = self.chunks
        if not chunks:
            self.records.append((key, record, start, end))
            return
        last = chunks[-1]
        if last[0] == key and isinstance(last[3], list):
            last[1].append(record)
            last[3].append(start)
            last[4].append(end)
            self.pending += 1
            if self.ring:
                self._forget()
        else:
            self.add_chunk(key, [record], None, [start], [end])

    def held(self) -> int:
        """How many records the window holds now (a ring: at most its length)."""
        if not self.ring:
            return len(self.records) + self.pending
        return int(min(self.records.maxlen, len(self.records) + self.pending))

    def _pushed_out(self) -> int:
        """A ring's pending arrivals that later ones push out anyway, after popping the items
        they push out (what appending them all one by one leaves)."""
        ring: deque[Any] = self.records
        skip = max(0, self.pending - (ring.maxlen or 0))
        for _ in range(len(ring) + self.pending - skip - (ring.maxlen or 0)):
            ring.popleft()
        return skip

    def settled(self) -> tuple[list[Any], ...]:
        """The records the window holds (it is kept), field by field: nine lists (each
        record's source, then its eight fields) in the order of their starts, arrival order on
        a tie (as sorting the items by start gives). Made from the chunks' columns (`Rows.
        fields`), not item by item: a kept window's records are then made once, as the records
        it exports (`Windower._decide`), where making items first made three tuples a
        record and, held together, several of the main process's garbage collections."""
        skip = self._pushed_out() if self.ring else 0
        items = self.records
        keys = [item[0] for item in items]
        starts = [item[2] for item in items]
        fields: list[list[Any]] = [list(column) for column in
                                     zip(*(item[1] for item in items), strict=True)]
        if not fields:
            fields = [[] for _ in range(8)]
        for key, records, positions, chunk_starts, _ends in _skipped(self.chunks, skip):
            if not len(chunk_starts):
                continue
            if positions is None:
                part: Any = zip(*records, strict=True)
            else:  # (positions only ever point into a relayed or packed batch's `Rows`)
                part = records.fields(positions.tolist())
            for column, values in zip(fields, part, strict=True):
                column.extend(values)
            keys.extend(repeat(key, len(chunk_starts)))
            starts.extend(_listed(chunk_starts))
        self.chunks = []
        self.pending = 0
        order = sorted(range(len(starts)), key=starts.__getitem__)
        return tuple(list(map(column.__getitem__, order)) for column in (keys, *fields))

    def _keep(self, chunks: list[tuple[Any, Any, Any, Any, Any]], keep: Callable[[Any, Any], Any],
              ) -> None:
        """`chunks` less what `keep(starts, ends)` (a boolean array) leaves out."""
        import numpy as np  # (chunks come from `windows_bulk`, which has it loaded)

        self.chunks, self.pending = [], 0
        for key, records, positions, starts, ends in chunks:
            if isinstance(starts, list):
                starts, ends = np.array(starts, np.int64), np.array(ends, np.int64)
            admitted = keep(starts, ends)
            if not admitted.all():
                if not admitted.any():
                    continue
                starts, ends = starts[admitted], ends[admitted]
                if positions is None:
                    records = list(compress(records, admitted.tolist()))
                else:
                    positions = positions[admitted]
            self.chunks.append((key, records, positions, starts, ends))
            self.pending += len(starts)

    def keep_from(self, start: int, duration: int) -> None:
        """An outlier that started at `start` (epoch ns): keep the slice from there on (the
        ring becomes a list; its chunks stay chunks, less what the slice leaves out)."""
        self.outlier, self.since = duration, start
        if self.chunks:
            chunks = list(_skipped(self.chunks, self._pushed_out()))
            self._keep(chunks, lambda s, e: (s >= start) | (e >= start))
        self.records = [item for item in self.records if self.admits(item[2], item[3])]

    def trim(self, limit: int) -> int:
        """A list window with chunks, full: keep its `limit` earliest starts (moving the cut,
        as `Windower._trim` does on items); how many it dropped."""
        held = self.held()
        if held <= limit:
            return 0
        import numpy as np

        made = np.fromiter((item[2] for item in self.records), np.int64, len(self.records))
        starts = np.concatenate([made, *(chunk[3] for chunk in self.chunks)])
        cut = int(np.partition(starts, limit)[limit])  # the earliest starts sorted: [limit]
        self.cut = cut if self.cut is None else min(self.cut, cut)
        cut = self.cut
        self.records = [item for item in self.records if item[2] < cut]
        self._keep(self.chunks, lambda s, _e: s < cut)
        return held - self.held()


def _starter_ended(extra: Any) -> Any:
    """`extra` marked: the block that started this span's thread or process ended before the
    window (the span hangs under the window span instead)."""
    if not extra:
        return STARTER_ENDED  # (one for all: not two dicts a span)
    return {**extra, "attrs": {**(extra.get("attrs") or {}), semconv.STARTER_ENDED: True}}


def _listed(times: Any) -> list[int]:
    """A chunk's times as a list (arrays from a batch's columns, or lists already)."""
    return times if isinstance(times, list) else times.tolist()  # type: ignore[no-any-return]


def _skipped(chunks: list[tuple[Any, Any, Any, Any, Any]],
             skip: int) -> Iterator[tuple[Any, Any, Any, Any, Any]]:
    """`chunks` less their first `skip` items."""
    for key, records, positions, starts, ends in chunks:
        if skip >= len(starts):
            skip -= len(starts)
            continue
        if skip:
            starts, ends = starts[skip:], ends[skip:]
            if positions is None:
                records = records[skip:]
            else:
                positions = positions[skip:]
            skip = 0
        yield key, records, positions, starts, ends


class _Source:
    __slots__ = ("offset", "records", "resource", "thread_names")

    def __init__(self, resource: Any, offset: int, thread_names: Any) -> None:
        self.resource = resource
        self.offset = offset
        self.thread_names = thread_names
        self.records: list[Any] = []


class Windower(BulkWindows):
    """Turns drained batches into the batches a windowed run exports (not thread-safe: the
    pipeline calls it under its flush lock)."""

    #: Relayed batches (typed columns), and the process's own once they are `OWN_BULK` records
    #: long (given columns), are placed per window in bulk (`windows_bulk`); False: record by
    #: record (the differential tests' reference).
    bulk = True

    def __init__(self, *, run_id: str, t0_ns: int, window_s: float, every: int,
                 budget: Callable[[], int], main: bool, run_span: tuple[int, int],
                 lag_s: float, own: Batch, outlier_min_s: float = 0.010,
                 open_blocks: Callable[[], list[OpenSpan]] | None = None,
                 window_attributes: Callable[[], dict[str, Any]] | None = None,
                 bases: Callable[[], dict[Any, set[int]]] | None = None) -> None:
        self.run_id = run_id
        self.t0 = t0_ns
        self.width = max(1, int(window_s * 1e9))
        self.every = max(1, every)
        self.budget = budget
        self.main = main
        self.run_trace, self.run_span = run_span
        self.lag = int(lag_s * 1e9)
        self.outlier_min = int(outlier_min_s * 1e9)
        self.open_blocks = open_blocks
        self.window_attributes = window_attributes
        self.bases = bases
        self._bases: dict[Any, set[int]] = {}
        # Span ids (re-mapped) in the most recent kept windows, for late records' parents.
        self._present: dict[int, set[int]] = {}
        self.windows: dict[int, _Window] = {}
        self.next_close = 0  # windows below this are decided
        self.kept: dict[int, str] = {}  # decided and kept: index -> "schedule" | "outlier"
        self.sources: dict[Any, _Source] = {}
        self.own_key = self._source(own)
        self._late: dict[int, _Window] = {}  # kept windows: what a late record must meet
        self._cap = 0
        self.stats: dict[str, int] = {"windows": 0, "exported": 0, "continuations": 0,
                                      "sampled_out": 0}
        self._traces: dict[int, int] = {}
        self._durations: dict[str, list[int]] = {}  # per name: count, sum, sum of squares
        self._room = 1.0
        self._last_outlier = 0
        # (source, span id) -> windows it already has a continuation in (blocks seen open)
        self._continued: dict[tuple[Any, int], set[int]] = {}

    # -- helpers ---------------------------------------------------------------------------
    def trace_id(self, k: int) -> int:
        tid = self._traces.get(k)
        if tid is None:
            tid = self._traces[k] = derive_trace_id(self.run_id, f"w{k}")
        return tid

    def _index(self, epoch_ns: int) -> int:
        return max(0, (epoch_ns - self.t0) // self.width)

    def _limit(self) -> int:
        budget = self.budget()
        # Room for the window span and the continuations of the blocks open through it.
        return max(1, budget - min(64, budget // 4))

    def _source(self, batch: Batch) -> Any:
        key = batch.resource.get(semconv.PROCESS_PID)
        source = self.sources.get(key)
        if source is None:
            source = self.sources[key] = _Source(batch.resource, batch.offset_ns,
                                                  batch.thread_names)
        else:
            source.resource, source.offset = batch.resource, batch.offset_ns
            source.thread_names = batch.thread_names
        return key

    def _parent(self, key: Any, k: int, psid: int) -> tuple[int, bool]:
        """`psid` re-mapped for window `k`; the window span instead when `psid` is the block
        that started this thread or process and it has ended before the window (a worker
        outlives the block that started it): (parent id, re-parented)."""
        if not psid:
            return 0, False
        parent = remap(psid, k)
        present = self._present.get(k)
        if (present is not None and parent not in present
                and psid in self._bases.get(key, ())):
            return remap(self.run_span, k), True
        return parent, False

    def _emit(self, key: Any, k: int, record: Record) -> None:
        sid, psid, name, start, end, tid, _trace, extra = record
        parent, moved = self._parent(key, k, psid)
        if moved:
            extra = _starter_ended(extra)
        present = self._present.get(k)
        if present is not None:
            present.add(remap(sid, k))
        self.sources[key].records.append(
            make(remap(sid, k), parent, name, start, end, tid, self.trace_id(k), extra))
        self.stats["exported"] += 1

    def _emit_held(self, k: int, held: tuple[list[Any], ...], present: set[int]) -> None:
        """`_emit` for each record a kept window holds (`_Window.settled`'s columns), in one
        loop: their re-mapped ids are in `present` already."""
        keys, sids, psids, names, starts, ends, tids, _traces, extras = held
        mask = mix(k)
        trace = self.trace_id(k)
        window_span = remap(self.run_span, k)
        bases = self._bases
        sources = self.sources
        out_key: Any = _NO_SOURCE  # (a source's key may be None: a batch without a pid)
        out: list[Record] = []
        for key, sid, psid, name, start, end, tid, extra in zip(
                keys, sids, psids, names, starts, ends, tids, extras, strict=True):
            parent = ((psid ^ mask) or 1) if psid else 0
            if psid and parent not in present and psid in bases.get(key, ()):
                parent, extra = window_span, _starter_ended(extra)  # (as `_parent` says)
            if key != out_key:
                out_key, out = key, sources[key].records
            out.append(make((sid ^ mask) or 1, parent, name, start, end, tid, trace, extra))
        self.stats["exported"] += len(sids)

    def _continue(self, key: Any, k: int, sid: int, psid: int, name: str, start: int, end: int,
                  tid: int, still_open: bool = False) -> None:
        """A continuation of block `sid` in kept window `k`, clipped to the window. One made
        for a block still open is remembered, so its record's arrival does not repeat it."""
        if still_open:
            seen = self._continued.setdefault((key, sid), set())
            if k in seen:
                return
            seen.add(k)
        elif self._continued:
            known = self._continued.get((key, sid))
            if known is not None and k in known:
                return
        offset = self.sources[key].offset
        lo = self.t0 + k * self.width - offset
        hi = lo + self.width
        parent, _moved = self._parent(key, k, psid)
        present = self._present.get(k)
        if present is not None:
            present.add(remap(sid, k))
        self.sources[key].records.append(
            make(remap(sid, k), parent, name, max(start, lo), min(end, hi),
                 tid, self.trace_id(k), {"attrs": _CONTINUATION}))
        self.stats["continuations"] += 1

    def _outlier(self, name: str, duration: int) -> bool:
        state = self._durations.get(name)
        if state is None:
            state = self._durations[name] = [0, 0, 0]  # count, sum, sum of squares
        n, total, squares = state
        verdict = n >= 20 and duration >= self.outlier_min and beyond(n, total, squares,
                                                                     duration)
        state[0], state[1], state[2] = n + 1, total + duration, squares + duration * duration
        return verdict

    def window(self, k: int) -> _Window:
        """Open window `k`, made on first need."""
        window = self.windows.get(k)
        if window is None:
            window = self.windows[k] = _Window(scheduled(k, self.every), self._cap)
        return window

    # -- the flush step ----------------------------------------------------------------------
    def process_now(self, batches: list[Batch], final: bool) -> list[Batch]:
        """`process` at this moment (the pipeline's transform hook)."""
        return self.process(batches, perf_counter_ns() + self.sources[self.own_key].offset, final)

    def process(self, batches: Sequence[Batch], now_ns: int, final: bool = False) -> list[Batch]:
        """Take drained batches; return what to export now. `now_ns` is Unix epoch ns."""
        self._cap = 2 * self._limit()
        for batch in batches:
            key = self._source(batch)
            if self.bulk and batch.columns is None and len(batch.records) >= OWN_BULK:
                batch = with_columns(batch)  # this process's own records: in bulk too
            columns = batch.columns
            # (This process's own small batches, packed with their columns or not, go record
            # by record as before: numpy is then not loaded for a few records, as at exit.)
            if (self.bulk and columns is not None and len(columns.sids) == len(batch.records)
                    and (len(batch.records) >= OWN_BULK or key != self.own_key)):
                self.take_columns(key, batch)
            else:
                self._take(key, batch)
        self._close(now_ns, final)
        out = []
        for source in self.sources.values():
            if source.records:
                out.append(Batch(source.resource, source.offset, source.records,
                                 source.thread_names))
                source.records = []
        return out

    def _take(self, key: Any, batch: Batch) -> None:
        offset = batch.offset_ns
        out = self.sources[key].records
        windows = self.windows
        outliers = self.main
        cap = self._cap
        t0, width = self.t0, self.width  # `_index`, inlined: this loop runs per record
        for record in batch.records:
            extra = record[EXTRA]
            if extra is not None:
                attrs = extra.get("attrs")
                if attrs and attrs.get(semconv.KIND) in _PASS_KINDS:
                    out.append(record)
                    continue
            start = record[START] + offset
            end = record[END] + offset
            k = (start - t0) // width
            if k < 0:
                k = 0
            e = (end - t0) // width
            if e < 0:
                e = 0
            if k >= self.next_close:
                window = windows.get(k)
                if window is None:
                    window = windows[k] = _Window(scheduled(k, self.every), cap)
                if (outliers and self._outlier(record[NAME], end - start) and window.since is None
                        and window.ring):
                    window.keep_from(start, end - start)
                if window.admits(start, end):
                    window.append(key, record, start, end)
                    if window.held() >= cap and not window.ring:
                        self._trim(window)  # a ring drops its oldest by itself
                else:
                    self.stats["sampled_out"] += 1
            elif k in self.kept:
                if self._late[k].admits(start, end):
                    self._emit(key, k, record)
            else:
                if outliers:
                    self._outlier(record[NAME], end - start)
                self.stats["sampled_out"] += 1
            if e > k:
                self._long(key, record, k, e)
            if self._continued:
                self._continued.pop((key, record[SPAN_ID]), None)

    def _long(self, key: Any, record: Record, k: int, e: int) -> None:
        sid, psid, name, start, end, tid, _trace, _extra = record
        for j in range(k + 1, e + 1):
            if j >= self.next_close:
                window = self.windows.get(j)
                if window is None:
                    window = self.windows[j] = _Window(scheduled(j, self.every), self._cap)
                window.long.append((key, record))
            elif j in self.kept:
                self._continue(key, j, sid, psid, name, start, end, tid)

    def _trim(self, window: _Window) -> None:
        limit = self._limit()
        if window.chunks:
            self.stats["sampled_out"] += window.trim(limit)
            return
        records = sorted(window.records, key=lambda item: item[2])
        if len(records) > limit:
            cut = records[limit][2]
            window.cut = cut if window.cut is None else min(window.cut, cut)
            kept = [item for item in records if item[2] < window.cut]
            self.stats["sampled_out"] += len(records) - len(kept)
            records = kept
        window.records = records

    def _close(self, now_ns: int, final: bool) -> None:
        last = self._index(now_ns) if final else self._index(now_ns - self.lag) - 1
        if final:
            for k in self.windows:
                last = max(last, k)
        while self.next_close <= last:
            k = self.next_close
            self.next_close = k + 1
            window = self.windows.pop(k, None) or _Window(True, 0)
            self._decide(k, window, now_ns, final and k == last)

    def _decide(self, k: int, window: _Window, now_ns: int, current: bool) -> None:
        self._room = min(1.0, self._room + 1.0 / self.every)
        verdict = None
        if scheduled(k, self.every):
            verdict = "schedule"
        elif window.outlier and (self._room >= 1.0 or window.outlier >= 2 * self._last_outlier):
            verdict = "outlier"
            self._room = max(0.0, self._room - 1.0)
            self._last_outlier = window.outlier
        if verdict is None:
            self.stats["sampled_out"] += window.held()
            return
        if window.chunks:
            self._trim(window)  # (before its records are made: only what it keeps is)
        self.kept[k] = verdict
        self.stats["windows"] += 1
        self._trim(window)
        held = window.settled()
        late = self._late[k] = _Window(True, 0)
        late.cut, late.since = window.cut, window.since
        lo = self.t0 + k * self.width
        hi = min(lo + self.width, now_ns) if current else lo + self.width
        opened = []
        if self.open_blocks is not None:
            for block in self.open_blocks():  # a block's source key is its pid
                source = self.sources.get(block.pid)
                if source is None or block.start_ns + source.offset >= lo:
                    continue  # the block's own span will come to this window when it ends
                opened.append((block, hi - source.offset))
        # Every span this window will hold, so that a block whose starter has ended (and is
        # in no window) hangs under the window span instead of a missing parent.
        mask = mix(k)
        present = {remap(self.run_span, k)}
        present.update([(sid ^ mask) or 1 for sid in held[1]])
        present.update(remap(record[SPAN_ID], k) for _key, record in window.long)
        present.update(remap(block.span_id, k) for block, _end in opened)
        self._present[k] = present
        for old in [j for j in self._present if j < k - 3]:
            del self._present[old]
        if self.bases is not None:
            self._bases = self.bases()
        self._emit_held(k, held, present)
        for key, record in window.long:
            sid, psid, name, start, end, tid, _trace, _extra = record
            self._continue(key, k, sid, psid, name, start, end, tid)
        for block, end in opened:
            self._continue(block.pid, k, block.span_id, block.parent_id, block.name,
                           block.start_ns, end, block.thread_id, True)
        if self.main:
            key = self.own_key
            offset = self.sources[key].offset
            attrs: dict[str, Any] = {semconv.KIND: semconv.KIND_WINDOW,
                                     semconv.WINDOW_INDEX: k, semconv.WINDOW_KEPT: verdict,
                                     semconv.RUN_ID: self.run_id}
            if window.cut is not None:
                attrs[semconv.WINDOW_CUT_NS] = window.cut
            if window.since is not None:
                attrs[semconv.WINDOW_SINCE_NS] = window.since
            if self.window_attributes is not None:
                attrs.update(self.window_attributes())
            self.sources[key].records.append(
                make(remap(self.run_span, k), 0, f"window {k}", lo - offset, hi - offset, 0,
                     self.trace_id(k), {"attrs": attrs, "link": (self.run_trace, self.run_span)}))
