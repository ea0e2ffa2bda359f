"""Sending the run's metrics (`metrics.Metrics`) and wiring them into a run.

`attach` hooks the exporting process's pipeline: its transform (every drained batch is counted
before the `auto` windows sample; the windows' output gives the exemplars) and its after-flush
step, where `MetricsExporter` sends one ``ExportMetricsServiceRequest`` every
`metrics_interval` and at the final flush. `endpoint_of` reads the metrics endpoint from the
settings (the per-signal ``OTEL_EXPORTER_OTLP_METRICS_*`` ones first, else the span ones).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otel_rl._internal.metrics import MAIN_ROLE, Metrics, scalar_state
from otel_rl._internal.node import TreeNode
from otel_rl._internal.otlp.records import Batch

__all__ = ["MetricsExporter", "attach", "endpoint_of"]


class MetricsExporter:
    """Sends `Metrics` every `interval` seconds (and at the end) over an `OtlpTransport`.

    It runs in the flush thread, so it must never hold spans up: one attempt per export,
    bounded by the request timeout and the flush's deadline (no retries: the state is
    cumulative, the next export carries the totals), and after a failure the next ones are
    skipped for a while (doubling, at most 5 minutes), so a dead endpoint costs at most one
    timeout per pause. Failures are said once; skipped intervals only cost resolution.
    """

    MAX_PAUSE_S = 300.0

    def __init__(self, metrics: Metrics, transport_factory: Callable[[], Any], interval: float,
                 where: str) -> None:
        from otel_rl._internal.otlp.delivery import Delivery

        self.metrics = metrics
        self.interval = interval
        self.where = where
        self._last = time.monotonic()
        self._pause = 0.0
        self._paused_until = 0.0
        self.failed = 0
        self._delivery = Delivery(transport_factory, where=where, max_attempts=1)

    def maybe_export(self, deadline: float, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (now - self._last < self.interval or now < self._paused_until):
            return
        self._last = now
        data = self.metrics.encode()
        self.metrics.last_bytes = len(data)
        outcome = self._delivery.send(_Request(data), deadline)
        if outcome.ok:
            self.metrics.exports += 1
            self._pause = 0.0
            return
        self.failed += 1
        self._pause = min(self.MAX_PAUSE_S, max(self.interval, 2 * self._pause))
        self._paused_until = time.monotonic() + self._pause
        self.metrics.stats.warn_once(
            f"metrics-{self.where}", f"metrics export to {self.where} failed "
            f"({outcome.error or outcome.reason}); the next export carries the totals")

    def shutdown(self) -> None:
        self._delivery.close()


class _Request:
    """A metrics request for `Delivery`: never split (it is one interval's cumulative state)."""

    __slots__ = ("data", "spans")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.spans = 1

    def halves(self) -> list[Any]:
        return []


def endpoint_of(settings: Any) -> tuple[str | None, bool, str]:
    """(endpoint, used as is, protocol) for metrics, from the settings: the metrics endpoint
    if set; else the span endpoint (a base gets /v1/metrics; a traces-specific URL ending in
    /v1/traces gets it swapped; another full traces URL gives none)."""
    protocol = settings.metrics_protocol or settings.protocol
    if settings.metrics_endpoint:
        return settings.metrics_endpoint, True, protocol
    endpoint = settings.endpoint
    if not endpoint:
        return None, False, protocol
    if settings.traces_endpoint_is_full and protocol == "http/protobuf":
        base = endpoint.split("?", 1)[0].rstrip("/")
        if not base.endswith("/v1/traces"):
            return None, False, protocol
        return base[: -len("/v1/traces")] + "/v1/metrics", True, protocol
    return endpoint, False, protocol


def _transport_factory(settings: Any, endpoint: str, full: bool,
                       protocol: str) -> Callable[[], Any]:
    def make() -> Any:
        from otel_rl._internal.otlp.transport import OtlpTransport

        compression = settings.metrics_compression or settings.compression
        return OtlpTransport(
            endpoint=endpoint, protocol=protocol,  # type: ignore[arg-type]
            headers=settings.headers if settings.metrics_headers is None
            else settings.metrics_headers,
            compression=None if compression == "none" else "gzip",
            timeout_s=settings.metrics_timeout or settings.timeout, insecure=settings.insecure,
            certificate_file=settings.certificate, client_key_file=settings.client_key,
            client_certificate_file=settings.client_certificate,
            traces_endpoint_is_full=full, signal="metrics")

    return make


def attach(rt: Any) -> MetricsExporter | None:
    """Export `rt`'s metrics (the runtime of a process that exports: the main process, or a
    worker without a reachable relay), when the settings want them: hooks the pipeline's
    transform (every drained batch is observed; the windows' output gives exemplars) and its
    after-flush step (the export, every `metrics_interval` and at the final flush)."""
    from otel_rl._internal import contribute, recorder, wholerun

    s = rt.settings
    endpoint, full, protocol = endpoint_of(s)
    if endpoint is None:
        if s.metrics:
            rt.stats.warn_once("metrics-endpoint", "metrics are on but no metrics endpoint is "
                               "known (set metrics_endpoint / OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)")
        return None

    def gauges() -> dict[str, Any]:
        result = contribute.stack_gauges(recorder.all_stacks())
        for snap in rt.relayed_snapshots():
            for name, gauge in (snap.get("gauges") or {}).items():
                wholerun.merge_gauge(result, name, gauge)
        return result

    def scalars() -> list[tuple[str, int, list[list[Any]]]]:
        """(role, worker index, rows) of this process and each relaying worker."""
        result = [(str(rt.role or MAIN_ROLE), int(rt.index or 0), scalar_state())]
        for snap in rt.relayed_snapshots():
            rows = snap.get("scalars")
            index = snap.get("index")
            if isinstance(rows, list):
                result.append((str(snap.get("role") or "worker"),
                               index if isinstance(index, int) else 0,
                               [r for r in rows if isinstance(r, list) and len(r) == 5
                                and isinstance(r[4], int)]))
        return result

    def roots() -> set[int]:
        """Span ids top-level blocks hang under: the run span, each thread's base."""
        result = {int(getattr(rt, "run_span_id", 0) or 0)}
        for ids in rt.bases().values():
            result.update(ids)
        return result

    def trees() -> list[tuple[str, int, TreeNode]]:
        """spans=off: (role, worker index, tree) of every stack of this process and of each
        relaying worker (its last snapshot)."""
        role, index = str(rt.role or MAIN_ROLE), int(rt.index or 0)
        result: list[tuple[str, int, TreeNode]] = [
            (role, index, recorder.stack_contribution(st)) for st in recorder.all_stacks()]
        for snap in rt.relayed_snapshots():
            at = snap.get("index")
            for contribution in snap.get("contributions") or ():
                result.append((str(snap.get("role") or "worker"),
                               at if isinstance(at, int) else 0, contribution.get("tree")))
        return result

    metrics = Metrics(resource=rt.resource, start_ns=rt.offset_ns + rt.start_ns,
                      stats=rt.stats, gauges=gauges, scalars=scalars,
                      dropped=rt.dropped_total,
                      exponential=s.metrics_histogram == "exponential",
                      open_blocks=rt.open_blocks, roots=roots,
                      local=lambda: [recorder.stack_contribution(st)
                                     for st in recorder.all_stacks()],
                      trees=None if rt.spans_on else trees, accelerated=s.accelerator)
    exporter = MetricsExporter(metrics, _transport_factory(s, endpoint, full, protocol),
                               s.metrics_interval, endpoint)
    pipeline = rt.pipeline
    windows = pipeline.transform
    timeout = s.metrics_timeout or s.timeout

    def transform(batches: list[Batch], final: bool) -> list[Batch]:
        try:
            if rt.spans_on:
                metrics.observe(batches, exemplars=windows is None, final=final)
        except Exception as exc:  # a bug here must cost metrics, never spans
            rt.stats.warn_once(f"metrics-{type(exc).__name__}", f"metrics failed: {exc!r}")
        if windows is None:
            for batch in batches:
                batch.columns = None  # counted: its columns need not wait in the queues
            return batches
        out: list[Batch] = windows(batches, final)  # (places relayed batches by their columns)
        try:
            metrics.exported(out)
        except Exception as exc:
            rt.stats.warn_once(f"metrics-{type(exc).__name__}", f"metrics failed: {exc!r}")
        return out

    after = pipeline.after_flush

    def after_flush() -> None:
        if after is not None:
            after()
        try:
            # Within the flush's own deadline: at shutdown that is what is left of
            # shutdown_timeout, so an unreachable metrics endpoint never holds the exit.
            deadline = min(pipeline.deadline, time.monotonic() + timeout)
            exporter.maybe_export(deadline, force=rt.closed)
            if rt.closed:
                exporter.shutdown()
        except Exception as exc:
            rt.stats.warn_once(f"metrics-{type(exc).__name__}", f"metrics failed: {exc!r}")

    pipeline.transform = transform
    pipeline.after_flush = after_flush
    return exporter
