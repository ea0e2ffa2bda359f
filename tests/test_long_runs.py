"""Long runs under the default policy, against a real Jaeger (issue 9).

The workloads (tests/long_workloads.py) run in their own processes, as a training would: a
Sample Factory-shaped run with no iteration block (worker processes, a learner thread, ~220k
blocks), an ML-Agents-shaped one, runs killed with SIGKILL and SIGTERM, and a "second machine"
that shares only the run id and a carrier. Windows are 0.5 s instead of the default 10 s, so
that a run of a few seconds has several — the same code at a smaller scale.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import semconv
from otel_rl._internal.aggregates import derive_trace_id
from otel_rl._internal.readers.jaeger import parse_jaeger
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl._internal.spandata import SpanData

pytestmark = [pytest.mark.jaeger, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[1]
TEMPO_TRACE_BYTES = 5_000_000  # Tempo's default max_bytes_per_trace
WINDOWED = ["window=0.5", "sample_every=3", "flush_interval=0.2"]


def run_workload(kind: str, out: Path, *settings: str, timeout: float = 120) -> None:
    proc = subprocess.run([sys.executable, "-m", "tests.long_workloads", kind, str(out),
                           *settings], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def tree_cli(*args: str) -> tuple[int, dict[str, Any] | None, str]:
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "tree", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env())
    tree = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, tree, proc.stderr


def assert_same_tree(rebuilt: dict[str, Any], written: dict[str, Any], path: str = "root") -> None:
    """Counts, is_parallel and names exactly; totals to 1e-9; gauges and metadata equal."""
    assert rebuilt["count"] == written["count"], path
    assert rebuilt.get("is_parallel", False) == written.get("is_parallel", False), path
    assert abs(rebuilt["total"] - written["total"]) <= 1e-9, path
    assert list(rebuilt.get("children", {})) == list(written.get("children", {})), path
    for name, child in written.get("children", {}).items():
        assert_same_tree(rebuilt["children"][name], child, f"{path}/{name}")
    if path == "root":
        assert rebuilt.get("gauges") == written.get("gauges")
        assert rebuilt.get("metadata") == written.get("metadata")


def blocks(tree: dict[str, Any]) -> int:
    return int(tree["count"]) + sum(blocks(c) for c in tree.get("children", {}).values())


def orphans(spans: list[SpanData]) -> list[SpanData]:
    keys = {(s.trace_id, s.span_id) for s in spans}
    return [s for s in spans if s.parent_span_id and (s.trace_id, s.parent_span_id) not in keys]


def wait_for_run(jaeger: Any, spans: list[SpanData], timeout: float = 60) -> dict[str, bytes]:
    """Wait until Jaeger holds every trace of the file with all its spans; the raw answers."""
    want = Counter(s.trace_id for s in spans)
    answers: dict[str, bytes] = {}
    deadline = time.monotonic() + timeout
    for trace_id, n in want.items():
        while True:
            url = f"{jaeger.query_url}/api/v3/traces/{trace_id}"
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    body = response.read()
            except OSError:
                body = b""
            got = len(parse_jaeger(body)) if body else 0
            if got >= n:
                answers[trace_id] = body
                break
            assert time.monotonic() < deadline, f"trace {trace_id}: {got} of {n} spans"
            time.sleep(0.2)
    return answers


def check_traces(spans: list[SpanData], answers: dict[str, bytes], budget: int = 10_000) -> None:
    """Every trace within the span budget and Tempo's bytes limit, no span without its parent."""
    per_trace = Counter(s.trace_id for s in spans)
    assert max(per_trace.values()) <= budget
    for trace_id, body in answers.items():
        assert len(body) <= TEMPO_TRACE_BYTES  # Jaeger's JSON: larger than the OTLP protobuf
        got = parse_jaeger(body)
        assert len(got) == per_trace[trace_id]
        assert not orphans(got), Counter(s.name for s in orphans(got))


@pytest.fixture
def run_id() -> str:
    return f"long-{uuid.uuid4().hex[:12]}"


