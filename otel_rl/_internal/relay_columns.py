"""A batch's span records as the typed columns a relaying worker sends: compiled or pure Python.

A worker pays this step for every record it relays to the parent (issue 19: about 0.5 µs per
record in pure Python, most of it the ``zip(*records)`` transpose and an ``array`` per column).
The compiled writer (``_relaycols.columns``, built beside the compiled hot path) writes all
seven columns in one pass. Both give the same bytes, number names and trace ids in the same
order (first appearance) and find the same records with an extra
(`tests/test_relay_columns.py`); where the compiled one declines a batch (a record that is not
an 8-tuple of the usual types, a value out of its column's range) the pure one runs, and
raises what it always raised.

`use(compiled)` picks one (the ``accelerator`` setting, as for the hot path).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Literal

from otel_rl._internal import accel
from otel_rl._internal.otlp import records as records_
from otel_rl._internal.otlp.rows import Rows
from otel_rl._internal.record import EXTRA

__all__ = ["CODES", "Columns", "Packed", "Packs", "compiled_module", "in_use", "pure", "split",
           "typed", "use", "write"]

#: (the seven columns as bytes, names in order of first appearance, trace ids likewise,
#: positions of the records with an extra that is not None)
Columns = tuple[bytes, list[Any], list[int], list[int]]
#: The seven columns' array codes, in the order they are laid out: span ids, parent ids, name
#: indexes, starts, ends, thread ids, trace indexes.
CODES: tuple[Literal["Q", "I", "q"], ...] = ("Q", "Q", "I", "q", "q", "Q", "I")
_SIZES = tuple(array(code).itemsize for code in CODES)
#: The columns that hold indexes into a batch's names and trace ids.
_NAME_COLUMN, _TRACE_COLUMN = 2, 6


def compiled_module() -> ModuleType | None:
    """``_relaycols``, or None where it was not built (or does not load)."""
    return accel.compiled("_relaycols")


def pure(records: Sequence[Any]) -> Columns:
    """The columns in pure Python: a transpose, then one C-speed step per column."""
    n = len(records)
    sids, psids, names, starts, ends, tids, traces, extras = zip(*records, strict=True)
    name_ix = {name: i for i, name in enumerate(dict.fromkeys(names))}
    trace_ix = {trace: i for i, trace in enumerate(dict.fromkeys(traces))}
    columns = (
        array("Q", sids), array("Q", psids),
        array("I", map(name_ix.__getitem__, names)),
        array("q", starts), array("q", ends), array("Q", tids),
        array("I", bytes(4 * n)) if len(trace_ix) == 1  # one trace: the usual batch
        else array("I", map(trace_ix.__getitem__, traces)),
    )
    positions = ([] if extras.count(None) == n
                 else [i for i, extra in enumerate(extras) if extra is not None])
    return (b"".join([c.tobytes() for c in columns]), list(name_ix), list(trace_ix),
            positions)


class _InUse:
    """The writer in use: the compiled one's `columns`, or None for the pure one (set by
    `use`; this module's only state, the same in a forked child)."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: Any = None


_compiled = compiled_module()
_in_use = _InUse()


def use(compiled: bool) -> bool:
    """Write columns with the compiled writer when `compiled` and it is built, else in pure
    Python; whether the compiled one is in use."""
    _in_use.columns = _compiled.columns if compiled and _compiled is not None else None
    return _in_use.columns is not None


def in_use() -> bool:
    """Whether the compiled writer is in use."""
    return _in_use.columns is not None


def write(records: Sequence[Any]) -> Columns:
    """The columns of `records` (non-empty), by the writer in use."""
    columns = _in_use.columns
    if columns is not None:
        made: Columns | None = columns(records)
        if made is not None:
            return made
    return pure(records)


def typed(records: Sequence[Any]) -> records_.Columns:
    """`records` (non-empty) as the typed columns a relayed batch arrives with, read in place
    from `write`'s bytes: what the `auto` windows' bulk path takes (`windows_bulk`), for a
    process's own records too. Raises what `pure` raises on records it cannot lay out."""
    raw, names, _traces, positions = write(records)
    columns = [part.cast(code) for part, code in zip(split(raw, len(records)), CODES,
                                                      strict=True)]
    sids, psids, name_idx, starts, ends, tids, _traces_idx = columns
    return records_.Columns(sids, psids, name_idx, names, starts, ends, tids, positions)


