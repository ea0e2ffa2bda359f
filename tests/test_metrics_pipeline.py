"""The metrics pipeline of the shipped collector configs, run for real (issue 18): otel_rl →
the collector → a real Prometheus (its OTLP receiver) and a real Jaeger, then PromQL.

No contrib Collector is built here; the Jaeger v2 binary is an OpenTelemetry Collector
distribution with the same ``otlp`` receiver, ``memory_limiter`` / ``batch`` processors and
``otlp`` / ``otlphttp`` exporters, so it runs each config as written but for the contrib-only
parts `test_collector_configs.substitute_for_jaeger` swaps (``health_check`` → ``healthcheckv2``)
and its listening ports (moved to free loopback ones). `collector-config/to-jaeger.yaml` gets
its backends from its own environment variables; the compose stack's collector
(`docker/otel-collector.yaml`) has the compose service names, pointed at loopback here.

What this adds to `test_metrics.py` (which sends straight to Prometheus): the collector's
metrics pipeline delivers every block's cumulative counts, the exemplars (a trace id that
resolves in Jaeger, sent through the same collector's traces pipeline) and the scalars, and
every query of the provisioned Grafana dashboard returns series on that data, with its
variables as Grafana fills them: "All", and one value picked from each variable's own query.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.jaeger import JaegerServer, on_a_port_still_free, start_jaeger
from tests.fixtures.prometheus import PrometheusServer
from tests.test_collector_configs import clean_env, load, on_free_ports, substitute_for_jaeger
from tests.test_metrics_stack import dashboard, dashboard_queries

REPO = Path(__file__).resolve().parents[1]
STEPS, SLOW = 30, 20
CONFIGS = {"to-jaeger": REPO / "collector-config" / "to-jaeger.yaml",
           "compose": REPO / "docker" / "otel-collector.yaml"}


def _collector(binary: str, which: str, prometheus: PrometheusServer, jaeger: JaegerServer,
               workdir: Path) -> tuple[Any, str]:
    """The collector running config `which`; (its process, its OTLP/HTTP base URL)."""
    return on_a_port_still_free(
        lambda: _collector_on_free_ports(binary, which, prometheus, jaeger, workdir)
    )


def _collector_on_free_ports(binary: str, which: str, prometheus: PrometheusServer,
                             jaeger: JaegerServer, workdir: Path) -> tuple[Any, str]:
    config, health = on_free_ports(substitute_for_jaeger(load(CONFIGS[which])))
    env = clean_env()
    prometheus_otlp = f"{prometheus.url}/api/v1/otlp"
    if which == "compose":  # the compose service names, on loopback here
        exporters = config["exporters"]
        assert exporters["otlphttp/prometheus"]["endpoint"] == "http://prometheus:9090/api/v1/otlp"
        exporters["otlphttp/prometheus"]["endpoint"] = prometheus_otlp
        for name in ("otlp/jaeger", "otlp/tempo"):  # no Tempo here: Jaeger takes both
            exporters[name]["endpoint"] = jaeger.otlp_grpc_endpoint
    else:
        env.update(OTEL_RL_PROMETHEUS_ENDPOINT=prometheus_otlp,
                   OTEL_RL_JAEGER_ENDPOINT=jaeger.otlp_grpc_endpoint)
    assert config["service"]["pipelines"]["metrics"]["exporters"] == ["otlphttp/prometheus"]
    process = start_jaeger(binary, config, health, workdir, env=env)
    http = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    return process, f"http://{http}"


def _settled(prometheus: PrometheusServer, promql: str, want: dict[str, float],
             timeout_s: float = 30.0) -> dict[str, float]:
    """Poll `promql` (by block) until it shows `want` (the collector batches for up to 2 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {r["metric"]["block"]: float(r["value"][1]) for r in prometheus.query(promql)}
        if all(got.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


@pytest.mark.prometheus
@pytest.mark.jaeger
@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_metrics_reach_prometheus_through_the_collector_config(
        which: str, jaeger_binary: str, prometheus: PrometheusServer, jaeger: JaegerServer,
        jaeger_service: str, tmp_path: Path) -> None:
    collector, endpoint = _collector(jaeger_binary, which, prometheus, jaeger, tmp_path / "otelcol")
    started = time.time()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update({
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "OTEL_SERVICE_NAME": jaeger_service, "OTEL_RL_RUN_ID": jaeger_service,
            # One endpoint for both signals, as a user of the stack sets it.
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_RL_SPANS": "auto", "OTEL_RL_WINDOW": "0.5", "OTEL_RL_SAMPLE_EVERY": "4",
            "OTEL_RL_FLUSH_INTERVAL": "0.3", "OTEL_RL_METRICS_INTERVAL": "0.5"})
        done = subprocess.run([sys.executable, "-m", "tests.metrics_workload", str(STEPS),
                               str(SLOW)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "failed" not in done.stderr and "not exported" not in done.stderr, done.stderr
        run = f'otel_rl_run_id="{jaeger_service}"'
        want = {"update": STEPS, "main_loop": 1, "rollout": 4 * STEPS}
        got = _settled(prometheus, f"sum by (block) "
                                   f"(otel_rl_block_duration_seconds_count{{{run}}})", want)
        assert got == want, f"{got}\ncollector log:\n{collector.log_tail()}"
        # The slow update's exemplar went through the collector and resolves in Jaeger, whose
        # spans came through the same collector.
        groups = prometheus.exemplars(
            f'otel_rl_block_duration_seconds_bucket{{{run},block="update"}}', started - 5,
            time.time() + 1)
        slowest = max((e for g in groups for e in g["exemplars"]),
                      key=lambda e: float(e["value"]))
        assert float(slowest["value"]) >= 0.3
        span = jaeger.wait_for_span(slowest["labels"]["trace_id"], slowest["labels"]["span_id"])
        assert span["name"] == "update"
        # Each provisioned exemplar link reads a label the stored exemplar has.
        datasources = load(REPO / "docker" / "grafana" / "provisioning" / "datasources"
                           / "tempo.yaml")["datasources"]
        (prom,) = [d for d in datasources if d["type"] == "prometheus"]
        for link in prom["jsonData"]["exemplarTraceIdDestinations"]:
            assert link["name"] in slowest["labels"], (link, slowest["labels"])
        _every_dashboard_query_has_series(prometheus, jaeger_service)
    finally:
        collector.stop()


def _every_dashboard_query_has_series(prometheus: PrometheusServer, run_id: str) -> None:
    """Every query of the dashboard (explicit buckets: the native-histogram ones are
    `test_metrics`' exponential run's) returns series, with the variables at "All" and at one
    value each, picked from the variable's own query as Grafana lists them."""
    picked: dict[str, str] = {"run": run_id}
    for variable in dashboard()["templating"]["list"]:
        name = variable["name"]
        values = sorted(r["metric"][_label_of(variable)] for r in prometheus.query(
            dashboard_queries(**picked)[f"variable {name}"]))
        assert values, f"variable {name} lists nothing"
        if name != "run":
            assert run_id not in values
            picked[name] = values[-1]
        else:
            assert run_id in values
    for values in ({"run": run_id}, picked):
        for title, expr in dashboard_queries(**values).items():
            if "otel_rl_block_duration_seconds{" in expr:
                continue  # native histograms: not sent with explicit buckets
            assert prometheus.query(expr), f"dashboard panel {title!r} is empty: {expr}"


def _label_of(variable: dict[str, Any]) -> str:
    query: str = variable["query"]["query"]
    return query.rsplit(",", 1)[1].strip(" )")
