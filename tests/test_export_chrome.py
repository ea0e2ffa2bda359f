"""``otel-rl export SPANS --format chrome``: the Chrome trace-event format (issue 18), checked
against the format's documented schema, on a real multi-process run's spans file, streamed."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from otel_rl._internal.cli import main

REPO = Path(__file__).resolve().parents[1]
STEPS = 12

#: The Trace Event Format (Google's "Trace Event Format" document, JSON Object Format): the
#: object holds ``traceEvents``; every event has name, ph, pid, tid; complete events ('X')
#: have ts and dur in microseconds; metadata events ('M') named process_name / thread_name /
#: process_sort_index carry their value in args.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/$defs/event"}},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
    "$defs": {
        "event": {
            "type": "object",
            "required": ["name", "ph", "pid", "tid"],
            "properties": {
                "name": {"type": "string"}, "cat": {"type": "string"},
                "ph": {"enum": ["X", "M"]},
                "pid": {"type": "integer"}, "tid": {"type": "integer"},
                "ts": {"type": "number"}, "dur": {"type": "number", "minimum": 0},
                "args": {"type": "object"}, "cname": {"type": "string"},
            },
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}},
                 "then": {"required": ["ts", "dur"]}},
                {"if": {"properties": {"ph": {"const": "M"}}},
                 "then": {"properties": {
                     "name": {"enum": ["process_name", "thread_name", "process_sort_index",
                                       "thread_sort_index", "process_labels"]}},
                     "required": ["args"]}},
            ],
        },
    },
}


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's spans file: the metrics workload (main process + 2 forked pool workers),
    every block a span, files only."""
    out = tmp_path_factory.mktemp("chrome") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
                "OTEL_RL_SPANS": "all", "OTEL_RL_OUTPUT_DIR": str(out),
                "OTEL_SERVICE_NAME": "chrome-test"})
    done = subprocess.run([sys.executable, "-m", "tests.metrics_workload", str(STEPS), "3"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "spans.otlp.jsonl"


def _assert_nested(complete: list[dict[str, Any]]) -> None:
    """Blocks of one thread nest (the viewers draw them as a stack)."""
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in complete:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for intervals in by_thread.values():
        intervals.sort(key=lambda iv: (iv[0], -iv[1]))
        stack: list[float] = []
        for start, end in intervals:
            while stack and start >= stack[-1] - 1e-3:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, "overlapping blocks on one thread"
            stack.append(end)


def test_a_windowed_auto_runs_trace_nests_too(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Under `auto` the file holds window spans and continuations of long blocks in later
    kept windows: left out, so each thread's blocks still nest."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
                "OTEL_RL_SPANS": "auto", "OTEL_RL_WINDOW": "0.2", "OTEL_RL_SAMPLE_EVERY": "2",
                "OTEL_RL_FLUSH_INTERVAL": "0.1", "OTEL_RL_OUTPUT_DIR": str(out)})
    done = subprocess.run([sys.executable, "-m", "tests.metrics_workload", "20", "5"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    spans = [json.loads(line) for line in (out / "spans.otlp.jsonl").read_text().splitlines()]
    text = json.dumps(spans)
    assert "otel_rl.continuation" in text and '"window' in text  # what is left out is there
    code, err = _export(out / "spans.otlp.jsonl", tmp_path / "trace.json", capsys)
    assert code == 0, err
    trace = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    jsonschema.validate(trace, SCHEMA)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert complete and not any(e["name"].startswith("window ") for e in complete)
    assert not any(e["args"].get("otel_rl.continuation") for e in complete)
    _assert_nested(complete)


def _export(spans: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["export", str(spans), "--format", "chrome", "-o", str(out)])
    return code, capsys.readouterr().err


def test_a_runs_trace_matches_the_schema_with_a_track_per_process_and_thread(
        spans_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    code, err = _export(spans_file, out, capsys)
    assert code == 0, err
    trace = json.loads(out.read_text(encoding="utf-8"))
    jsonschema.validate(trace, SCHEMA)
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    thread_names = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    # Every track is named, once.
    assert len([e for e in events if e["name"] == "process_name"]) == len(process_names)
    assert {(e["pid"], e["tid"]) for e in complete} == thread_names
    assert set(process_names) == {e["pid"] for e in complete}
    # Three processes: the run's own and the two pool workers, named by role.
    assert len(process_names) == 3
    assert sum("chrome-test" in n and "(pid" in n for n in process_names.values()) == 3
    names = [e["name"] for e in complete]
    assert names.count("update") == STEPS and names.count("rollout") == 4 * STEPS
    assert names.count("main_loop") == 1 and "otel_rl.aggregate" not in names
    _assert_nested(complete)
    # The update blocks are in the main loop's process and thread.
    main_loop = next(e for e in complete if e["name"] == "main_loop")
    assert all((e["pid"], e["tid"]) == (main_loop["pid"], main_loop["tid"])
               for e in complete if e["name"] == "update")
    assert all(len(e["args"]["span_id"]) == 16 for e in complete)


def _synthetic_spans(path: Path, lines: int, per_line: int) -> None:
    """A spans file of `lines` export requests of `per_line` spans each (one thread)."""
    with open(path, "w", encoding="utf-8") as f:
        t = 1_700_000_000_000_000_000
        for i in range(lines):
            spans = []
            for j in range(per_line):
                start = t + (i * per_line + j) * 1000
                spans.append({"traceId": "1" * 32, "spanId": f"{i * per_line + j + 1:016x}",
                              "name": "step", "kind": 1, "startTimeUnixNano": str(start),
                              "endTimeUnixNano": str(start + 500),
                              "attributes": [{"key": "thread.id", "value": {"intValue": "7"}}]})
            f.write(json.dumps({"resourceSpans": [{"resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": "s"}},
                {"key": "process.pid", "value": {"intValue": "42"}}]},
                "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]}) + "\n")


def _peak(spans: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        code, err = _export(spans, out, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0, err
    return peak


def test_the_export_is_streamed_memory_does_not_grow_with_spans(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    _synthetic_spans(small, 20, 500)
    _synthetic_spans(big, 200, 500)  # 10x the spans
    small_peak = _peak(small, tmp_path / "small.json", capsys)
    big_peak = _peak(big, tmp_path / "big.json", capsys)
    trace = json.loads((tmp_path / "big.json").read_text(encoding="utf-8"))
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 100_000
    assert big_peak < 2 * small_peak, (small_peak, big_peak)


def test_bad_input_is_one_line_and_leaves_no_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spans = tmp_path / "spans.jsonl"
    _synthetic_spans(spans, 3, 10)
    with open(spans, "a", encoding="utf-8") as f:
        f.write('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5}]}]}]}\n')
    out = tmp_path / "trace.json"
    code, err = _export(spans, out, capsys)
    assert code == 4 and len(err.strip().splitlines()) == 1 and "line 4" in err
    assert not out.exists() and os.listdir(tmp_path) == ["spans.jsonl"]
    code, err = _export(tmp_path / "missing.jsonl", out, capsys)
    assert code == 4 and "missing.jsonl" in err and not out.exists()
    code, err = _export(spans, tmp_path, capsys)  # a folder as output: usage error
    assert code == 2


ENGINE_VERSION = "0.0.65"


@pytest.fixture(scope="session")
def trace_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chrome DevTools' trace engine from npm (@paulirish/trace_engine, pure JavaScript: it
    downloads nothing when it runs), installed once into the cache, for Node.js."""
    import shutil

    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed for the DevTools trace engine")
    root = Path(os.environ.get("OTEL_RL_CACHE_DIR", Path.home() / ".cache" / "otel-rl")) \
        / "node" / f"trace-engine-{ENGINE_VERSION}"
    engine = root / "node_modules" / "@paulirish" / "trace_engine"
    if not (engine / "analyze-trace.mjs").is_file():
        root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(root),
                               f"@paulirish/trace_engine@{ENGINE_VERSION}"],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return engine


def test_chrome_devtools_trace_engine_reads_the_trace(
        spans_file: Path, trace_engine: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    code, err = _export(spans_file, out, capsys)
    assert code == 0, err
    ours = json.loads(out.read_text(encoding="utf-8"))["traceEvents"]
    done = subprocess.run(["node", str(REPO / "tests" / "chrome_trace_engine.mjs"),
                           str(trace_engine), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["generic"] is True  # not a Chrome browser trace: DevTools' generic view
    names = {e["pid"]: e["args"]["name"] for e in ours if e["name"] == "process_name"}
    assert {int(pid): name for pid, name in seen["processes"].items()} == names
    # Every thread track with all its blocks, nested into one tree per top-level block.
    expected: dict[tuple[int, int], list[str]] = {}
    for e in ours:
        if e["ph"] == "X":
            expected.setdefault((e["pid"], e["tid"]), []).append(e["name"])
    got = {(t["pid"], t["tid"]): sorted(t["entries"]) for t in seen["threads"]}
    assert got == {key: sorted(v) for key, v in expected.items()}
    by_thread = {(t["pid"], t["tid"]): t for t in seen["threads"]}
    main_loop = next(e for e in ours if e["name"] == "main_loop")
    main = by_thread[(main_loop["pid"], main_loop["tid"])]
    assert main["name"] == "MainThread" and main["roots"] == 1  # the run span holds it all
    assert sum(t["entries"].count("rollout") for t in seen["threads"]) == 4 * STEPS
