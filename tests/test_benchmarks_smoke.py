"""Keep the benchmarks from rotting: run them at tiny sizes and check what they report.

No timing is asserted (machines are shared and noisy); what is asserted is that each benchmark
runs to the end, prints its tables, and that every span it exported reached the receiver.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"otel_rl_benchmarks_{name}",
                                                  BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`run_all.py --smoke` once for the module: its exit status, output and JSON results."""
    output = tmp_path_factory.mktemp("bench") / "latest.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "run_all.py"), "--smoke",
                           "--output", str(output)],
                          capture_output=True, text=True, timeout=240, check=False)
    results = json.loads(output.read_text()) if output.exists() else None
    tables = output.with_suffix(".md")
    return {"status": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "results": results, "tables": tables.read_text() if tables.exists() else None}


def test_run_all_exits_zero_and_writes_results(smoke_run: dict[str, Any]) -> None:
    assert smoke_run["status"] == 0, smoke_run["stdout"][-3000:] + smoke_run["stderr"][-3000:]
    results = smoke_run["results"]
    assert results is not None and results["failed"] == []
    for name in ("bench_core", "bench_workers"):
        assert results["benchmarks"][name]["exit_status"] == 0
        assert results["benchmarks"][name]["results"]["summary"]
        assert results["benchmarks"][name]["arguments"] == ["--smoke"]


def test_run_all_writes_the_tables_alone_beside_its_results(smoke_run: dict[str, Any]) -> None:
    tables = smoke_run["tables"]
    assert tables is not None and tables.startswith("# benchmarks/run_all.py, smoke run\n")
    assert f"commit {smoke_run['results']['git_commit']}" in tables
    lines = tables.splitlines()
    for name in ("bench_core", "bench_workers", "bench_launcher"):
        assert f"## {name} --smoke" in lines
    # Every table of the output, no progress lines; each table starts after a blank line.
    assert "| anchor 1: ML-Agents `hierarchical_timer`" in tables
    assert not any(line.startswith("round ") for line in lines)
    for i, line in enumerate(lines):
        if line.startswith("|") and not lines[i - 1].startswith("|"):
            assert lines[i - 1] == "", lines[i - 1]


def test_run_all_refuses_a_smoke_size_for_the_framework_runs() -> None:
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "run_all.py"), "--smoke", "--all"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "run_all.py: error: --all has no --smoke size (its --quick runs take minutes)")


def test_benchmarks_print_their_markdown_tables(smoke_run: dict[str, Any]) -> None:
    out = smoke_run["stdout"]
    for heading in ("### Per timed block", "### (d) Memory per buffered span", "### Workers:"):
        assert heading in out
    for row in ("| anchor 1: ML-Agents", "| anchor 2: OTel SDK", "| (a) otel_rl `spans=auto`",
                "| (b) otel_rl `spans=all`", "| (c) otel_rl `disabled=True`",
                "| (e) otel_rl unconfigured", "| otel_rl record in the buffer",
                "| anchor: ML-Agents", "| plain worker", "| otel_rl, compiled | `spans=auto`"):
        assert row in out, row
    assert "CHECKS FAILED" not in out


def test_every_exported_span_reaches_the_receiver(smoke_run: dict[str, Any]) -> None:
    benches = smoke_run["results"]["benchmarks"]
    core = benches["bench_core"]["results"]
    cfg = core["config"]
    for sample in core["samples"]["all"]:
        # spans=all: every block of every nest, plus the run and aggregate spans, none dropped.
        assert sample["expected"] == 3 * cfg["nests"] + 2
        assert sample["received"] == sample["expected"]
        assert sample["dropped"] == 0
    for sample in core["samples"]["otel_sdk"]:
        assert sample["received"] == sample["expected"] == 3 * cfg["sdk_nests"]
    for sample in core["samples"]["auto"]:
        assert sample["received"] == sample["expected"] > 0
    workers = benches["bench_workers"]["results"]
    wcfg = workers["config"]
    for sample in core["samples"]["off"]:  # no blocks: the run span and the aggregate span
        assert sample["received"] == sample["expected"] == 2
    for variant, extra in (("otel_rl", wcfg["workers"] + 3), ("otel_sdk", 0)):
        for sample in workers["samples"][variant]:
            assert sample["expected"] == wcfg["workers"] * wcfg["blocks"] + extra
            assert sample["received"] == sample["expected"]
            assert sample["checks"] == []


def test_memory_is_measured_for_both_buffers(smoke_run: dict[str, Any]) -> None:
    memory = smoke_run["results"]["benchmarks"]["bench_core"]["results"]["memory"]
    kinds = {(m["kind"], m["method"]): m for m in memory}
    assert set(kinds) == {(k, m) for k in ("otel_rl", "otel_sdk") for m in ("tracemalloc", "rss")}
    for m in memory:
        assert m["spans"] == 3 * 300  # --smoke holds 300 nests of 3 blocks
    # A held record is some bytes, not nothing and not megabytes.
    assert 16 < kinds[("otel_rl", "tracemalloc")]["bytes_per_span"] < 100_000


