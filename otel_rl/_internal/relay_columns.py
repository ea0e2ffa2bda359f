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

__all__ = ["CODES", "Columns", "compiled_module", "in_use", "pure", "typed", "use", "write"]

#: (the seven columns as bytes, names in order of first appearance, trace ids likewise,
#: positions of the records with an extra that is not None)
Columns = tuple[bytes, list[Any], list[int], list[int]]
#: The seven columns' array codes, in the order they are laid out: span ids, parent ids, name
#: indexes, starts, ends, thread ids, trace indexes.
CODES: tuple[Literal["Q", "I", "q"], ...] = ("Q", "Q", "I", "q", "q", "Q", "I")


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
    n = len(records)
    view = memoryview(raw)
    at = 0
    columns = []
    for code in CODES:
        size = n * array(code).itemsize
        columns.append(view[at:at + size].cast(code))
        at += size
    sids, psids, name_idx, starts, ends, tids, _traces_idx = columns
    return records_.Columns(sids, psids, name_idx, names, starts, ends, tids, positions)


use(accel.wanted())
