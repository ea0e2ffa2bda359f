"""A batch's span records as the numpy columns the metrics count: compiled or pure Python.

A record is a tuple, so its fields reach numpy only through a pass over the batch. The pure
reader makes one C-speed pass per column (``np.fromiter(map(itemgetter(i), records))``: name
→ code 46 ns, start and end 28 ns each, the look for extras 14 ns per record); the compiled
one (``_metricsacc.fill``, built beside the compiled hot path) fills every column asked for in
one pass. Both give the same values, look names up in the same order (so a `PathTable`'s name
ids and path codes are made in the same order), and find the same records with an extra. The
histogram step too: numpy's ``searchsorted`` and three ``bincount`` passes, or one compiled
pass (the same counts, and the same float sums: added in record order); and the placement of
records by their parents' codes (`settle`: numpy passes per nesting level, or one compiled
pass per level with a hash table; `make` called for the same keys in the same order).

`reader(compiled)` picks one: the compiled reader where it is built and the ``accelerator``
setting is on (`Metrics` is given the setting), else the pure one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from itertools import compress
from types import ModuleType
from typing import TYPE_CHECKING

from otel_rl._internal import accel
from otel_rl._internal.record import (
    END,
    EXTRA,
    NAME,
    PARENT_ID,
    SPAN_ID,
    START,
    THREAD_ID,
    Record,
)

if TYPE_CHECKING:  # numpy is imported when the metrics first count (`np` below is it)
    import numpy
    from numpy.typing import NDArray

    Int64s = NDArray[numpy.int64]
    UInt64s = NDArray[numpy.uint64]
    Floats = NDArray[numpy.float64]
    Bools = NDArray[numpy.bool_]

__all__ = ["COMPILED", "PURE", "Reader", "compiled_module", "reader"]

_SID, _PSID, _NAME, _START, _END, _TID, _EXTRA = (
    operator.itemgetter(i) for i in (SPAN_ID, PARENT_ID, NAME, START, END, THREAD_ID, EXTRA))


def compiled_module() -> ModuleType | None:
    """``_metricsacc``, or None where it was not built (or does not load)."""
    return accel.compiled("_metricsacc")


class Reader:
    """Reads columns of a batch's records (pure Python: one pass per column)."""

    compiled = False

    def extras(self, records: Sequence[Record]) -> list[int]:
        """Positions of the records that carry an extra (attributes, links: few), at C speed
        (an extra is a non-empty dict or None)."""
        if not any(map(_EXTRA, records)):  # the common case, at half the cost
            return []
        return list(compress(range(len(records)), map(_EXTRA, records)))

    def durations(self, np: ModuleType, records: Sequence[Record]) -> tuple[Int64s, list[int]]:
        """(end - start of each record as int64, `extras`)."""
        n = len(records)
        return (np.fromiter(map(_END, records), np.int64, n)
                - np.fromiter(map(_START, records), np.int64, n)), self.extras(records)

    def codes(self, np: ModuleType, records: Sequence[Record], names: dict[str, int]) -> Int64s:
        """names[name] of each record, as int64 (a dict subclass's ``__missing__`` gives
        the code of a name it lacks)."""
        codes: Int64s = np.fromiter(map(names.__getitem__, map(_NAME, records)), np.int64,
                                    len(records))
        return codes

    def named(self, np: ModuleType, records: Sequence[Record],
              names: dict[str, int]) -> tuple[Int64s, Int64s, list[int]]:
        """(`codes`, `durations`, `extras`)."""
        codes = self.codes(np, records, names)
        spans, extras = self.durations(np, records)
        return codes, spans, extras

    def ids(self, np: ModuleType, records: Sequence[Record],
            tids: bool = True) -> tuple[UInt64s, UInt64s | None]:
        """(span ids, thread ids or None) as uint64."""
        n = len(records)
        return (np.fromiter(map(_SID, records), np.uint64, n),
                np.fromiter(map(_TID, records), np.uint64, n) if tids else None)

    def parents(self, np: ModuleType, records: Sequence[Record],
                names: dict[str, int]) -> tuple[UInt64s, Int64s]:
        """(parent ids as uint64, `codes`)."""
        return (np.fromiter(map(_PSID, records), np.uint64, len(records)),
                self.codes(np, records, names))

    def histogram(self, np: ModuleType, codes: Int64s, durations: Int64s, bounds: Int64s,
                  kinds: int) -> tuple[Int64s, Floats, Int64s]:
        """(bucket counts: ``len(bounds) + 1`` per code, int64; the sum of each code's
        durations, float64; the codes present) of `durations` (int64) by `codes` (int64, each
        in ``range(kinds)``); bucket i holds durations in (bounds[i-1], bounds[i]]."""
        width = len(bounds) + 1
        buckets = np.searchsorted(bounds, durations, side="left")
        counts = np.bincount(codes * width + buckets, minlength=kinds * width)
        totals = np.bincount(codes, weights=durations, minlength=kinds)
        present = np.flatnonzero(np.bincount(codes, minlength=kinds))
        return counts, totals, present

    def settle(self, np: ModuleType, codes: Int64s, sub: Int64s, same: Bools, parent: Int64s,
               parent_codes: Int64s, name_codes: Int64s, width: int,
               make: Callable[[int], int]) -> None:
        """Give each record ``sub[j]`` that has no code (``codes < 0``) one once its parent's
        is known (``same[j]``: the batch's record ``parent[j]``, else ``parent_codes[j]``):
        ``make(parent code * width + name_codes[j])``, outermost first, one pass per nesting
        level; per level every parent is read before any code is written, and `make` is
        called once per distinct key, in ascending order (so paths get their codes in the same
        order on both readers)."""
        todo = np.flatnonzero(codes[sub] < 0)
        while len(todo):
            known = np.where(same[todo], codes[parent[todo]], parent_codes[todo])
            ready = known >= 0
            if not ready.any():
                return
            at = todo[ready]
            pairs = known[ready] * width + name_codes[at]
            codes[sub[at]] = _distinct_map(np, pairs, make)
            todo = todo[~ready]


