"""The metrics' optional compiled column reader (`_metricsacc.c`); see
`otel_rl._internal.metrics_columns`."""

from collections.abc import Mapping, Sequence
from typing import Any

def fill(records: Sequence[Any], names: Mapping[str, int] | None, codes: Any, durations: Any,
         sids: Any, psids: Any, tids: Any, /) -> list[int]:
    """Fill the columns given (writable buffers of len(records) int64/uint64 items, or None)
    from `records`: codes = names[name], durations = end - start, span, parent and thread
    ids. Returns the positions of the records whose extra is truthy."""
