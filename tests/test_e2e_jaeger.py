"""End to end against a real Jaeger v2: a multi-process otel_rl run exported over OTLP/gRPC and
OTLP/HTTP is one trace in /api/v3 with the right parents, service, per-process resources and
error status; `otel-rl tree --jaeger` rebuilds the timers.json the run wrote. Long `auto` runs:
tests/test_long_runs.py."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import semconv
from otel_rl._internal.readers.jaeger import parse_jaeger
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl.timers import hierarchical_timer
from tests import mp_workloads as w

pytestmark = [pytest.mark.jaeger, pytest.mark.timeout(180)]


def shape(n: dict[str, Any]) -> dict[str, Any]:
    return {"count": n["count"], "is_parallel": n.get("is_parallel", False),
            "children": {k: shape(v) for k, v in n.get("children", {}).items()}}


def multiprocess_run(tmp_path: Path, **settings: Any) -> tuple[dict[str, Any], str, int]:
    """A run with spawn and fork workers, a failing worker, a thread and a failed block.
    Returns (timers.json, trace id, number of spans written to the file)."""
    otel_rl.configure(output_dir=str(tmp_path), flush_interval=0.2, **settings)

    def trainer() -> None:
        for _ in range(3):
            with hierarchical_timer("update"):
                pass

    with hierarchical_timer("run_training.setup"):
        spawn = [mp.get_context("spawn").Process(target=w.worker, args=(4,)) for _ in range(2)]
        fork = mp.get_context("fork").Process(target=w.failing_worker, args=(2,))
        for p in [*spawn, fork]:
            p.start()
        thread = threading.Thread(target=trainer, name="trainer")
        thread.start()
        for p in [*spawn, fork]:
            p.join(60)
        thread.join()
    try:
        with hierarchical_timer("save_model"):
            raise OSError("disk full")
    except OSError:
        pass
    otel_rl.shutdown(timeout=20)
    tree = json.loads((tmp_path / "timers.json").read_text())
    spans = read_otlp_json_file(tmp_path / "spans.otlp.jsonl")
    trace_ids = {s.trace_id for s in spans}
    assert len(trace_ids) == 1
    return tree, trace_ids.pop(), len(spans)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_multiprocess_run_is_one_trace_in_jaeger(protocol: str, jaeger: Any, jaeger_service: str,
                                                 tmp_path: Path) -> None:
    endpoint = (f"http://{jaeger.otlp_grpc_endpoint}" if protocol == "grpc"
                else jaeger.otlp_http_endpoint)
    tree, trace_id, n = multiprocess_run(tmp_path, service_name=jaeger_service, spans="all",
                                         endpoint=endpoint, protocol=protocol)
    spans = parse_jaeger(jaeger.wait_for_spans(trace_id, n, timeout=30))
    assert len(spans) == n
    assert {s.trace_id for s in spans} == {trace_id}
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1 and roots[0].attributes[semconv.KIND] == "run"
    assert all(s.parent_span_id in by_id for s in spans if s.parent_span_id)
    assert {s.resource["service.name"] for s in spans} == {jaeger_service}
    pids = {s.resource[semconv.PROCESS_PID] for s in spans}
    assert len(pids) == 4  # main, two spawn workers, one fork worker
    for s in spans:
        if s.name == "env_step":
            assert by_id[s.parent_span_id].name == "run_training.setup"
            assert s.resource[semconv.WORKER_ROLE] in ("worker", "failing_worker")
    failed = {s.name for s in spans if s.is_error}
    assert failed == {"save_model", "doomed"}
    doomed = next(s for s in spans if s.name == "doomed")
    assert doomed.events[0].attributes["exception.type"] == "RuntimeError"
    assert doomed.resource[semconv.PROCESS_PID] != roots[0].resource[semconv.PROCESS_PID]
    assert {s.attributes.get("thread.name") for s in spans if s.name == "update"} == {"trainer"}
    assert node_count(tree, "run_training.setup", "env_step") == 10


def node_count(tree: dict[str, Any], *path: str) -> int:
    for name in path:
        tree = tree["children"][name]
    return int(tree["count"])


def test_tree_from_jaeger_matches_the_timers_json_the_run_wrote(jaeger: Any, jaeger_service: str,
                                                                tmp_path: Path) -> None:
    tree, trace_id, n = multiprocess_run(tmp_path, service_name=jaeger_service, spans="all",
                                         endpoint=jaeger.otlp_http_endpoint)
    jaeger.wait_for_spans(trace_id, n, timeout=30)
    out = tmp_path / "from_jaeger.json"
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "tree", "--jaeger", jaeger.query_url,
                           "--trace-id", trace_id, "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rebuilt = json.loads(out.read_text())
    assert shape(rebuilt) == shape(tree)
    assert rebuilt["children"]["run_training.setup"]["children"]["env_step"]["is_parallel"]
    assert rebuilt["gauges"] == tree["gauges"]
    # An unknown trace id is a one-line error, not a traceback.
    missing = subprocess.run([sys.executable, "-m", "otel_rl", "tree", "--jaeger", jaeger.query_url,
                              "--trace-id", "0" * 31 + "1"], capture_output=True, text=True)
    assert missing.returncode != 0
    assert len(missing.stderr.strip().splitlines()) == 1 and "Traceback" not in missing.stderr


def test_demo_sends_its_spans_to_the_endpoint_in_the_environment(jaeger: Any, jaeger_service: str,
                                                                 tmp_path: Path) -> None:
    env = {**__import__("os").environ, "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
           "OTEL_SERVICE_NAME": jaeger_service}
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "demo", "--workers", "2",
                           "--steps", "2000", "--spans", "all", "--output", str(tmp_path),
                           "--run-id", "e2e", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_logs = tmp_path / "e2e" / "run_logs"
    written = read_otlp_json_file(run_logs / "spans.otlp.jsonl")
    trace_id = written[0].trace_id
    spans = parse_jaeger(jaeger.wait_for_spans(trace_id, len(written), timeout=30))
    assert len(spans) == len(written)
    assert {s.resource["service.name"] for s in spans} == {jaeger_service}
    out = tmp_path / "from_jaeger.json"
    tree_cli = subprocess.run([sys.executable, "-m", "otel_rl", "tree", "--jaeger", jaeger.query_url,
                               "--trace-id", trace_id, "-o", str(out)], capture_output=True, text=True)
    assert tree_cli.returncode == 0, tree_cli.stderr
    timers = json.loads((run_logs / "timers.json").read_text())
    assert shape(json.loads(out.read_text())) == shape(timers)
