"""Block timings, gauges and training scalars as OTLP metrics, from the exporting process.

Nothing here runs on the hot path. Block durations come from the span records the recorder
already makes: the pipeline's flush thread hands every drained batch (this process's records
and its relaying workers', which arrive over the relay) to `Metrics.observe` before the `auto`
windows decide what to export, so the histograms count every block of every process while
spans are sampled. Exemplars are taken from what the windows *did* export (ids re-mapped into
a kept window's trace), so each one resolves to a span the trace backend holds.

Gauges (`set_gauge`) and the training scalars the zero-code hooks record (`record_scalar`:
TensorBoard's ``add_scalar``, ML-Agents' StatsReporter) travel from workers in their snapshot
frames. Everything is cumulative since the run started and exported every `metrics_interval`
by this one process (`metrics_export`), with its resource: no OTel SDK ``MeterProvider`` in any
process (the SDK's metrics break under fork), and a lost export costs resolution only.

Labels are bounded: block path (its path in its thread's tree, `metrics_paths`: at most
`MAX_PATHS`, then ``_other``) and name, role (the worker role, ``main`` for the run's own
process), gauge/scalar name and the scalar's category; never a step, pid or span id. The
per-worker seconds counter adds the worker index (bounded by the number of workers).

Under ``spans=off`` there are no records: the per-path runs and seconds counters come from the
aggregate trees (exact: every run is in its tree node), and there is no duration histogram
(a quantile needs each run's duration, which only a record has).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from otel_rl._internal import metrics_columns, metrics_paths, procstate, semconv
from otel_rl._internal.metrics_paths import PathResolver, PathTable
from otel_rl._internal.node import TreeNode
from otel_rl._internal.otlp.metrics import (
    Exemplar,
    ExponentialPoint,
    HistogramPoint,
    Metric,
    NumberPoint,
    encode_metrics,
)
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.record import END, EXTRA, SPAN_ID, START, TRACE_ID, OpenSpan, Record
from otel_rl._internal.shapes import Attributes
from otel_rl._internal.sinks.base import Stats

__all__ = ["BOUNDS", "Metrics", "record_scalar", "scalar_state"]

#: Bucket upper bounds in seconds: 1, 2.5 and 5 per decade from 1 µs to 500 s, then 1000 s, so
#: `histogram_quantile` interpolates within a factor of 2.5 for blocks of microseconds to
#: minutes (the SDK's default buckets are milliseconds-scale: every block would land in the
#: first one).
BOUNDS: tuple[float, ...] = (
    *(round(m * 10.0 ** e, 12) for e in range(-6, 3) for m in (1.0, 2.5, 5.0)), 1000.0)

#: Exponential mode's scale: buckets grow by 2**(1/8) (9 %), which Prometheus stores as a
#: native histogram (one series per stream instead of one per bucket).
SCALE = 3
BLOCK_DURATION = "otel_rl.block.duration"
BLOCK_SECONDS = "otel_rl.block.seconds"
BLOCK_RUNS = "otel_rl.block.runs"
GAUGE = "otel_rl.gauge"
SCALAR = "otel_rl.scalar"
SCALAR_STEP = "otel_rl.scalar.step"
ENV_STEPS = "otel_rl.env.steps"
DROPPED = "otel_rl.spans.dropped"
MAIN_ROLE = "main"

#: Record attributes that mark a span that is not a timed block's own run.
_NOT_BLOCKS = (semconv.KIND, semconv.CUT_SHORT, semconv.CONTINUATION, semconv.COMPONENT)


def _is_block(extra: Any) -> bool:
    if extra is None:
        return True
    attrs = extra.get("attrs")
    return not attrs or not any(key in attrs for key in _NOT_BLOCKS)


def _index(resource: Attributes) -> int:
    value = resource.get(semconv.WORKER_INDEX)
    return value if isinstance(value, int) else 0


class _Hist:
    """One (block path, role, worker index) stream: bucket counts, sum, min, max, and the slowest
    exported span seen since the last export (the exemplar)."""

    __slots__ = ("counts", "exemplar", "exp", "sum", "zero")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.sum = 0.0
        self.exemplar: Exemplar | None = None
        # Exponential mode: bucket index (at `SCALE`) -> count, and runs of zero duration.
        self.exp: dict[int, int] = {}
        self.zero = 0


def _exponential_counts(np: Any, codes: Any, durations: Any) -> dict[int, tuple[int, dict[int, int]]]:
    """Per name code: (runs of zero duration, {bucket index at `SCALE`: count}); bucket i
    holds durations in (2**(i / 2**SCALE), 2**((i + 1) / 2**SCALE)] seconds."""
    result: dict[int, tuple[int, dict[int, int]]] = {}
    positive = durations > 0
    zero_codes, zero_counts = np.unique(codes[~positive], return_counts=True)
    for code, count in zip(zero_codes.tolist(), zero_counts.tolist(), strict=True):
        result[code] = (count, {})
    index = np.ceil(np.log2(durations[positive] * 1e-9) * (1 << SCALE)).astype(np.int64) - 1
    pairs = codes[positive] * 65536 + (index + 32768)
    keys, counts = np.unique(pairs, return_counts=True)
    for key, count in zip(keys.tolist(), counts.tolist(), strict=True):
        code, bucket = divmod(key, 65536)
        result.setdefault(code, (0, {}))[1][bucket - 32768] = count
    return result


def _slowest(np: Any, codes: Any, durations: Any) -> dict[int, int]:
    """{code: position of its longest duration (the last of equals)}, in linear time."""
    if not len(codes):
        return {}
    best = np.full(int(codes.max()) + 1, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(best, codes, durations)
    hits = np.flatnonzero(durations == best[codes])[::-1]  # the last of equals first
    found, first = np.unique(codes[hits], return_index=True)
    return dict(zip(found.tolist(), hits[first].tolist(), strict=True))


def _offer(hist: _Hist, record: Record, offset: int) -> None:
    """Make `record` the stream's exemplar if it is the slowest since the last export."""
    seconds = (record[END] - record[START]) * 1e-9
    best = hist.exemplar
    if best is None or seconds >= best.value:
        hist.exemplar = Exemplar(seconds, record[END] + offset, record[TRACE_ID],
                                 record[SPAN_ID])


