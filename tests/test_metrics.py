"""OTLP metrics (issue 18): block-duration histograms, gauges, training scalars and the
env-steps counter, encoded by otel_rl itself, into a real Prometheus, with exemplars that
resolve to spans in a real Jaeger."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from otel_rl._internal import aggregates, config, procstate
from otel_rl._internal import metrics as m
from otel_rl._internal import metrics_export as mx
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.sinks.base import Stats
from tests.fixtures.jaeger import JaegerServer
from tests.fixtures.otlp_receiver import Receiver
from tests.fixtures.prometheus import PrometheusServer

REPO = Path(__file__).resolve().parents[1]


def _metrics(**kwargs: Any) -> m.Metrics:
    return m.Metrics(resource={"service.name": "svc", "otel_rl.run.id": "run-1",
                               "process.pid": 12}, start_ns=1_000, stats=Stats(),
                     gauges=kwargs.get("gauges", dict), scalars=kwargs.get("scalars", list),
                     dropped=lambda: 0)


def _record(sid: int, name: str, seconds: float, trace: int = 7, extra: Any = None) -> Any:
    return (sid, 0, name, 0, int(seconds * 1e9), 1, trace, extra)


def _decode(data: bytes) -> dict[str, Any]:
    request = ExportMetricsServiceRequest.FromString(data)
    (rm,) = request.resource_metrics
    (sm,) = rm.scope_metrics
    return {"resource": {kv.key: kv.value.string_value for kv in rm.resource.attributes},
            "metrics": {metric.name: metric for metric in sm.metrics}}


def test_histograms_count_blocks_per_name_and_role_in_seconds_buckets() -> None:
    metrics = _metrics()
    main = Batch({"process.pid": 1}, 0, [_record(1, "update", 0.0015), _record(2, "update", 0.3),
                                         _record(3, "main_loop", 2.0)])
    worker = Batch({"process.pid": 2, "otel_rl.worker.role": "pool", "otel_rl.worker.index": 1},
                   0, [_record(4, "update", 0.004),
                       # not blocks: an aggregate span and a continuation
                       _record(5, "otel_rl.aggregate", 0.0, extra={"attrs": {"otel_rl.kind": "aggregate"}}),
                       _record(6, "update", 9.0, extra={"attrs": {"otel_rl.continuation": True}})])
    metrics.observe([main, worker], exemplars=True)
    decoded = _decode(metrics.encode(5_000))
    assert decoded["resource"]["service.instance.id"] == "run-1"
    assert "process.pid" not in decoded["resource"]
    hist = decoded["metrics"]["otel_rl.block.duration"]
    assert hist.unit == "s" and hist.histogram.aggregation_temporality == 2  # cumulative
    points = {tuple(sorted((kv.key, kv.value.string_value) for kv in p.attributes)): p
              for p in hist.histogram.data_points}
    update = points[(("block", "update"), ("path", "update"), ("role", "main"))]
    assert update.count == 2 and update.sum == pytest.approx(0.3015)
    assert list(update.explicit_bounds) == list(m.BOUNDS)
    bucket = {b: c for b, c in zip([*m.BOUNDS, float("inf")], update.bucket_counts, strict=True)}
    assert bucket[0.0025] == 1 and bucket[0.5] == 1 and sum(update.bucket_counts) == 2
    assert points[(("block", "update"), ("path", "update"), ("role", "pool"))].count == 1
    assert all(("block", "otel_rl.aggregate") not in key for key in points)  # not a block
    (exemplar,) = update.exemplars  # the slowest exported run
    assert exemplar.as_double == pytest.approx(0.3)
    assert int.from_bytes(exemplar.span_id, "big") == 2
    assert int.from_bytes(exemplar.trace_id, "big") == 7
    # Handed out once: the next export has no exemplar, the same cumulative counts.
    again = _decode(metrics.encode(6_000))["metrics"]["otel_rl.block.duration"]
    assert all(not p.exemplars for p in again.histogram.data_points)
    assert sum(p.count for p in again.histogram.data_points) == 4


def test_a_worker_exporting_on_its_own_is_an_instance_of_its_own() -> None:
    worker = m.Metrics(resource={"otel_rl.run.id": "r", "otel_rl.worker.role": "rollout",
                                 "otel_rl.worker.index": 3, "process.pid": 9},
                       start_ns=1, stats=Stats(), gauges=dict, scalars=list)
    assert worker.resource["service.instance.id"] == "r/rollout-3"
    assert worker.role == "rollout" and "otel_rl.worker.role" not in worker.resource


def test_exemplars_come_from_the_spans_the_windows_exported_not_the_drained_ones() -> None:
    metrics = _metrics()
    metrics.observe([Batch({}, 0, [_record(1, "update", 0.5)])], exemplars=False)
    assert not _decode(metrics.encode(2))["metrics"]["otel_rl.block.duration"] \
        .histogram.data_points[0].exemplars
    # The window re-mapped the span into its own trace: that id is the exemplar.
    metrics.exported([Batch({}, 0, [_record(0xABC, "update", 0.5, trace=99)])])
    point = _decode(metrics.encode(3))["metrics"]["otel_rl.block.duration"].histogram.data_points[0]
    assert int.from_bytes(point.exemplars[0].span_id, "big") == 0xABC
    assert int.from_bytes(point.exemplars[0].trace_id, "big") == 99
    assert point.count == 1  # exported spans are not counted twice


def test_exponential_buckets_hold_their_values() -> None:
    metrics = m.Metrics(resource={}, start_ns=1, stats=Stats(), gauges=dict, scalars=list,
                        exponential=True)
    values = [0.0, 0.001, 0.001, 0.3, 1e-6, 2.0]
    metrics.observe([Batch({}, 0, [_record(i + 1, "b", v) for i, v in enumerate(values)])],
                    exemplars=True)
    (point,) = _decode(metrics.encode(9))["metrics"]["otel_rl.block.duration"] \
        .exponential_histogram.data_points
    assert point.scale == m.SCALE and point.zero_count == 1 and point.count == len(values)
    assert point.sum == pytest.approx(sum(values))
    base = 2 ** (2.0 ** -point.scale)
    held = []
    for i, count in enumerate(point.positive.bucket_counts):
        index = point.positive.offset + i
        low, high = base ** index, base ** (index + 1)
        inside = [v for v in values if low < v <= high * (1 + 1e-12)]
        assert count == len(inside), (index, low, high, count)
        held += inside
    assert sorted(held) == sorted(v for v in values if v > 0)
    assert point.exemplars[0].as_double == pytest.approx(2.0)


def test_gauges_scalars_and_env_steps() -> None:
    metrics = _metrics(gauges=lambda: {"reward": {"value": 3.5}},
                       scalars=lambda: [("main", 0, [["0", "perf/_fps", 900.0, 4000, 10]]),
                                        ("learner", 0, [["0", "reward/reward", 2.0, 3000, 11]]),
                                        ("learner", 0, [["0", "reward/reward", 1.0, 2000, 5]])])
    decoded = _decode(metrics.encode(50))["metrics"]
    (gauge,) = decoded["otel_rl.gauge"].gauge.data_points
    assert gauge.as_double == 3.5
    scalars = {p.attributes[0].value.string_value: p.as_double
               for p in decoded["otel_rl.scalar"].gauge.data_points}
    assert scalars == {"perf/_fps": 900.0, "reward/reward": 2.0}
    steps = decoded["otel_rl.env.steps"].sum
    assert steps.is_monotonic and steps.aggregation_temporality == 2
    assert sorted(p.as_int for p in steps.data_points) == [3000, 4000]


def test_record_scalar_keeps_the_latest_value_and_step_and_ignores_nan() -> None:
    m.reset_scalars()
    m.record_scalar("loss", 1.0, 10, "0")
    m.record_scalar("loss", 0.5, 20, "0")
    m.record_scalar("loss", float("nan"), 30, "0")
    m.record_scalar("bad", "not a number", 1)  # type: ignore[arg-type]  # never raises
    assert [row[:4] for row in m.scalar_state()] == [["0", "loss", 0.5, 20]]
    m.reset_scalars()


@pytest.mark.parametrize(("environ", "expected"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ("http://c:4318", False)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://j:4318/v1/traces"},
     ("http://j:4318/v1/metrics", True)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://j:4318/v1/traces",
      "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://p:9090/api/v1/otlp/v1/metrics"},
     ("http://p:9090/api/v1/otlp/v1/metrics", True)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://j:4318/custom"}, (None, False)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://j:4318/custom",
      "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, ("http://c:4318/v1/metrics", True)),
    ({}, (None, False)),
])
def test_metrics_endpoint_follows_the_span_endpoint_settings(
        environ: dict[str, str], expected: tuple[str | None, bool]) -> None:
    settings = config.resolve({}, environ=environ)
    endpoint, full, protocol = mx.endpoint_of(settings)
    assert (endpoint, full) == expected
    assert protocol == "http/protobuf"


def test_metrics_specific_variables_override_the_span_ones() -> None:
    settings = config.resolve({}, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "b=2",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2500", "OTEL_RL_METRICS": "false"})
    assert settings.metrics is False
    assert settings.metrics_protocol == "grpc" and settings.metrics_headers == {"b": "2"}
    assert settings.metrics_timeout == 2.5
    transport = mx._transport_factory(settings, "c:4317", False, "grpc")()
    assert transport.headers == {"b": "2"} and transport.timeout_s == 2.5


def test_metrics_reach_an_otlp_receiver_over_grpc(otlp_metrics_receiver: Any) -> None:
    metrics = _metrics()
    metrics.observe([Batch({}, 0, [_record(1, "update", 0.01)])], exemplars=True)
    settings = config.resolve({"endpoint": otlp_metrics_receiver.grpc_endpoint,
                               "protocol": "grpc"}, environ={})
    endpoint, full, protocol = mx.endpoint_of(settings)
    assert endpoint is not None
    exporter = mx.MetricsExporter(metrics, mx._transport_factory(settings, endpoint, full,
                                                               protocol), 10.0, endpoint)
    exporter.maybe_export(time.monotonic() + 10, force=True)
    exporter.shutdown()
    assert metrics.exports == 1
    (request,) = otlp_metrics_receiver.requests
    names = [mt.name for rm in request.resource_metrics for sm in rm.scope_metrics
             for mt in sm.metrics]
    assert "otel_rl.block.duration" in names


# --- a real run into a real Prometheus, spans into a real Jaeger ------------------------------

STEPS = 40
SLOW = 25


def _run_workload(prometheus: PrometheusServer, jaeger: JaegerServer, service: str,
                  tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http_endpoint}/v1/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": prometheus.otlp_metrics_endpoint,
        "OTEL_RL_SPANS": "auto", "OTEL_RL_WINDOW": "0.5", "OTEL_RL_SAMPLE_EVERY": "4",
        "OTEL_RL_FLUSH_INTERVAL": "0.3", "OTEL_RL_METRICS_INTERVAL": "0.5",
        "OTEL_RL_RUN_ID": service, **extra,
    })
    done = subprocess.run([sys.executable, "-m", "tests.metrics_workload", str(STEPS),
                           str(SLOW)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not exported" not in done.stderr and "failed" not in done.stderr, done.stderr
    return done


@pytest.mark.prometheus
@pytest.mark.jaeger
def test_a_run_in_prometheus_quantiles_gauges_steps_and_exemplars_in_jaeger(
        prometheus: PrometheusServer, jaeger: JaegerServer, jaeger_service: str,
        tmp_path: Path) -> None:
    started = time.time()
    _run_workload(prometheus, jaeger, jaeger_service, tmp_path)
    run = f'otel_rl_run_id="{jaeger_service}"'
    # Every block is counted, in every process, although `auto` exported only some windows.
    counts = prometheus.wait_for(f"sum by (block, role) (otel_rl_block_duration_seconds_count{{{run}}})")
    by = {(r["metric"]["block"], r["metric"]["role"]): float(r["value"][1]) for r in counts}
    assert by[("update", "main")] == STEPS
    assert by[("main_loop", "main")] == 1
    assert sum(v for (block, role), v in by.items() if block == "rollout" and role != "main") \
        == 4 * STEPS
    # Each block under its path in its thread's tree: a pool worker's rollout is top-level
    # in its process (its parent, main_loop, is in another one).
    paths = prometheus.query(
        f"sum by (path, block, role) (otel_rl_block_duration_seconds_count{{{run}}})")
    by_path = {(r["metric"]["path"], r["metric"]["role"]): float(r["value"][1]) for r in paths}
    assert by_path == {("main_loop", "main"): 1, ("main_loop/update", "main"): STEPS,
                       ("rollout", "worker"): 4 * STEPS}, by_path
    # Each worker process's own cumulative counts: both pool workers ran rollouts.
    runs = prometheus.query(f'otel_rl_block_runs_total{{{run},block="rollout"}}')
    assert len(runs) == 2 and sum(float(r["value"][1]) for r in runs) == 4 * STEPS
    assert {r["metric"]["worker"] for r in runs} == {"0", "1"}
    # The median update sleeps 1 ms: histogram_quantile lands in its (1 ms, 2.5 ms] bucket.
    (p50,) = prometheus.query("histogram_quantile(0.5, sum by (le) "
                              f"(otel_rl_block_duration_seconds_bucket{{{run},block=\"update\"}}))")
    assert 0.001 <= float(p50["value"][1]) <= 0.0025
    (p99,) = prometheus.query("histogram_quantile(0.99, sum by (le) "
                              f"(otel_rl_block_duration_seconds_bucket{{{run},block=\"update\"}}))")
    assert 0.1 <= float(p99["value"][1]) <= 0.5  # the one 0.3 s update
    # The gauge and the scalar over time: the last values, and rising series.
    (gauge,) = prometheus.query(f'otel_rl_gauge{{{run},name="reward"}}')
    assert float(gauge["value"][1]) == STEPS - 1
    end = time.time() + 1
    (series,) = prometheus.query_range(f'otel_rl_scalar{{{run},name="reward/reward"}}',
                                       started, end, 0.25)
    values = [float(v) for _, v in series["values"]]
    assert len(set(values)) >= 3 and values == sorted(values)
    assert values[-1] == (STEPS - 1) * 1.5
    # A scalar set in the pool workers came over the relay, labelled with their role.
    workers = prometheus.query(f'otel_rl_scalar{{{run},name="rollout/items"}}')
    assert sorted((r["metric"]["role"], r["metric"]["worker"]) for r in workers) == \
        [("worker", "0"), ("worker", "1")]
    (steps,) = prometheus.query(f'otel_rl_env_steps_total{{{run},role="main"}}')
    assert float(steps["value"][1]) == (STEPS - 1) * 100
    (rate,) = prometheus.query(f'rate(otel_rl_env_steps_total{{{run},role="main"}}[1m])')
    assert float(rate["value"][1]) > 0
    # The slow update's exemplar is a span Jaeger holds (in a kept window's trace).
    found = prometheus.exemplars(f'otel_rl_block_duration_seconds_bucket{{{run},block="update"}}',
                                 started - 5, end)
    exemplars = [e for group in found for e in group["exemplars"]]
    assert exemplars, found
    slowest = max(exemplars, key=lambda e: float(e["value"]))
    assert float(slowest["value"]) >= 0.3
    trace_id, span_id = slowest["labels"]["trace_id"], slowest["labels"]["span_id"]
    assert jaeger.wait_for_span(trace_id, span_id)["name"] == "update"
    # A window's trace, with the window's re-mapped ids: not the run trace.
    assert int(trace_id, 16) != aggregates.run_trace_id(jaeger_service)
    # Every query of the provisioned Grafana dashboard runs, and shows this run.
    from tests.test_metrics_stack import dashboard_queries

    for title, expr in dashboard_queries(jaeger_service).items():
        result = prometheus.query(expr)
        native = "otel_rl_block_duration_seconds{" in expr  # for metrics_histogram=exponential
        if not native:
            assert result, f"dashboard panel {title!r} is empty: {expr}"


@pytest.mark.prometheus
@pytest.mark.jaeger
def test_spans_off_still_counts_every_block_per_path_from_the_trees(
        prometheus: PrometheusServer, jaeger: JaegerServer, jaeger_service: str,
        tmp_path: Path) -> None:
    _run_workload(prometheus, jaeger, jaeger_service, tmp_path, OTEL_RL_SPANS="off")
    run = f'otel_rl_run_id="{jaeger_service}"'
    runs = prometheus.wait_for(f"sum by (path, block, role) (otel_rl_block_runs_total{{{run}}})")
    by = {(r["metric"]["path"], r["metric"]["block"], r["metric"]["role"]): float(r["value"][1])
          for r in runs}
    assert by == {("main_loop", "main_loop", "main"): 1,
                  ("main_loop/update", "update", "main"): STEPS,
                  ("rollout", "rollout", "worker"): 4 * STEPS}, by
    (seconds,) = prometheus.query(
        f'sum(otel_rl_block_seconds_total{{{run},path="main_loop/update"}})')
    assert 0.3 + STEPS * 0.001 <= float(seconds["value"][1]) < 5  # the slow one included
    # No record holds a run's duration: no histogram (said in the docs), gauges still go.
    assert not prometheus.query(f"otel_rl_block_duration_seconds_count{{{run}}}")
    (gauge,) = prometheus.query(f'otel_rl_gauge{{{run},name="reward"}}')
    assert float(gauge["value"][1]) == STEPS - 1
    from tests.test_metrics_stack import dashboard_queries

    for title, expr in dashboard_queries(jaeger_service).items():
        if "otel_rl_block_runs_total" in expr or "otel_rl_block_seconds_total" in expr:
            assert prometheus.query(expr), f"dashboard panel {title!r} is empty: {expr}"


# --- wiring into a run --------------------------------------------------------------------------

def _blocks(n: int) -> None:
    from otel_rl.timers import hierarchical_timer, set_gauge

    for i in range(n):
        with hierarchical_timer("step"):
            pass
        set_gauge("reward", float(i))


def test_a_configured_run_exports_metrics_and_metrics_false_turns_them_off(
        otlp_receiver: Any, otlp_metrics_receiver: Receiver, tmp_path: Path) -> None:
    import otel_rl
    from otel_rl._internal import runtime

    try:
        for wanted in (True, False):
            otlp_metrics_receiver.requests.clear()
            otel_rl.configure(endpoint=otlp_receiver.http_endpoint,
                              metrics_endpoint=otlp_metrics_receiver.grpc_endpoint,
                              metrics_protocol="grpc", metrics=None if wanted else False,
                              spans="all", propagate=False, output_dir=str(tmp_path))
            rt = runtime.current()
            assert rt is not None and (rt.metrics is not None) == wanted
            _blocks(25)
            otel_rl.shutdown(10.0)
            if not wanted:
                assert not otlp_metrics_receiver.requests
                continue
            request = otlp_metrics_receiver.requests[-1]  # the final export: the totals
            metrics = {mt.name: mt for rm in request.resource_metrics
                       for sm in rm.scope_metrics for mt in sm.metrics}
            (point,) = metrics["otel_rl.block.duration"].histogram.data_points
            assert point.count == 25
            (gauge,) = metrics["otel_rl.gauge"].gauge.data_points
            assert gauge.as_double == 24.0
            # Exemplar: a span the span endpoint received.
            (exemplar,) = point.exemplars
            got = {(s.trace_id, s.span_id) for s in otlp_receiver.spans()}
            assert (exemplar.trace_id.hex(), exemplar.span_id.hex()) in got
    finally:
        procstate.reset_for_tests()


def test_no_endpoint_no_metrics(tmp_path: Path) -> None:
    import otel_rl
    from otel_rl._internal import runtime

    try:
        otel_rl.configure(output_dir=str(tmp_path), propagate=False)
        rt = runtime.current()
        assert rt is not None and rt.metrics is None
    finally:
        procstate.reset_for_tests()


def test_an_unreachable_metrics_endpoint_costs_training_nothing_and_is_said_once(
        otlp_receiver: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import otel_rl
    from tests.fixtures.jaeger import free_port

    try:
        otel_rl.configure(endpoint=otlp_receiver.http_endpoint, spans="all", propagate=False,
                          metrics_endpoint=f"http://127.0.0.1:{free_port()}/v1/metrics",
                          metrics_interval=0.01, flush_interval=0.05, shutdown_timeout=2.0,
                          output_dir=str(tmp_path))
        _blocks(10)
        time.sleep(0.3)
        started = time.monotonic()
        otel_rl.shutdown()
        assert time.monotonic() - started < 10  # bounded by shutdown_timeout, not retries
        # Spans still went out; the metrics failure is one warning.
        spans = otlp_receiver.spans()
        assert len([s for s in spans if s.name == "step"]) == 10
        assert any(s.name == "run" for s in spans)  # the final flush was not held up
        said = [r.getMessage() for r in caplog.records if "metrics export" in r.getMessage()]
        assert len(said) == 1 and "the next export carries the totals" in said[0]
    finally:
        procstate.reset_for_tests()


@pytest.mark.prometheus
@pytest.mark.jaeger
def test_exponential_histograms_are_native_histograms_in_prometheus(
        prometheus: PrometheusServer, jaeger: JaegerServer, jaeger_service: str,
        tmp_path: Path) -> None:
    started = time.time()
    _run_workload(prometheus, jaeger, jaeger_service, tmp_path,
                  OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=
                  "base2_exponential_bucket_histogram")
    run = f'otel_rl_run_id="{jaeger_service}"'
    counts = prometheus.wait_for(f"histogram_count(otel_rl_block_duration_seconds{{{run}}})")
    by = {r["metric"]["block"]: float(r["value"][1]) for r in counts}
    assert by["update"] == STEPS and by["rollout"] == 4 * STEPS
    # One series per stream, not one per bucket.
    names = {r["metric"]["__name__"] for r in prometheus.query(
        f'{{__name__=~"otel_rl_block_duration_seconds.*",{run}}}')}
    assert names == {"otel_rl_block_duration_seconds"}
    (p50,) = prometheus.query("histogram_quantile(0.5, sum(otel_rl_block_duration_seconds"
                              f'{{{run},block="update"}}))')
    assert 0.0009 <= float(p50["value"][1]) <= 0.0025
    groups = prometheus.exemplars(f'otel_rl_block_duration_seconds{{{run},block="update"}}',
                                  started - 5, time.time() + 1)
    slowest = max((e for g in groups for e in g["exemplars"]), key=lambda e: float(e["value"]))
    assert float(slowest["value"]) >= 0.3
    jaeger.wait_for_span(slowest["labels"]["trace_id"], slowest["labels"]["span_id"])
    from tests.test_metrics_stack import dashboard_queries

    for title, expr in dashboard_queries(jaeger_service).items():
        if "otel_rl_block_duration_seconds{" in expr:
            assert prometheus.query(expr), f"dashboard panel {title!r} is empty: {expr}"