def split(raw: bytes, n: int) -> list[memoryview]:
    """`write`'s bytes for `n` records, as its seven columns' bytes (views, in `CODES` order)."""
    view, at, parts = memoryview(raw), 0, []
    for size in _SIZES:
        parts.append(view[at:at + n * size])
        at += n * size
    return parts


class Packed(Rows):
    """Records a relaying worker laid out in columns before its flush (`Packs.take`): the
    `Rows` of those columns (made into records only if someone asks, a sink of the worker's
    own after its parent died, say), and what `write` would give for them, so the relay
    sends `raw` as it is."""

    __slots__ = ("names", "positions", "raw", "traces")

    def __init__(self, raw: bytes, names: list[Any], traces: list[int], positions: list[int],
                 extras: list[Any]) -> None:
        columns = []
        for code, part in zip(CODES, split(raw, len(extras)), strict=True):
            column = array(code)
            column.frombytes(part)
            columns.append(column)
        sids, psids, name_idx, starts, ends, tids, trace_idx = columns
        super().__init__(records_.Columns(sids, psids, name_idx, names, starts, ends, tids,
                                          positions), trace_idx, traces, extras)
        self.raw = raw
        self.names = names
        self.traces = traces
        self.positions = positions


class Packs:
    """A relaying worker's records written into the relay's columns between two flushes, a
    few hundred milliseconds' worth at a time (`Pipeline.pack`), then sent as one frame.

    Held until the flush as tuples, a rollout worker's ~15,000 records a second kept every
    record alive for a whole flush interval: each tuple counted towards the interpreter's
    next garbage collection, so the worker's cyclic GC ran several times as often, promoted
    the program's young objects and started full collections that plain runs do not make
    (Sample Factory 2.1.1, 30,000 steps: one full collection more in each of the three busy
    workers, ~0.075 s each). Laid out as bytes every ~1,000 records, the tuples go back to
    CPython's free list before the GC counts them. The frame is the one `write` would give
    for all the flush's records at once: the same bytes, names, trace ids and positions (names
    and trace ids are numbered by first appearance across the parts, in order)."""

    __slots__ = ("_parts", "count")

    def __init__(self) -> None:
        self._parts: list[tuple[Columns, int, list[Any]]] = []
        #: Records held (written, not yet taken).
        self.count = 0

    def add(self, records: Sequence[Any]) -> None:
        """Lay out `records` (non-empty); raises what `write` raises (nothing is kept then)."""
        columns = write(records)
        self._parts.append((columns, len(records), [records[i][EXTRA] for i in columns[3]]))
        self.count += len(records)

    def take(self) -> Packed | None:
        """Everything held, as one `Packed` (None when empty); the packs are empty after."""
        parts, self._parts, self.count = self._parts, [], 0
        if not parts:
            return None
        name_ix: dict[Any, int] = {}
        trace_ix: dict[int, int] = {}
        laid: list[list[Any]] = [[] for _ in CODES]
        merged: list[int] = []
        extras: list[Any] = []
        base = 0
        for (raw, names, traces, positions), n, extra_values in parts:
            chunks: list[Any] = split(raw, n)
            for column, seen, index in ((_NAME_COLUMN, names, name_ix),
                                        (_TRACE_COLUMN, traces, trace_ix)):
                renumber = [index.setdefault(key, len(index)) for key in seen]
                if renumber != list(range(len(renumber))):
                    chunks[column] = array("I", map(renumber.__getitem__,
                                                    chunks[column].cast("I")))
            for into, chunk in zip(laid, chunks, strict=True):
                into.append(chunk)
            extras.extend([None] * n)
            for i, extra in zip(positions, extra_values, strict=True):
                merged.append(base + i)
                extras[base + i] = extra
            base += n
        return Packed(b"".join([chunk for column in laid for chunk in column]), list(name_ix),
                      list(trace_ix), merged, extras)


use(accel.wanted())
