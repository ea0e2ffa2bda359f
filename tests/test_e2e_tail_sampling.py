"""End to end: app (plain OTel SDK) -> Jaeger acting as a collector with tail sampling
(collector-config/jaeger-tail-sampling.yaml) -> Jaeger backend.

Slow and failed iterations must all arrive, complete; of the many fast ones only about the
configured share (10 %) may.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from tests.fixtures.jaeger import free_port, on_a_port_still_free, spans_of, start_jaeger

CONFIG = Path(__file__).resolve().parents[1] / "collector-config" / "jaeger-tail-sampling.yaml"
SLOW_MS = 200
KEEP_PERCENT = 10
FAST, SLOW, FAILED = 60, 4, 4

pytestmark = [pytest.mark.jaeger, pytest.mark.timeout(120)]


@pytest.fixture
def sampling_collector(jaeger: Any, jaeger_binary: str, tmp_path: Path) -> Any:
    def start() -> tuple[Any, str]:
        grpc_port, http_port, health_port = free_port(), free_port(), free_port()
        env = {
            "OTEL_RL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
            "OTEL_RL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
            "OTEL_RL_HEALTH_ENDPOINT": f"127.0.0.1:{health_port}",
            "OTEL_RL_JAEGER_ENDPOINT": jaeger.otlp_grpc_endpoint,
            "OTEL_RL_DECISION_WAIT": "1s",
            "OTEL_RL_BATCH_TIMEOUT": "100ms",
            "OTEL_RL_SLOW_MS": str(SLOW_MS),
            "OTEL_RL_KEEP_PERCENT": str(KEEP_PERCENT),
        }
        health = f"http://127.0.0.1:{health_port}/status"
        process = start_jaeger(jaeger_binary, CONFIG, health, tmp_path, env=env)
        return process, f"127.0.0.1:{grpc_port}"

    process, grpc_endpoint = on_a_port_still_free(start)
    try:
        yield grpc_endpoint
    finally:
        process.stop()


def _iteration(tracer: Any, start_ns: int, duration_ms: float, fail: bool) -> str:
    """One training iteration as its own trace: rollout then update, timestamps explicit."""
    end_ns = start_ns + int(duration_ms * 1e6)
    root = tracer.start_span("iteration", start_time=start_ns)
    context = trace.set_span_in_context(root)
    middle = start_ns + (end_ns - start_ns) // 2
    rollout = tracer.start_span("rollout", context=context, start_time=start_ns)
    rollout.end(end_time=middle)
    update = tracer.start_span("update", context=context, start_time=middle)
    if fail:
        update.set_status(Status(StatusCode.ERROR, "loss is NaN"))
    update.end(end_time=end_ns)
    root.end(end_time=end_ns)
    return format(root.get_span_context().trace_id, "032x")


def test_tail_sampling_keeps_slow_and_failed_iterations_and_few_fast_ones(
    jaeger: Any, jaeger_service: str, sampling_collector: str
) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": jaeger_service}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=sampling_collector, insecure=True), schedule_delay_millis=100
        )
    )
    tracer = provider.get_tracer("e2e")
    start = time.time_ns()
    since = start - 10**9
    fast = [_iteration(tracer, start + i * 10**7, 2, fail=False) for i in range(FAST)]
    slow = [_iteration(tracer, start + i * 10**7, SLOW_MS * 2.5, fail=False) for i in range(SLOW)]
    failed = [_iteration(tracer, start + i * 10**7, 2, fail=True) for i in range(FAILED)]
    assert provider.force_flush(10_000)
    provider.shutdown()

    # Kept traces arrive whole (3 spans each) once the 1 s decision wait has passed.
    for trace_id in slow + failed:
        stored = spans_of(jaeger.wait_for_spans(trace_id, 3, timeout=20))
        assert sorted(s["name"] for s in stored) == ["iteration", "rollout", "update"]
    time.sleep(1.0)  # let any fast trace that was kept arrive too
    arrived = set(jaeger.find_traces(jaeger_service, since))
    assert set(slow + failed) <= arrived
    kept_fast = arrived & set(fast)
    # Expected 10 % of 60 = 6; anything near half would mean the filter is not filtering.
    assert len(kept_fast) < FAST * 0.3, f"{len(kept_fast)} of {FAST} fast traces kept"
    assert arrived <= set(slow + failed + fast)
    for trace_id in kept_fast:  # what is kept is kept whole
        assert len(spans_of(jaeger.get_trace(trace_id))) == 3


def test_otel_rl_windows_are_tail_sampled_by_the_collector(
    jaeger: Any, jaeger_service: str, sampling_collector: str, tmp_path: Path
) -> None:
    """The same path with otel_rl as the app: with every time window kept (sample_every=1) and
    windows about one iteration long, each window is a trace, and the collector keeps the
    slow and failed ones whole."""
    import otel_rl
    from otel_rl._internal import semconv
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file
    from otel_rl.timers import hierarchical_timer

    otel_rl.configure(service_name=jaeger_service, endpoint=f"http://{sampling_collector}",
                      protocol="grpc", spans="auto", window=0.05, sample_every=1,
                      output_dir=str(tmp_path), flush_interval=0.1)
    since = time.time_ns() - 10**9
    kinds = ["fast"] * 30 + ["slow"] * 3 + ["failed"] * 3 + ["fast"] * 30
    with hierarchical_timer("start_learning"):
        for kind in kinds:
            time.sleep(0.06)  # about one iteration per window
            try:
                with hierarchical_timer("advance"):
                    with hierarchical_timer("env_step"):
                        if kind == "slow":
                            time.sleep(SLOW_MS * 1.5 / 1000)
                    with hierarchical_timer("update"):
                        if kind == "failed":
                            raise FloatingPointError("loss is NaN")
            except FloatingPointError:
                pass
    otel_rl.shutdown(timeout=20)

    sent = read_otlp_json_file(tmp_path / "spans.otlp.jsonl")  # everything otel_rl exported
    per_trace = Counter(s.trace_id for s in sent)
    windows = {s.trace_id for s in sent if s.attributes.get(semconv.KIND) == "window"}
    assert len(windows) >= 60  # every window kept, each its own trace
    slow = {s.trace_id for s in sent if s.name == "env_step" and s.duration_s >= SLOW_MS / 1000
            and not s.attributes.get(semconv.CONTINUATION)}
    failed = {s.trace_id for s in sent if s.name == "update" and s.is_error}
    fast = windows - slow - failed
    assert len(slow) == 3 and len(failed) == 3
    for trace_id in slow | failed:  # kept, and kept whole
        stored = spans_of(jaeger.wait_for_spans(trace_id, per_trace[trace_id], timeout=20))
        assert len(stored) == per_trace[trace_id]
    time.sleep(1.0)
    arrived = set(jaeger.find_traces(jaeger_service, since))
    assert len(arrived & fast) < len(fast) * 0.3, f"{len(arrived & fast)} of {len(fast)} fast kept"
