"""The metrics' optional compiled column reader (`_metricsacc.c`); see
`otel_rl._internal.metrics_columns`."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

def fill(records: Sequence[Any], names: Mapping[str, int] | None, codes: Any, durations: Any,
         sids: Any, psids: Any, tids: Any, /) -> list[int]:
    """Fill the columns given (writable buffers of len(records) int64/uint64 items, or None)
    from `records`: codes = names[name], durations = end - start, span, parent and thread
    ids. Returns the positions of the records whose extra is truthy."""

def histogram(codes: Any, durations: Any, bounds: Any, counts: Any, totals: Any, runs: Any,
              /) -> None:
    """Add each duration (int64) to its code's (int64, each in range(len(runs))) row of
    `counts` (int64, len(bounds) + 1 buckets per code: bucket i holds durations in
    (bounds[i-1], bounds[i]]), its value to totals[code] (float64, in record order) and 1 to
    runs[code]."""

def settle(codes: Any, sub: Any, same: Any, parent: Any, parent_codes: Any, name_codes: Any,
           width: int, make: Callable[[int], int], /) -> None:
    """`metrics_columns.Reader.settle` in one pass per nesting level (see there)."""
