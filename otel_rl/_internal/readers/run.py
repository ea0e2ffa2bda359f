"""Every trace of one run, from Jaeger or Tempo, by run id (``otel-rl tree --run-id``).

Trace ids are derived from the run id (`aggregates.derive_trace_id`), so no search is needed:
the run trace holds the run span and every process's aggregate spans (the exact tree); its
aggregates list the kept window traces, which are fetched too when `windows` is asked for (the
timeline) or when the run trace has no aggregates (data from an older otel_rl).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_rl._internal import semconv
from otel_rl._internal.aggregates import derive_trace_id
from otel_rl._internal.errors import UserError
from otel_rl._internal.readers._common import SpanList
from otel_rl._internal.spandata import SpanData

__all__ = ["fetch_run"]


def fetch_run(fetch: Callable[[str, str, float], Any], url: str, run_id: str, timeout: float,
              windows: bool = False) -> SpanList:
    """The spans of run `run_id`: its run trace, plus its window traces when `windows` is true
    or the run trace carries no aggregates. `fetch(url, trace_id, timeout)` is a backend's
    trace-by-id reader; a missing run trace is a `UserError`."""
    run_trace = f"{derive_trace_id(run_id, 'run'):032x}"
    try:
        spans = SpanList(list(fetch(url, run_trace, timeout)))
    except UserError as exc:
        if "not found" in str(exc):
            raise UserError(f"run {run_id!r} not found at {url} (no trace {run_trace})") from None
        raise
    aggregates = [s for s in spans if s.attributes.get(semconv.KIND) == semconv.KIND_AGGREGATE]
    if aggregates and not windows:
        return spans
    kept: set[int] = set()
    for span in aggregates:
        listed = span.attributes.get(semconv.WINDOWS)
        if isinstance(listed, list):
            kept.update(int(k) for k in listed if isinstance(k, int) or str(k).isdigit())
    if not aggregates:
        spans.notes.append(f"the run trace of {run_id!r} has no aggregate spans")
    for k in sorted(kept):
        try:
            spans.extend(_spans(fetch(url, f"{derive_trace_id(run_id, f'w{k}'):032x}", timeout)))
        except UserError:
            spans.notes.append(f"window {k} of run {run_id!r} is missing at {url}")
    return spans


def _spans(result: Any) -> list[SpanData]:
    return list(result)