def _distinct_map(np: ModuleType, keys: Int64s, make: Callable[[int], int]) -> Int64s:
    """`make` of each of `keys` (non-negative ints), called once per distinct key, in
    ascending order: through a table when the keys span a small range (no sort), else
    `np.unique`."""
    top = int(keys.max()) + 1
    if top <= 4 * len(keys) + 65_536:
        distinct = np.flatnonzero(np.bincount(keys, minlength=top))
        table = np.zeros(top, np.int64)
        table[distinct] = [make(k) for k in distinct.tolist()]
        found: Int64s = table[keys]
        return found
    distinct, back = np.unique(keys, return_inverse=True)
    made = np.array([make(k) for k in distinct.tolist()], np.int64)
    found = made[back.reshape(-1)]
    return found


class _Compiled(Reader):
    """The same columns from ``_metricsacc.fill``: one pass for all of them."""

    compiled = True

    def __init__(self, module: ModuleType) -> None:
        self._fill = module.fill
        self._histogram = module.histogram
        self._settle = module.settle

    def extras(self, records: Sequence[Record]) -> list[int]:
        result: list[int] = self._fill(records, None, None, None, None, None, None)
        return result

    def durations(self, np: ModuleType, records: Sequence[Record]) -> tuple[Int64s, list[int]]:
        spans: Int64s = np.empty(len(records), np.int64)
        return spans, self._fill(records, None, None, spans, None, None, None)

    def codes(self, np: ModuleType, records: Sequence[Record], names: dict[str, int]) -> Int64s:
        codes: Int64s = np.empty(len(records), np.int64)
        self._fill(records, names, codes, None, None, None, None)
        return codes

    def named(self, np: ModuleType, records: Sequence[Record],
              names: dict[str, int]) -> tuple[Int64s, Int64s, list[int]]:
        n = len(records)
        codes: Int64s = np.empty(n, np.int64)
        spans: Int64s = np.empty(n, np.int64)
        return codes, spans, self._fill(records, names, codes, spans, None, None, None)

    def ids(self, np: ModuleType, records: Sequence[Record],
            tids: bool = True) -> tuple[UInt64s, UInt64s | None]:
        n = len(records)
        sids: UInt64s = np.empty(n, np.uint64)
        threads: UInt64s | None = np.empty(n, np.uint64) if tids else None
        self._fill(records, None, None, None, sids, None, threads)
        return sids, threads

    def parents(self, np: ModuleType, records: Sequence[Record],
                names: dict[str, int]) -> tuple[UInt64s, Int64s]:
        n = len(records)
        psids: UInt64s = np.empty(n, np.uint64)
        codes: Int64s = np.empty(n, np.int64)
        self._fill(records, names, codes, None, None, psids, None)
        return psids, codes

    def settle(self, np: ModuleType, codes: Int64s, sub: Int64s, same: Bools, parent: Int64s,
               parent_codes: Int64s, name_codes: Int64s, width: int,
               make: Callable[[int], int]) -> None:
        i64 = np.int64
        self._settle(codes, np.ascontiguousarray(sub, i64),
                     np.ascontiguousarray(same, np.bool_).view(np.uint8),
                     np.ascontiguousarray(parent, i64), np.ascontiguousarray(parent_codes, i64),
                     np.ascontiguousarray(name_codes, i64), width, make)

    def histogram(self, np: ModuleType, codes: Int64s, durations: Int64s, bounds: Int64s,
                  kinds: int) -> tuple[Int64s, Floats, Int64s]:
        counts = np.zeros(kinds * (len(bounds) + 1), np.int64)
        totals, runs = np.zeros(kinds, np.float64), np.zeros(kinds, np.int64)
        self._histogram(codes, durations, bounds, counts, totals, runs)
        return counts, totals, np.flatnonzero(runs)


PURE = Reader()
_module = compiled_module()
#: The compiled reader, or None where ``_metricsacc`` is not built.
COMPILED: Reader | None = None if _module is None else _Compiled(_module)


def reader(compiled: bool = True) -> Reader:
    """The compiled reader when `compiled` and it is built, else the pure one."""
    return COMPILED if compiled and COMPILED is not None else PURE
