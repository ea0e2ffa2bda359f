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

Labels are bounded: block name, role (the worker role, ``main`` for the run's own process),
gauge/scalar name and the scalar's category; never a step, pid or span id. The per-worker
seconds counter adds the worker index (bounded by the number of workers).
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from otel_rl._internal import procstate, semconv
from otel_rl._internal.otlp.metrics import (
    Exemplar,
    ExponentialPoint,
    HistogramPoint,
    Metric,
    NumberPoint,
    encode_metrics,
)
from otel_rl._internal.otlp.records import Batch
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
    """One (block, role, worker index) stream: bucket counts, sum, min, max, and the slowest
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


def _offer(hist: _Hist, record: Any, offset: int) -> None:
    """Make `record` the stream's exemplar if it is the slowest since the last export."""
    seconds = (record[4] - record[3]) * 1e-9
    best = hist.exemplar
    if best is None or seconds >= best.value:
        hist.exemplar = Exemplar(seconds, record[4] + offset, record[6], record[0])


_NAME, _START, _END, _EXTRA = (operator.itemgetter(i) for i in (2, 3, 4, 7))
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
                 dropped: Callable[[], int] | None = None, exponential: bool = False) -> None:
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
        self.hists: dict[tuple[str, str, int], _Hist] = {}
        self._exemplar_ns: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.exports = 0
        self.last_bytes = 0

    # -- the flush thread ------------------------------------------------------------------
    def observe(self, batches: Iterable[Batch], exemplars: bool) -> None:
        """Count every timed block in `batches`; with `exemplars`, these records are also
        what goes to the trace backend (no windows), so they may be exemplars. Vectorised
        (numpy) per batch: the flush thread competes with training for the GIL."""
        import numpy as np

        bounds = _bounds_ns()
        width = len(BOUNDS) + 1
        for batch in batches:
            records = batch.records
            if not records:
                continue
            role = str(batch.resource.get(semconv.WORKER_ROLE) or MAIN_ROLE)
            index = _index(batch.resource)
            # Columns at C speed: map with itemgetter and a dict's own lookup (zip(*records)
            # is 20x slower on large batches).
            n = len(records)
            name_col = list(map(_NAME, records))
            names = {name: k for k, name in enumerate(set(name_col))}
            codes = np.fromiter(map(names.__getitem__, name_col), np.int64, n)
            durations = (np.fromiter(map(_END, records), np.int64, n)
                         - np.fromiter(map(_START, records), np.int64, n))
            skip = ([i for i, r in enumerate(records) if r[7] is not None and not _is_block(r[7])]
                    if any(map(_EXTRA, records)) else [])
            if skip:
                keep = np.ones(len(records), bool)
                keep[skip] = False
                codes, durations = codes[keep], durations[keep]
                positions = np.flatnonzero(keep)
            else:
                positions = None
            if not len(codes):
                continue
            buckets = np.searchsorted(bounds, durations, side="left")
            counts = np.bincount(codes * width + buckets, minlength=len(names) * width)
            totals = np.bincount(codes, weights=durations, minlength=len(names))
            exp = _exponential_counts(np, codes, durations) if self.exponential else {}
            slowest: dict[int, int] = {}
            if exemplars:
                order = np.lexsort((durations, codes))
                last = np.flatnonzero(np.diff(codes[order], append=-1) != 0)
                for at in order[last]:
                    slowest[int(codes[at])] = int(at if positions is None else positions[at])
            with self._lock:
                for name, k in names.items():
                    row = counts[k * width:(k + 1) * width]
                    if not row.any():
                        continue
                    key = (name, role, index)
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
        """Exemplars from the spans the windows exported (ids of a kept window)."""
        with self._lock:
            hists = self.hists
            for batch in batches:
                role = str(batch.resource.get(semconv.WORKER_ROLE) or MAIN_ROLE)
                index = _index(batch.resource)
                offset = batch.offset_ns
                for record in batch.records:
                    if not _is_block(record[7]):
                        continue
                    hist = hists.get((record[2], role, index))
                    if hist is not None:
                        _offer(hist, record, offset)

    # -- export ----------------------------------------------------------------------------
    def collect(self, now_ns: int) -> list[Metric]:
        """Every metric's cumulative points now (exemplars are handed out once)."""
        start = self.start_ns
        merged: dict[tuple[str, str], HistogramPoint] = {}
        per_worker: list[NumberPoint] = []
        runs: list[NumberPoint] = []
        with self._lock:
            items = list(self.hists.items())
            taken = []
            for (name, role, index), hist in items:
                attrs: Attributes = {"block": name, "role": role}
                point = merged.get((name, role))
                if point is None:
                    point = merged[(name, role)] = HistogramPoint(
                        attrs, BOUNDS, list(hist.counts), hist.sum, start, now_ns,
                        exemplars=[])
                else:
                    point.counts = [a + b for a, b in zip(point.counts, hist.counts, strict=True)]
                    point.sum += hist.sum
                if hist.exemplar is not None:
                    taken.append((point, hist.exemplar))
                    hist.exemplar = None
                worker: Attributes = {"block": name, "role": role, "worker": index}
                per_worker.append(NumberPoint(worker, hist.sum, now_ns, start))
                runs.append(NumberPoint(worker, sum(hist.counts), now_ns, start))
        for point, exemplar in taken:
            # Exemplars of one series must come in time order (Prometheus refuses an older
            # one): a slow span that ended before the last one sent is not sent.
            key = (str(point.attributes["block"]), str(point.attributes["role"]))
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
            duration,
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

    def _exponential_points(self, merged: dict[tuple[str, str], HistogramPoint],
                            items: list[tuple[tuple[str, str, int], _Hist]],
                            now_ns: int) -> list[ExponentialPoint]:
        """The streams of `merged` as exponential points (same sums and exemplars)."""
        buckets: dict[tuple[str, str], dict[int, int]] = {}
        zeros: dict[tuple[str, str], int] = {}
        for (name, role, _index), hist in items:
            into = buckets.setdefault((name, role), {})
            for i, c in list(hist.exp.items()):
                into[i] = into.get(i, 0) + c
            zeros[(name, role)] = zeros.get((name, role), 0) + hist.zero
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
            streams = {(name, role) for name, role, _ in self.hists}
            workers = len(self.hists)
        per_stream = 1 if self.exponential else len(BOUNDS) + 3
        return len(streams) * per_stream + 2 * workers


# The parent's values: a forked worker reports its own.
procstate.register("metrics", after_in_child=reset_scalars, for_tests=reset_scalars)
