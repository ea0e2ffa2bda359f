"""A relayed batch's records, made from its columns only when someone needs them.

Under `auto` the main process's windows place a worker's records by their columns
(`windows_bulk`) and keep most of them only as positions until their window is decided; most
are then dropped without ever being a record tuple. Whoever needs the records (a sink under
`all`, a kept window, the metrics) gets them as before: iterating makes them all once (the
same tuples the relay's decoder made before), indexing or `take` makes just those asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from otel_rl._internal.otlp.records import Columns
from otel_rl._internal.record import Extra, Record

__all__ = ["Rows"]


class Rows(Sequence[Record]):
    """Records as `Columns` plus their trace ids (indexes into `traces`) and extras."""

    __slots__ = ("_columns", "_extras", "_list", "_trace_idx", "_traces")

    def __init__(self, columns: Columns, trace_idx: Any, traces: list[int],
                 extras: list[Extra | None]) -> None:
        self._columns = columns
        self._trace_idx = trace_idx
        self._traces = traces
        self._extras = extras
        self._list: list[Record] | None = None

    @property
    def columns(self) -> Columns:
        """The records' columns (what a batch of them carries as `Batch.columns`)."""
        return self._columns

    @property
    def made(self) -> bool:
        """Whether every record has been made (then holding them costs their tuples)."""
        return self._list is not None

    def _all(self) -> list[Record]:
        records = self._list
        if records is None:
            c, traces = self._columns, self._traces
            names = c.names
            records = self._list = list(zip(
                c.sids, c.psids, [names[i] for i in c.name_idx], c.starts, c.ends, c.tids,
                [traces[i] for i in self._trace_idx], self._extras, strict=True))
        return records

    def take(self, positions: list[int]) -> list[Record]:
        """The records at `positions` (each made once more if not all made yet)."""
        if self._list is not None:
            return list(map(self._list.__getitem__, positions))
        return list(zip(*self.fields(positions), strict=True))

    def fields(self, positions: list[int]) -> list[list[Any]]:
        """The records at `positions` field by field: eight lists (span ids, parent ids,
        names, starts, ends, thread ids, trace ids, extras), no record made (a kept window
        makes its own records from them: `windows._Window.settled`)."""
        if self._list is not None:
            made = list(map(self._list.__getitem__, positions))
            if not made:
                return [[] for _ in range(8)]
            return list(map(list, zip(*made, strict=True)))
        c, traces, extras = self._columns, self._traces, self._extras
        names = c.names
        if len(positions) >= 256:  # column by column (the windows' caller has numpy loaded)
            import numpy as np

            index = np.array(positions, np.intp)
            sids, psids, starts, ends, tids = (
                np.frombuffer(column, np.dtype(column.typecode))[index].tolist()
                for column in (c.sids, c.psids, c.starts, c.ends, c.tids))
            return [sids, psids,
                    [names[i] for i in np.frombuffer(c.name_idx, np.uint32)[index].tolist()],
                    starts, ends, tids,
                    [traces[i] for i in np.frombuffer(self._trace_idx, np.uint32)[index].tolist()],
                    [extras[i] for i in positions]]
        at = positions.__iter__
        return [list(map(c.sids.__getitem__, at())), list(map(c.psids.__getitem__, at())),
                list(map(names.__getitem__, map(c.name_idx.__getitem__, at()))),
                list(map(c.starts.__getitem__, at())), list(map(c.ends.__getitem__, at())),
                list(map(c.tids.__getitem__, at())),
                list(map(traces.__getitem__, map(self._trace_idx.__getitem__, at()))),
                list(map(extras.__getitem__, at()))]

    def __len__(self) -> int:
        return len(self._extras)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._all())

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | Sequence[Record]:
        if self._list is not None or isinstance(index, slice):
            return self._all()[index]
        return self.take([range(len(self._extras))[index]])[0]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows):
            other = other._all()
        return self._all() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Rows({len(self)} records)"