def test_receiver_counts_spans_sent_over_http_and_grpc() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    receiver_module = _load("_receiver")
    with receiver_module.ReceiverProcess() as receiver:
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(
            GrpcExporter(endpoint=receiver.grpc_endpoint, insecure=True)))
        tracer = provider.get_tracer("smoke")
        for name in ("a", "b", "c"):
            with tracer.start_as_current_span(name):
                pass
        provider.shutdown()
        assert receiver.wait_for(3, timeout=20) == 3  # SimpleSpanProcessor: a request per span
        request = ExportTraceServiceRequest()
        spans = request.resource_spans.add().scope_spans.add().spans
        for i in range(2):
            spans.add(trace_id=b"\x01" * 16, span_id=bytes([i + 1]) * 8, name=f"s{i}")
        good = urllib.request.Request(f"{receiver.http_endpoint}/v1/traces",
                                      data=request.SerializeToString(),
                                      headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(good, timeout=10) as response:
            assert response.status == 200
        # A request that is not an ExportTraceServiceRequest is refused and not counted.
        bad = urllib.request.Request(f"{receiver.http_endpoint}/v1/traces", data=b"\xff\xff",
                                     headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=10)
        assert err.value.code == 400
        assert receiver.counts() == {"spans": 5, "requests": 4}


def test_relay_and_timing_switch_benchmarks_check_their_results(smoke_run: dict[str, Any]
                                                                 ) -> None:
    """Issue 19's two benchmarks run from `run_all.py`: the relay's frames decode back to the
    records that went in (now's and the earlier revision's, each with the other's), and every
    Timing block of the switch benchmark is counted in timers.json."""
    benches = smoke_run["results"]["benchmarks"]
    for name in ("bench_relay", "bench_timing_switch"):
        assert benches[name]["exit_status"] == 0, benches[name]["output"][-2000:]
        summary = benches[name]["results"]["summary"]
        assert summary["now"]["checks"] == []
    assert benches["bench_relay"]["results"]["summary"]["now"]["bytes_per_record"] > 0
    windows = benches["bench_windows"]  # bulk windows export what record by record exports
    assert windows["exit_status"] == 0, windows["output"][-2000:]
    assert all(not row["checks"] for row in windows["results"]["summary"].values())
    launcher = benches["bench_launcher"]  # report.html the same before and now
    assert launcher["exit_status"] == 0, launcher["output"][-2000:]
    rows = launcher["results"]["summary"]
    assert {"launcher, now", "write_report, now", "the main process's page (`runreport.write`)",
            "launcher, now, after the main process's page"} <= set(rows)
    assert all(not row["checks"] for row in rows.values())


def test_bench_metrics_smoke_runs_both_column_readers_and_sizes_an_export(
        tmp_path: Path) -> None:
    from otel_rl._internal import accel, metrics_columns

    output = tmp_path / "metrics.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_metrics.py"), "--smoke",
                           "--json", str(output)], capture_output=True, text=True, timeout=240,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("| ML-Agents `hierarchical_timer`", "| otel_rl `spans=auto`, metrics off",
                "| otel_rl `spans=auto`, metrics on |",
                "| otel_rl `spans=auto`, metrics on, pure-Python metrics columns",
                "| metrics on (pure columns) / metrics off"):
        assert row in proc.stdout, row
    results = json.loads(output.read_text())
    summary = results["summary"]
    for variant in ("metrics_on", "metrics_on_pure"):
        assert summary[variant]["checks"] == []
        assert summary[variant]["work"]["observe"]["median"] > 0  # the metrics did count
        assert "cpu_total" in summary[variant]["paired_vs_off"]
    assert results["compiled_columns"] == (metrics_columns.COMPILED is not None
                                           and accel.wanted())
    # 100 paths x 2 roles: 31 series per histogram stream, 2 per path and worker process.
    assert results["export"]["series"] == 100 * 2 * 31 + 100 * 3 * 2
    assert results["export_exponential"]["series"] == 100 * 2 + 100 * 3 * 2
    assert results["export"]["bytes_with_exemplars"] > results["export"]["bytes"] > 0


def test_an_earlier_revision_runs_from_a_folder_of_its_own(tmp_path: Path) -> None:
    """What ``--against REV`` runs (`_report.built_package_at_revision`): otel_rl as of REV,
    extracted by git, built for the Python given, imported first from PYTHONPATH."""
    report = _load("_report")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True,
                          text=True, check=False)
    if head.returncode != 0:
        pytest.skip("not a git checkout: no revision to extract")
    folder = tmp_path / "at-head"
    folder.mkdir()
    runs = report.built_package_at_revision(head.stdout.strip(), str(folder), sys.executable)
    assert runs == "compiled" or runs.startswith("pure Python ("), runs
    elsewhere = tmp_path / "elsewhere"  # not the checkout: `-c` puts the cwd first on the path
    elsewhere.mkdir()
    probe = subprocess.run(
        [sys.executable, "-c", "import otel_rl; from otel_rl._internal import accel; "
         "print(otel_rl.__file__, accel.compiled() is not None)"],
        cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(folder)}, capture_output=True,
        text=True, timeout=60, check=True)
    assert probe.stdout.split() == [str(folder / "otel_rl" / "__init__.py"),
                                    str(runs == "compiled")]
    assert report.built_package_at_revision("no-such-revision", str(tmp_path), sys.executable
                                            ) is None


def test_side_by_side_rounds_run_their_variants_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--side-by-side`` (the real-run benches' `interleaved`): a round's variants all run at
    the same time, each row filed under its own variant; without it, one at a time."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = _load("bench_sample_factory")

    def runner(wait: float) -> Any:
        barrier = threading.Barrier(3, timeout=wait)

        def run(variant: str) -> dict[str, Any]:
            barrier.wait()  # passes only once the round's three runs are running together
            return {"fps": float(len(variant)), "cpu_s": 1.0, "wall_s": 1.0, "checks": []}
        return run

    runs = bench.interleaved(3, 0, runner(30.0), others=["disabled"], side_by_side=True)
    assert {v: [row["fps"] for row in rows] for v, rows in runs.items()} == {
        "plain": [5.0] * 3, "otel_rl": [7.0] * 3, "disabled": [8.0] * 3}
    with pytest.raises(threading.BrokenBarrierError):
        bench.interleaved(1, 0, runner(0.2), others=["disabled"])