def test_sf_shaped_run_without_an_iteration_block(jaeger: Any, jaeger_service: str,
                                                  run_id: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # The rollout workers start together and run at least 0.6 s: a kept window (every 2nd of
    # 0.2 s) lies whole inside that time, whatever the machine's load does to their start.
    run_workload("sf", out, "n=100000", "workers=2", "min_s=0.6", f"run_id={run_id}",
                 f"service_name={jaeger_service}", f"endpoint={jaeger.otlp_http_endpoint}",
                 "window=0.2", "sample_every=2", "flush_interval=0.2")
    written = json.loads((out / "timers.json").read_text())
    assert blocks(written) - 1 >= 200_000
    spans = read_otlp_json_file(out / "spans.otlp.jsonl")
    per_trace = Counter(s.trace_id for s in spans)
    windows = [s for s in spans if s.attributes.get(semconv.KIND) == "window"]
    # A modest number of traces: the run trace and the kept windows, never one per block.
    assert len(per_trace) == 1 + len(windows) <= 20
    assert not orphans(spans)
    # A kept window is a slice of the whole run: all three processes in one trace.
    pids = Counter(len({s.resource[semconv.PROCESS_PID] for s in spans
                        if s.trace_id == w.trace_id}) for w in windows)
    assert max(pids) == 3
    # Gauges over time: every window span and aggregate span carries the gauges as they were.
    key = f"{semconv.GAUGE_PREFIX}reward.value"
    series = [s.attributes[key] for s in sorted(windows, key=lambda s: s.start_ns)
              if key in s.attributes]
    assert len(series) >= len(windows) - 1 and series == sorted(series)
    aggregates = [s for s in spans if s.attributes.get(semconv.KIND) == "aggregate"
                  and key in s.attributes]
    assert aggregates[-1].attributes[key] == written["gauges"]["reward"]["value"]
    answers = wait_for_run(jaeger, spans)
    check_traces(spans, answers)
    # The exact tree from the file and from Jaeger by run id.
    rc, from_file, err = tree_cli(str(out / "spans.otlp.jsonl"))
    assert rc == 0, err
    assert_same_tree(from_file, written)
    rc, from_jaeger, err = tree_cli("--jaeger", jaeger.query_url, "--run-id", run_id)
    assert rc == 0, err
    assert_same_tree(from_jaeger, written)
    env_steps = find(from_jaeger, "env_step")
    assert env_steps and all(node["is_parallel"] for node in env_steps)


def find(tree: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = [tree["children"][name]] if name in tree.get("children", {}) else []
    for child in tree.get("children", {}).values():
        found += find(child, name)
    return found


def test_ml_agents_shaped_run_and_partial_trees_from_jaeger(jaeger: Any, jaeger_service: str,
                                                            run_id: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_workload("ml", out, "n=70000", f"run_id={run_id}", f"service_name={jaeger_service}",
                 f"endpoint={jaeger.otlp_http_endpoint}", *WINDOWED)
    written = json.loads((out / "timers.json").read_text())
    assert blocks(written) - 1 >= 200_000
    spans = read_otlp_json_file(out / "spans.otlp.jsonl")
    answers = wait_for_run(jaeger, spans)
    check_traces(spans, answers)
    rc, from_jaeger, err = tree_cli("--jaeger", jaeger.query_url, "--run-id", run_id)
    assert rc == 0, err
    assert_same_tree(from_jaeger, written)
    # The run trace by its id is the same exact tree...
    run_trace = f"{derive_trace_id(run_id, 'run'):032x}"
    rc, by_trace, err = tree_cli("--jaeger", jaeger.query_url, "--trace-id", run_trace)
    assert rc == 0, err
    assert_same_tree(by_trace, written)
    # ...while one window's trace is a sample of the run: flagged, exit status 3.
    window = next(s for s in spans if s.attributes.get(semconv.KIND) == "window")
    rc, partial, err = tree_cli("--jaeger", jaeger.query_url, "--trace-id", window.trace_id)
    assert rc == 3
    assert partial is not None and partial["complete"] is False
    assert "window" in err
    advance = partial["children"]["start_learning"]["children"]["advance"]
    assert 0 < advance["count"] < 70_000


def wait_for_change(path: Path, after: float, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        if mtime > after:
            return mtime
        time.sleep(0.005)
    raise AssertionError(f"{path} not rewritten")


def test_sigkilled_run_tree_from_jaeger_is_its_last_periodic_timers_json(
        jaeger: Any, jaeger_service: str, run_id: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.long_workloads", "killed", str(out), f"run_id={run_id}",
         f"service_name={jaeger_service}", f"endpoint={jaeger.otlp_http_endpoint}",
         "timers_interval=0.5", *WINDOWED], cwd=REPO, env=env(), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        timers = out / "timers.json"
        versions = []  # each periodic timers.json as it was written
        seen = 0.0
        for _ in range(3):
            seen = wait_for_change(timers, seen)
            versions.append(json.loads(timers.read_text()))
        # Right after a periodic rewrite: its aggregate was handed to the OTLP sink just
        # before it, but the sink sends on its own thread, so the kill may catch that request
        # unsent (the ledger's "killed main"): Jaeger then holds the one before.
        proc.kill()
    finally:
        proc.kill()
        proc.wait(30)
    last = json.loads((out / "timers.json").read_text())
    if last != versions[-1]:
        versions.append(last)
    deadline = time.monotonic() + 30
    while True:  # until Jaeger has stored one of the last two aggregates exported
        rc, from_jaeger, err = tree_cli("--jaeger", jaeger.query_url, "--run-id", run_id)
        matching = [v for v in versions[-2:]
                    if from_jaeger is not None and from_jaeger.get("metadata") == v["metadata"]]
        if matching and (matching[-1] is versions[-1] or time.monotonic() > deadline - 20):
            written = matching[-1]
            break
        assert time.monotonic() < deadline, err
        time.sleep(0.3)
    assert rc == 3, err  # the run did not finish: not the whole run, and it says so
    assert from_jaeger is not None and from_jaeger["complete"] is False
    del from_jaeger["complete"], from_jaeger["notes"]
    # The periodic timers.json says it too (issue 16: the main process never finished).
    assert written.pop("complete") is False
    assert "the main process never finished" in written.pop("notes")[0]
    assert_same_tree(from_jaeger, written)
    assert from_jaeger == written
    rc, _, err = tree_cli("--jaeger", jaeger.query_url, "--run-id", run_id,
                          "--allow-partial")
    assert rc == 0, err


def test_sigterm_exports_open_blocks_cut_short_and_leaves_no_orphans(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.long_workloads", "killed", str(out), *WINDOWED],
        cwd=REPO, env=env(), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(1.6)  # a few windows, some kept
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        proc.kill()
    spans = read_otlp_json_file(out / "spans.otlp.jsonl")
    assert not orphans(spans), Counter(s.name for s in orphans(spans))
    cut = {s.name for s in spans if s.attributes.get(semconv.CUT_SHORT)}
    assert {"main_loop", "trainer_loop"} <= cut
    written = json.loads((out / "timers.json").read_text())
    rc, from_file, err = tree_cli(str(out / "spans.otlp.jsonl"))
    assert rc == 0, err
    assert from_file == written


def test_two_machines_sharing_only_a_run_id_come_back_as_one_tree(
        jaeger: Any, jaeger_service: str, run_id: str, tmp_path: Path) -> None:
    import otel_rl
    from otel_rl.timers import hierarchical_timer

    otel_rl.configure(output_dir=str(tmp_path / "a"), run_id=run_id,
                      service_name=jaeger_service, endpoint=jaeger.otlp_http_endpoint)
    with hierarchical_timer("launch"):
        carrier = otel_rl.get_context()
        machine_b = subprocess.run(
            [sys.executable, "-m", "tests.long_workloads", "machine", str(tmp_path / "b"),
             "n=3000", f"service_name={jaeger_service}", f"endpoint={jaeger.otlp_http_endpoint}"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**env(), "CARRIER": json.dumps(carrier)})
        assert machine_b.returncode == 0, machine_b.stderr
        with hierarchical_timer("local_work"):
            pass
    otel_rl.shutdown()
    written_a = json.loads((tmp_path / "a" / "timers.json").read_text())
    assert "remote_block" not in written_a["children"]["launch"].get("children", {})
    # Machine B exported on its own (no relay): its own files, its own pid.
    b_spans = read_otlp_json_file(next((tmp_path / "b").glob("spans*.jsonl")))
    assert {s.resource[semconv.RUN_ID] for s in b_spans} == {run_id}
    a_spans = read_otlp_json_file(tmp_path / "a" / "spans.otlp.jsonl")
    wait_for_run(jaeger, a_spans + b_spans)
    rc, tree, err = tree_cli("--jaeger", jaeger.query_url, "--run-id", run_id)
    assert rc == 0, err
    launch = tree["children"]["launch"]
    remote = launch["children"]["remote_block"]
    assert remote["count"] == 3000 and remote["is_parallel"]
    assert remote["children"]["remote_inner"]["count"] == 3000
    assert launch["children"]["local_work"]["count"] == 1
    assert tree["total"] == written_a["total"]
    b_pid = b_spans[0].resource[semconv.PROCESS_PID]
    assert [w["path"] for w in tree["workers"] if w["pid"] == b_pid] == [["launch"]]


def test_long_demo_run_under_the_default_policy(jaeger: Any, jaeger_service: str,
                                                tmp_path: Path) -> None:
    """`otel-rl demo` (env worker processes, the trainer's `advance` iterations) for a long
    run: a modest number of traces within the limits, no span without its parent, and the
    exact tree from the file and from Jaeger by the run id the demo prints."""
    environ = {**env(), "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
               "OTEL_SERVICE_NAME": jaeger_service, "OTEL_RL_WINDOW": "0.5",
               "OTEL_RL_SAMPLE_EVERY": "3"}
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "demo", "--workers", "2",
                           "--steps", "60000", "--output", str(tmp_path), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, env=environ, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = next(line.split()[2] for line in proc.stdout.splitlines()
                  if line.startswith("Run id:"))
    logs = tmp_path / "demo" / "run_logs"
    written = json.loads((logs / "timers.json").read_text())
    spans = read_otlp_json_file(logs / "spans.otlp.jsonl")
    windows = [s for s in spans if s.attributes.get(semconv.KIND) == "window"]
    assert len({s.trace_id for s in spans}) == 1 + len(windows) >= 3
    assert len({s.resource[semconv.PROCESS_PID] for s in spans}) == 3
    assert not orphans(spans)
    answers = wait_for_run(jaeger, spans)
    check_traces(spans, answers)
    rc, from_file, err = tree_cli(str(logs / "spans.otlp.jsonl"))
    assert rc == 0, err
    assert from_file == written
    rc, from_jaeger, err = tree_cli("--jaeger", jaeger.query_url, "--run-id", run_id)
    assert rc == 0, err
    assert_same_tree(from_jaeger, written)