#: Records waiting for their parent (`metrics_paths`) past this many count as top-level now.
_MAX_PENDING = 100_000
_BOUNDS_NS: Any = None


def _bounds_ns() -> Any:
    global _BOUNDS_NS
    if _BOUNDS_NS is None:
        import numpy as np

        _BOUNDS_NS = np.array([round(b * 1e9) for b in BOUNDS], np.int64)
    return _BOUNDS_NS


# --- training scalars, per process (set by the zero-code hooks) --------------------------------
_scalars: dict[tuple[str, str], list[Any]] = {}
_scalars_lock = threading.Lock()


def record_scalar(tag: str, value: float, step: int | None, category: str = "") -> None:
    """Remember the latest `value` of a training scalar (TensorBoard's tag, ML-Agents' key)
    and its `step`; exported as gauges, the largest step per category as the env-steps
    counter. Never raises (called from inside the program's own logging calls)."""
    try:
        number = float(value)
        if number != number:  # NaN: as set_gauge, ignored
            return
        at = int(step) if step is not None else None
        with _scalars_lock:
            entry = _scalars.get((category, tag))
            if entry is None:
                _scalars[(category, tag)] = [number, at, time.time_ns()]
            else:
                entry[0], entry[2] = number, time.time_ns()
                if at is not None:
                    entry[1] = at
    except Exception:
        pass


def scalar_state() -> list[list[Any]]:
    """This process's scalars as JSON-able rows ``[category, tag, value, step, time ns]``
    (what a relaying worker puts in its snapshot)."""
    with _scalars_lock:
        return [[c, t, v, s, ts] for (c, t), (v, s, ts) in _scalars.items()]


def reset_scalars() -> None:
    """Forget the scalars (a forked child's are its parent's; tests)."""
    global _scalars_lock
    _scalars_lock = threading.Lock()
    _scalars.clear()


