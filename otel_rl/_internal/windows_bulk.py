"""The `auto` windows' work on a batch, in bulk on its typed columns.

A relaying worker's records arrive as columns (`otlp.records.Columns`); nearly all of them fall
in an open window that is not kept by schedule, whose ring holds them until the window is
decided and then, unless an outlier kept it, forgets them. Record by record that cost the main
process about 1 µs per worker record (`Windower._take`), the largest per-block cost of the whole
process tree in the real Sample Factory run. Here the same decisions are made per batch
(a process's own drained batches are given the same columns first, `with_columns`: the real
ML-Agents run's main process records most of its blocks itself):

- every record's window index, from the start/end columns (numpy);
- the outlier statistics (per block name: count, sum, sum of squares, exact integers; each
  name's totals one reduction per batch) and each record's verdict, from prefix sums over the
  records of each name that has a block as long as `outlier_min`, in arrival order;
- runs of plain records (no pass-through kind, in one open window, ending in it, no outlier)
  go to their windows as a whole: a ring keeps positions into the batch (`_Window.add_chunk`)
  and makes items only if the window is kept; a scheduled (or outlier) window takes the ones
  its cut and outlier slice admit, in runs up to each trim (which may move the cut);
- every other record (late, long, an outlier, a run/process/aggregate span) goes through the
  same steps as `Windower._take`, with its verdict already known.

The result is the same windows, spans, ids and counts as `Windower._take` on the same batches
(`tests/test_windows_bulk.py` runs both and compares).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import Any

from otel_rl._internal import relay_columns, semconv
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.otlp.rows import Rows
from otel_rl._internal.record import EXTRA, SPAN_ID, Record

_PASS_KINDS = frozenset((semconv.KIND_RUN, semconv.KIND_PROCESS, semconv.KIND_AGGREGATE))
#: Past this, time arithmetic (time + clock offset - run start) could wrap in int64: such
#: batches take the record-by-record path.
_SAFE = (1 << 63) - 1


def beyond(n: int, total: int, squares: int, duration: int) -> bool:
    """Whether `duration` is an outlier after `n` durations summing to `total` (their squares
    to `squares`): longer than mean + 3 sample standard deviations and than 1.5 x mean, in
    exact integer arithmetic, so a whole batch's verdicts come out the same computed one by
    one or from prefix sums (`BulkWindows._verdicts`)."""
    x = n * duration - total  # n x (duration - mean)
    return (x > 0 and 2 * n * duration > 3 * total
            and x * x * (n - 1) > 9 * n * (n * squares - total * total))


#: A batch of a process's own records (drained, not relayed: no columns) this long or longer is
#: given its columns and placed in bulk too (shorter ones cost numpy's per-call overhead more
#: than they save).
OWN_BULK = 64


def with_columns(batch: Batch) -> Batch:
    """`batch` of a process's own records with its typed columns (`relay_columns.typed`,
    compiled where built), so the windows place it in bulk as a relayed batch; `batch` itself
    where its records cannot be laid out in columns (they go record by record)."""
    try:
        columns = relay_columns.typed(batch.records)
    except (TypeError, ValueError, OverflowError):
        return batch
    return Batch(batch.resource, batch.offset_ns, batch.records, batch.thread_names, columns)


def _pick(records: Sequence[Record], positions: Any) -> list[Record]:
    if isinstance(records, Rows):
        return records.take(positions.tolist())
    return list(map(records.__getitem__, positions.tolist()))


def _lazy(records: Sequence[Record], run: int) -> bool:
    """Whether a run of `run` of a batch's `records` waits in a window as positions (made only
    if it is kept): not a small part of the batch (a window does not hold a whole batch for a
    few of its records), not records made already."""
    return isinstance(records, Rows) and not records.made and 8 * run >= len(records)


def _chunk(window: Any, key: Any, records: Sequence[Record], idx: Any, s: Any, e: Any,
           lazy: bool) -> None:
    """Records `idx` of a batch into `window`: as positions (`lazy`) or as the records."""
    if lazy:
        window.add_chunk(key, records, idx, s, e)
    else:
        window.add_chunk(key, _pick(records, idx), None, s, e)


def _int64_sums(np: Any, d: Any) -> bool:
    """Whether durations `d` are all non-negative and their squares' sum (so every prefix sum of
    them or of their squares) is well inside int64."""
    floats = d.astype(np.float64)
    # (Not `floats @ floats` or einsum: a BLAS dot product of over ~10,000 items wakes
    # OpenBLAS's threads, which then spin on the program's cores for a while.)
    return int(d.min()) >= 0 and float((floats * floats).sum()) < 2.0 ** 61


def _outliers(np: Any, n0: int, total0: int, squares0: int, d: Any, sums: Any, squares: Any,
              floor: int, where: Any, out: Any) -> None:
    """Set `out[where[j]]` for each of one name's durations `d` (in arrival order, with their
    prefix sums and prefix sums of squares) that is an outlier by the `n0` durations before
    the batch (summing to `total0`, their squares to `squares0`) and those before it here."""
    for j in np.flatnonzero(d >= floor).tolist():
        if n0 + j < 20:
            continue
        dj = int(d[j])
        if beyond(n0 + j, total0 + int(sums[j]) - dj, squares0 + int(squares[j]) - dj * dj, dj):
            out[where[j]] = True


class BulkWindows:
    """`Windower`'s steps on relayed batches (a mixin: the windower is `self`)."""

    def take_columns(self: Any, key: Any, batch: Any) -> None:
        """`Windower._take(key, batch)` for a batch that has `columns`."""
        try:
            import numpy as np
        except ImportError:  # (a dependency; a broken install still gets its windows)
            self.bulk = False
            self._take(key, batch)
            return

        records = batch.records
        n = len(records)
        if not n:
            return
        columns = batch.columns
        raw_starts = np.frombuffer(columns.starts, np.int64)
        raw_ends = np.frombuffer(columns.ends, np.int64)
        offset = batch.offset_ns
        bound = _SAFE - abs(offset) - abs(self.t0)
        if not -bound < min(int(raw_starts.min()), int(raw_ends.min())) <= max(
                int(raw_starts.max()), int(raw_ends.max())) < bound:
            self._take(key, batch)  # times no clock gives: record by record, in Python ints
            return
        starts = raw_starts + offset
        ends = raw_ends + offset
        ks = np.maximum((starts - self.t0) // self.width, 0)
        es = np.maximum((ends - self.t0) // self.width, 0)

        passing = np.zeros(n, bool)
        for i in columns.extras:
            attrs = records[i][EXTRA].get("attrs")
            if attrs and attrs.get(semconv.KIND) in _PASS_KINDS:
                passing[i] = True
        late = ks < self.next_close
        kept_late = late & np.isin(ks, np.fromiter(self.kept, np.int64, len(self.kept)))
        outlier = np.zeros(n, bool)
        if self.main:
            self._verdicts(np, columns, ends - starts, ~passing & ~kept_late, outlier)
        # Late for a window that was not kept, and in no later one: only counted (never made).
        gone = late & ~kept_late & ~passing & (es <= ks)
        slow = (passing | late | (es > ks) | outlier) & ~gone
        plain = np.flatnonzero(~(slow | gone))
        self.stats["sampled_out"] += int(gone.sum())
        # Whether a window's plain records of this batch wait there as positions (`_lazy`):
        # by how many the window gets in all, whatever the runs they come in.
        placed = ks[plain]
        if len(placed) and int(placed.min()) == int(placed.max()):  # (most batches: one window)
            lazy = {int(placed[0]): _lazy(records, len(placed))}
        else:
            shares = np.unique(placed, return_counts=True)
            lazy = {k: _lazy(records, c)
                    for k, c in zip(*(a.tolist() for a in shares), strict=True)}

        done = 0
        at = np.flatnonzero(slow)
        for p, upto in zip(at.tolist(), np.searchsorted(plain, at).tolist(), strict=True):
            if upto > done:
                self._run(np, key, records, plain[done:upto], ks, starts, ends, lazy)
                done = upto
            self._one(key, records[p], int(starts[p]), int(ends[p]), int(ks[p]), int(es[p]),
                      bool(outlier[p]), bool(passing[p]))
        if done < len(plain):
            self._run(np, key, records, plain[done:], ks, starts, ends, lazy)
        waiting = [item for item in self._continued if item[0] == key] if self._continued else ()
        if waiting:
            sids = np.frombuffer(columns.sids, np.uint64)[~passing]
            ended = np.isin(np.array([item[1] for item in waiting], np.uint64), sids)
            for seen in compress(waiting, ended.tolist()):
                del self._continued[seen]

    def _verdicts(self: Any, np: Any, columns: Any, durations: Any, counted: Any,
                  out: Any) -> None:
        """Add the `counted` records' durations to the outlier statistics in arrival order,
        and set `out` where a record is an outlier by the statistics before it (as
        `Windower._outlier` does record by record)."""
        positions = np.flatnonzero(counted)
        if not len(positions):
            return
        codes = np.frombuffer(columns.name_idx, np.uint32)[positions]
        # (A stable sort of 16-bit keys is a radix sort: ~4x faster than of 32-bit ones.)
        order = np.argsort(codes.astype(np.uint16) if len(columns.names) <= 1 << 16 else codes,
                           kind="stable")
        codes = codes[order]
        where = positions[order]  # by name, in arrival order within a name
        d = durations[where]
        firsts = np.concatenate((np.zeros(1, np.intp), np.flatnonzero(np.diff(codes)) + 1))
        bounds = [*firsts.tolist(), len(d)]
        names = [columns.names[code] for code in codes[firsts].tolist()]
        if not _int64_sums(np, d):
            self._verdicts_exact(np, names, bounds, where, d, out)
            return
        # Every duration and every sum of them or of their squares fits in int64 (a duration
        # of 1 ns or more is at most its square): each name's totals are one reduction.
        squared = d * d
        sums = np.add.reduceat(d, firsts).tolist()
        squares = np.add.reduceat(squared, firsts).tolist()
        longest = np.maximum.reduceat(d, firsts).tolist()
        floor = self.outlier_min
        durations_of = self._durations
        for i, name in enumerate(names):
            state = durations_of.get(name)
            if state is None:
                state = durations_of[name] = [0, 0, 0]
            n0, total0, squares0 = state
            a, b = bounds[i], bounds[i + 1]
            if n0 + b - a > 20 and longest[i] >= floor:  # (a name with a long block in it)
                part = d[a:b]
                _outliers(np, n0, total0, squares0, part, np.cumsum(part),
                          np.cumsum(squared[a:b]), floor, where[a:b], out)
            state[0], state[1], state[2] = n0 + b - a, total0 + sums[i], squares0 + squares[i]

    def _verdicts_exact(self: Any, np: Any, names: list[str], bounds: list[int], where: Any,
                        d: Any, out: Any) -> None:
        """`_verdicts` for a batch whose sums could pass int64 (or with a negative duration):
        name by name, in Python integers where a name's needs them."""
        floor = self.outlier_min
        for i, name in enumerate(names):
            a, b = bounds[i], bounds[i + 1]
            part = d[a:b]
            state = self._durations.get(name)
            if state is None:
                state = self._durations[name] = [0, 0, 0]
            n0, total0, squares0 = state
            if not _int64_sums(np, part):
                part = part.astype(object)  # Python integers: exact past int64
            sums = np.cumsum(part)
            squares = np.cumsum(part * part)
            if n0 + b - a > 20:
                _outliers(np, n0, total0, squares0, part, sums, squares, floor, where[a:b], out)
            state[0], state[1], state[2] = (n0 + b - a, total0 + int(sums[-1]),
                                            squares0 + int(squares[-1]))

    def _run(self: Any, np: Any, key: Any, records: Any, plain: Any, ks: Any, starts: Any,
             ends: Any, lazy: dict[int, bool]) -> None:
        """Plain records at positions `plain`, in order (each in an open window, ending in it,
        no outlier); `lazy`: per window, whether they wait there as positions."""
        part = ks[plain]
        first = int(part[0])
        if bool((part == first).all()):
            groups = [(first, plain)]
        else:
            groups = [(int(k), plain[part == k]) for k in np.unique(part).tolist()]
        for k, idx in groups:
            window = self.window(k)
            s, e = starts[idx], ends[idx]
            if window.ring:  # (no cut, no outlier slice): all in
                last = window.records.maxlen or len(idx)  # earlier ones it would push out
                if len(idx) > last:
                    idx, s, e = idx[-last:], s[-last:], e[-last:]
                _chunk(window, key, records, idx, s, e, lazy[k])
                continue
            self._admit(np, window, key, records, idx, s, e, lazy[k])

    def _admit(self: Any, np: Any, window: Any, key: Any, records: Any, idx: Any, s: Any,
               e: Any, lazy: bool) -> None:
        """Into a list window (scheduled, or sliced by an outlier): what `Windower._take` would
        admit appending them one by one (trimming to the earliest starts each time it is full,
        which moves the cut), appended in runs up to the next trim."""
        if window.cut is not None and int(s.min()) >= window.cut:  # (all past the cut)
            self.stats["sampled_out"] += len(idx)
            return
        admitted = np.ones(len(idx), bool)
        if window.cut is not None:
            admitted &= s < window.cut
        if window.since is not None:
            admitted &= (s >= window.since) | (e >= window.since)
        idx, s, e = idx[admitted], s[admitted], e[admitted]
        dropped = len(admitted) - len(idx)
        cap = self._cap
        while len(idx):
            room = max(1, cap - window.held())
            _chunk(window, key, records, idx[:room], s[:room], e[:room], lazy)
            idx, s, e = idx[room:], s[room:], e[room:]
            if window.held() >= cap:
                self._trim(window)
                if window.cut is not None and len(idx):
                    admitted = s < window.cut
                    dropped += len(admitted) - int(admitted.sum())
                    idx, s, e = idx[admitted], s[admitted], e[admitted]
        self.stats["sampled_out"] += dropped

    def _one(self: Any, key: Any, record: Record, start: int, end: int, k: int, e: int,
             outlier: bool, passing: bool) -> None:
        """One record, as `Windower._take`'s loop takes it (its outlier verdict already known)."""
        if passing:
            self.sources[key].records.append(record)
            return
        if k >= self.next_close:
            window = self.window(k)
            if outlier and window.since is None and window.ring:
                window.keep_from(start, end - start)
            if window.admits(start, end):
                window.append(key, record, start, end)
                if window.held() >= self._cap and not window.ring:
                    self._trim(window)
            else:
                self.stats["sampled_out"] += 1
        elif k in self.kept:
            if self._late[k].admits(start, end):
                self._emit(key, k, record)
        else:
            self.stats["sampled_out"] += 1
        if e > k:
            self._long(key, record, k, e)
        if self._continued:
            self._continued.pop((key, record[SPAN_ID]), None)