class Metrics:
    """The exporting process's metrics: fed by the flush thread, encoded on demand."""

    def __init__(self, *, resource: Attributes, start_ns: int, stats: Stats,
                 gauges: Callable[[], Mapping[str, Mapping[str, Any]]],
                 scalars: Callable[[], Iterable[tuple[str, int, list[list[Any]]]]],
                 dropped: Callable[[], int] | None = None, exponential: bool = False,
                 open_blocks: Callable[[], Iterable[OpenSpan]] | None = None,
                 roots: Callable[[], Iterable[int]] | None = None,
                 trees: Callable[[], Iterable[tuple[str, int, TreeNode]]] | None = None,
                 local: Callable[[], Iterable[Any]] | None = None,
                 accelerated: bool = True) -> None:
        self.exponential = exponential
        # Prometheus names a stream's `instance` after service.instance.id: the run id, so
        # two runs of one service never collide and one run's processes share one instance.
        self.resource = dict(resource)
        instance = str(resource.get(semconv.RUN_ID, ""))
        if semconv.WORKER_ROLE in resource:
            # A worker exporting on its own (no relay): an instance of its own, so its series
            # never interleave with the main process's in one Prometheus series.
            instance += f"/{resource[semconv.WORKER_ROLE]}-{resource.get(semconv.WORKER_INDEX, 0)}"
        self.resource.setdefault("service.instance.id", instance)
        for key in (semconv.PROCESS_PID, semconv.WORKER_ROLE, semconv.WORKER_INDEX):
            self.resource.pop(key, None)  # per process: they are data point labels here
        self.role = str(resource.get(semconv.WORKER_ROLE) or MAIN_ROLE)
        self.start_ns = start_ns
        self.stats = stats
        self.gauges = gauges
        self.scalars = scalars
        self.dropped = dropped
        self.hists: dict[tuple[int, str, int], _Hist] = {}
        self._exemplar_ns: dict[tuple[int, str], int] = {}
        self.paths = PathTable(metrics_paths.MAX_PATHS, self._overflow)
        # The record fields as columns: compiled where built and `accelerated` (the
        # ``accelerator`` setting), else pure Python; the same values either way.
        self.reader = metrics_columns.reader(accelerated)
        self.resolver = PathResolver(self.paths, open_blocks, roots, self.reader)
        # For the exported records: a parent not among them makes a block top-level.
        self._exported_resolver = PathResolver(self.paths, reader=self.reader)
        self._pending: list[tuple[Batch, int]] = []
        # spans=off: (role, worker index, tree) of every stack, for per-path counters.
        self.trees = trees
        # This process's stacks' trees: its records of names with one path there need no
        # parent lookups (`metrics_paths.unique_paths`).
        self.local = local
        self._lock = threading.Lock()
        self.exports = 0
        self.last_bytes = 0

    # -- the flush thread ------------------------------------------------------------------
    def _overflow(self, cap: int) -> None:
        self.stats.warn_once("metrics-paths", f"more than {cap} distinct block paths: the "
                             f"runs of further ones are counted under path={metrics_paths.OTHER!r}")

    def observe(self, batches: Iterable[Batch], exemplars: bool, final: bool = False) -> None:
        """Count every timed block in `batches` under its path; with `exemplars`, these
        records are also what goes to the trace backend (no windows), so they may be
        exemplars. Records whose parent is not known yet wait for the next call (`final`:
        none waits). Vectorised (numpy) per batch: the flush thread competes with training
        for the GIL."""
        import numpy as np

        self.resolver.begin()
        waiting, self._pending = self._pending, []
        hurry = final or sum(len(b.records) for b, _ in waiting) > _MAX_PENDING
        # New batches first: a waiting record's parent may be among them.
        work = [(batch, 0) for batch in batches] + waiting
        by_name: dict[str, int] | None = None
        local, pid = self.local, os.getpid()
        if local is not None and not any(b.resource.get(semconv.PROCESS_PID) == pid
                                         for b, _ in waiting):
            by_name = {}  # made when a batch of this process comes
        for batch, rounds in work:
            if not batch.records:
                continue
            mine = None
            if (by_name is not None and local is not None and not rounds
                    and batch.resource.get(semconv.PROCESS_PID) == pid):
                if not by_name:
                    by_name = metrics_paths.unique_paths(local(), self.paths)
                mine = by_name
            self._observe(np, batch, exemplars, rounds,
                          hurry or rounds >= metrics_paths.ROUNDS, mine)

    def _observe(self, np: Any, batch: Batch, exemplars: bool, rounds: int,
                 last_chance: bool, by_name: dict[str, int] | None) -> None:
        bounds = _bounds_ns()
        width = len(BOUNDS) + 1
        records = batch.records
        role = str(batch.resource.get(semconv.WORKER_ROLE) or MAIN_ROLE)
        index = _index(batch.resource)
        pid = batch.resource.get(semconv.PROCESS_PID)
        # The record fields as numpy columns (`metrics_columns`: compiled, or one C-speed
        # pass per column; zip(*records) is 20x slower on large batches).
        n = len(records)
        columns = batch.columns
        named = None
        if columns is not None and len(columns.sids) == n:  # relayed or packed: no Python step
            extras = columns.extras
            durations = (np.frombuffer(columns.ends, np.int64)
                         - np.frombuffer(columns.starts, np.int64))
            if by_name is not None:  # (this process's packed records: codes by name too)
                named = metrics_paths.column_codes(np, columns, by_name)
        elif by_name is not None:  # names and durations in one pass where compiled
            columns = None
            named, durations, extras = self.reader.named(np, records, by_name)
        else:
            columns = None
            durations, extras = self.reader.durations(np, records)
        path_codes = self.resolver.resolve(np, pid if isinstance(pid, int) else 0, records,
                                           last_chance, extras, batch.thread_names, by_name,
                                           columns, named)
        keep = path_codes >= 0
        if not keep.all():
            late = np.flatnonzero(~keep).tolist()
            self._pending.append((Batch(batch.resource, batch.offset_ns,
                                        [records[i] for i in late], batch.thread_names),
                                  rounds + 1))
        if extras:
            keep[[i for i in extras if not _is_block(records[i][EXTRA])]] = False
        if keep.all():
            positions = None
        else:
            positions = np.flatnonzero(keep)
            path_codes, durations = path_codes[keep], durations[keep]
        if not len(path_codes):
            return
        # Path codes are small (at most MAX_PATHS + 2): bincount over all of them, no sort.
        codes = path_codes
        kinds = len(self.paths.paths)
        counts, totals, present = self.reader.histogram(np, codes, durations, bounds, kinds)
        exp = _exponential_counts(np, codes, durations) if self.exponential else {}
        slowest: dict[int, int] = {}
        if exemplars:
            for code, where in _slowest(np, codes, durations).items():
                slowest[code] = where if positions is None else int(positions[where])
        with self._lock:
            for k in present.tolist():
                row = counts[k * width:(k + 1) * width]
                key = (k, role, index)
                hist = self.hists.get(key)
                if hist is None:
                    hist = self.hists[key] = _Hist()
                hist.counts = [a + int(b) for a, b in zip(hist.counts, row, strict=True)]
                hist.sum += float(totals[k]) * 1e-9
                if self.exponential:
                    zero, by_index = exp.get(k, (0, {}))
                    hist.zero += zero
                    for i, c in by_index.items():
                        hist.exp[i] = hist.exp.get(i, 0) + c
                at = slowest.get(k)
                if at is not None:
                    _offer(hist, records[at], batch.offset_ns)

    def exported(self, batches: Iterable[Batch]) -> None:
        """Exemplars from the spans the windows exported (ids of a kept window): per batch,
        the slowest record of each path, its path found among the exported records (a kept
        window is closed under parents) the way `observe` finds it, vectorised."""
        import numpy as np

        resolver = self._exported_resolver
        pid = os.getpid()
        by_name = None
        for batch in batches:
            records = batch.records
            if not records:
                continue
            n = len(records)
            mine = batch.resource.get(semconv.PROCESS_PID) == pid and self.local is not None
            if mine and by_name is None and self.local is not None:
                by_name = metrics_paths.unique_paths(self.local(), self.paths)
            named = None
            if mine and by_name is not None:
                named, durations, extras = self.reader.named(np, records, by_name)
            else:
                durations, extras = self.reader.durations(np, records)
            resolver.begin()  # a window's ids are its own: nothing carries over
            codes = resolver.resolve(np, 0, records, True, extras, batch.thread_names,
                                     by_name if mine else None, named=named)
            positions = np.arange(n)
            if extras:
                keep = np.ones(n, bool)
                keep[[i for i in extras if not _is_block(records[i][EXTRA])]] = False
                codes, durations, positions = codes[keep], durations[keep], positions[keep]
            role = str(batch.resource.get(semconv.WORKER_ROLE) or MAIN_ROLE)
            index = _index(batch.resource)
            with self._lock:
                for code, at in _slowest(np, codes, durations).items():
                    hist = self.hists.get((code, role, index))
                    if hist is not None:
                        _offer(hist, records[int(positions[at])], batch.offset_ns)

    # -- export ----------------------------------------------------------------------------
    def collect(self, now_ns: int) -> list[Metric]:
        """Every metric's cumulative points now (exemplars are handed out once)."""
        start = self.start_ns
        merged: dict[tuple[int, str], HistogramPoint] = {}
        per_worker: list[NumberPoint] = []
        runs: list[NumberPoint] = []
        paths, leaves = self.paths.paths, self.paths.leaves
        with self._lock:
            items = list(self.hists.items())
            taken = []
            for (code, role, index), hist in items:
                attrs: Attributes = {"block": leaves[code], "path": paths[code], "role": role}
                point = merged.get((code, role))
                if point is None:
                    point = merged[(code, role)] = HistogramPoint(
                        attrs, BOUNDS, list(hist.counts), hist.sum, start, now_ns,
                        exemplars=[])
                else:
                    point.counts = [a + b for a, b in zip(point.counts, hist.counts, strict=True)]
                    point.sum += hist.sum
                if hist.exemplar is not None:
                    taken.append(((code, role), point, hist.exemplar))
                    hist.exemplar = None
                worker: Attributes = {**attrs, "worker": index}
                per_worker.append(NumberPoint(worker, hist.sum, now_ns, start))
                runs.append(NumberPoint(worker, sum(hist.counts), now_ns, start))
        if self.trees is not None:
            per_worker, runs = self._tree_points(now_ns)
        for key, point, exemplar in taken:
            # Exemplars of one series must come in time order (Prometheus refuses an older
            # one): a slow span that ended before the last one sent is not sent.
            if exemplar.time_ns <= self._exemplar_ns.get(key, 0):
                continue
            self._exemplar_ns[key] = exemplar.time_ns
            assert isinstance(point.exemplars, list)
            point.exemplars.append(exemplar)
        duration = Metric(BLOCK_DURATION, "histogram", list(merged.values()), "s",
                          "duration of each run of a timed block")
        if self.exponential:
            duration = Metric(BLOCK_DURATION, "exponential_histogram",
                              self._exponential_points(merged, items, now_ns), "s",
                              duration.description)
        metrics = [
            *([duration] if merged else []),
            Metric(BLOCK_SECONDS, "sum", per_worker, "s",
                   "total seconds in a timed block, per worker process"),
            Metric(BLOCK_RUNS, "sum", runs, "", "runs of a timed block, per worker process"),
        ]
        gauges = [NumberPoint({"name": name}, float(g["value"]), now_ns)
                  for name, g in self.gauges().items() if "value" in g]
        metrics.append(Metric(GAUGE, "gauge", gauges, "", "set_gauge values (latest)"))
        values: list[NumberPoint] = []
        steps: list[NumberPoint] = []
        env_steps: dict[tuple[str, str, int], int] = {}
        # One point per label set (two in one request would conflict), the latest value.
        latest: dict[tuple[str, str, str, int], list[Any]] = {}
        for role, process, rows in self.scalars():
            for row in rows:
                labels = (str(row[1]), str(row[0]), role, process)
                if labels not in latest or row[4] >= latest[labels][4]:
                    latest[labels] = row
        # Every point is stamped with this export's time, never the time the value was set:
        # Prometheus refuses a whole request holding a sample older than one it already has
        # for that series ("out of order sample"), and derives target_info from the oldest.
        for (tag, category, role, process), (_c, _t, value, step, _ts) in latest.items():
            attrs = {"name": tag, "category": category, "role": role, "worker": process}
            values.append(NumberPoint(attrs, float(value), now_ns))
            if step is not None:
                steps.append(NumberPoint(attrs, int(step), now_ns))
                stream = (category, role, process)
                env_steps[stream] = max(env_steps.get(stream, 0), int(step))
        metrics.append(Metric(SCALAR, "gauge", values, "",
                              "training scalars (TensorBoard add_scalar, ML-Agents stats)"))
        metrics.append(Metric(SCALAR_STEP, "gauge", steps, "", "the step of each scalar"))
        metrics.append(Metric(ENV_STEPS, "sum", [
            NumberPoint({"category": c, "role": r, "worker": w}, n, now_ns, start)
            for (c, r, w), n in env_steps.items()], "", "environment steps the framework reported "
            "(largest step of its scalars); rate() is the FPS"))
        if self.dropped is not None:
            metrics.append(Metric(DROPPED, "sum", [NumberPoint({}, int(self.dropped()), now_ns,
                                                               start)],
                                  "", "span records dropped (not in the histograms either)"))
        return metrics

    def _tree_points(self, now_ns: int) -> tuple[list[NumberPoint], list[NumberPoint]]:
        """spans=off: per-path seconds and runs of every stack's aggregate tree."""
        assert self.trees is not None
        totals: dict[tuple[str, int], dict[int, list[float]]] = {}
        for role, index, tree in self.trees():
            metrics_paths.tree_totals(tree, self.paths, totals.setdefault((role, index), {}))
        seconds, runs = [], []
        paths, leaves = self.paths.paths, self.paths.leaves
        for (role, index), by_path in totals.items():
            for code, (count, total) in by_path.items():
                attrs: Attributes = {"block": leaves[code], "path": paths[code], "role": role,
                                     "worker": index}
                seconds.append(NumberPoint(attrs, total, now_ns, self.start_ns))
                runs.append(NumberPoint(attrs, int(count), now_ns, self.start_ns))
        return seconds, runs

    def _exponential_points(self, merged: dict[tuple[int, str], HistogramPoint],
                            items: list[tuple[tuple[int, str, int], _Hist]],
                            now_ns: int) -> list[ExponentialPoint]:
        """The streams of `merged` as exponential points (same sums and exemplars)."""
        buckets: dict[tuple[int, str], dict[int, int]] = {}
        zeros: dict[tuple[int, str], int] = {}
        for (code, role, _index), hist in items:
            into = buckets.setdefault((code, role), {})
            for i, c in list(hist.exp.items()):
                into[i] = into.get(i, 0) + c
            zeros[(code, role)] = zeros.get((code, role), 0) + hist.zero
        points = []
        for key, point in merged.items():
            counts = buckets.get(key) or {}
            low = min(counts, default=0)
            high = max(counts, default=-1)
            points.append(ExponentialPoint(
                point.attributes, SCALE, low, [counts.get(i, 0) for i in range(low, high + 1)],
                zeros.get(key, 0), point.sum, point.start_ns, now_ns, point.exemplars))
        return points

    def encode(self, now_ns: int | None = None) -> bytes:
        """One ``ExportMetricsServiceRequest`` with everything now."""
        now = time.time_ns() if now_ns is None else now_ns
        return encode_metrics(self.resource, self.collect(now))

    def series(self) -> int:
        """How many Prometheus series the block metrics make now (buckets + +Inf, _sum,
        _count per histogram point; seconds and runs per worker)."""
        with self._lock:
            streams = {(code, role) for code, role, _ in self.hists}
            workers = len(self.hists)
        per_stream = 1 if self.exponential else len(BOUNDS) + 3
        return len(streams) * per_stream + 2 * workers


# The parent's values: a forked worker reports its own.
procstate.register("metrics", after_in_child=reset_scalars, for_tests=reset_scalars)
