"""``otel-rl tree`` run as a real subprocess: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import semconv
from tests.test_readers import _free_port, _Server, jaeger_doc, tempo_v2
from tests.test_sdk_exporter import otlp_request, run_sdk_workload, to_otlp_json

REPO = Path(__file__).resolve().parents[1]


def otel_rl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "otel_rl", "tree", *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("otel-rl tree: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def workload() -> tuple[dict[str, Any], list[Any], str]:
    exporter, spans = run_sdk_workload()
    return exporter.timer_tree(), spans, f"{spans[0].context.trace_id:032x}"


@pytest.fixture(scope="module")
def spans_file(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("spans") / "spans.jsonl"
    path.write_text(
        "".join(json.dumps(to_otlp_json(otlp_request([s]))) + "\n" for s in workload[1])
    )
    return path


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


def test_spans_file_to_stdout_is_the_exporters_tree(
    workload: tuple[dict[str, Any], list[Any], str], spans_file: Path
) -> None:
    result = otel_rl(str(spans_file))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout) == workload[0]
    assert result.stdout.startswith('{\n  "name": "root",\n  "total": ')


def test_output_file_and_stdin(
    workload: tuple[dict[str, Any], list[Any], str], spans_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "timers.json"
    result = otel_rl("-", "-o", str(out), stdin=spans_file.read_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert json.loads(out.read_text()) == workload[0]
    assert [p.name for p in tmp_path.iterdir()] == ["timers.json"]  # no temp file left


def test_jaeger_and_tempo_sources(
    workload: tuple[dict[str, Any], list[Any], str], server: _Server, tmp_path: Path
) -> None:
    expected, spans, trace_id = workload
    server.routes[f"/api/v3/traces/{trace_id}"] = (200, jaeger_doc(spans))
    server.routes[f"/api/v2/traces/{trace_id}"] = (200, tempo_v2(spans))
    for flag in ("--jaeger", "--tempo"):
        out = tmp_path / f"{flag[2:]}.json"
        result = otel_rl(flag, server.url, "--trace-id", trace_id, "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert json.loads(out.read_text()) == expected


def test_unknown_trace_id_is_a_one_line_error(server: _Server) -> None:
    result = otel_rl("--jaeger", server.url, "--trace-id", "abc123")
    assert_one_line_error(result, "not found in Jaeger")
    assert result.returncode == 4
    assert result.stdout == ""


def test_unreachable_server_is_a_one_line_error() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    result = otel_rl("--tempo", url, "--trace-id", "1" * 32, "--timeout", "2")
    assert_one_line_error(result, f"cannot reach Tempo at {url}")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"resourceSpans": []}\n{"resourceSpans": [}\n', "line 2: invalid JSON"),
        ('{"resourceSpans": []}\n{"resourceSpans": [{"scopeSpans"', "line 2: truncated record"),
        ('["not", "otlp"]\n', "expected an OTLP JSON object"),
        (
            json.dumps({"name": "root", "total": "fast", "count": 1}),
            "this is a timers.json, not spans",
        ),
        ("\n", "no spans in"),
    ],
)
def test_bad_spans_files_are_one_line_errors(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    out = tmp_path / "timers.json"
    result = otel_rl(str(path), "-o", str(out))
    assert_one_line_error(result, fragment)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "give exactly one of"),
        (("x.jsonl", "--jaeger", "http://127.0.0.1:1"), "give exactly one of"),
        (("--jaeger", "http://127.0.0.1:1"), "give one of --trace-id or --run-id"),
        (("--jaeger", "http://127.0.0.1:1", "--trace-id", "not-hex"), "bad trace ID"),
        (("missing.jsonl",), "no such file"),
    ],
)
def test_bad_arguments_are_one_line_errors(args: tuple[str, ...], fragment: str) -> None:
    assert_one_line_error(otel_rl(*args), fragment)


def _with_missing_parent(spans: list[Any]) -> str:
    """The workload's spans without the top-level span: its children lose their parent."""
    kept = [s for s in spans if s.name != "run_training"]
    return "".join(json.dumps(to_otlp_json(otlp_request([s]))) + "\n" for s in kept)


def test_missing_parent_writes_partial_tree_and_exits_3(
    workload: tuple[dict[str, Any], list[Any], str], tmp_path: Path
) -> None:
    path = tmp_path / "partial.jsonl"
    path.write_text(_with_missing_parent(workload[1]))
    out = tmp_path / "timers.json"
    result = otel_rl(str(path), "-o", str(out))
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    assert "parent span is not in the data" in result.stderr
    assert "--allow-partial" in result.stderr
    written = json.loads(out.read_text())
    assert written["complete"] is False and written["notes"]
    assert set(written["children"]) == {"env_step", "trainer_advance", "save_model"}

    allowed = otel_rl(str(path), "-o", str(out), "--allow-partial")
    assert allowed.returncode == 0
    assert "parent span is not in the data" in allowed.stderr


def test_sampled_iterations_exit_3(tmp_path: Path) -> None:
    trace = "ab" * 16
    line = {
        "resourceSpans": [
            {
                "resource": {"attributes": []},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace,
                                "spanId": "00000000000000" + "0" + str(i),
                                "name": "iteration",
                                "startTimeUnixNano": str(1000 * i),
                                "endTimeUnixNano": str(1000 * i + 500),
                                "attributes": [
                                    {"key": semconv.SAMPLED, "value": {"stringValue": "schedule"}}
                                ],
                            }
                            for i in range(1, 4)
                        ]
                    }
                ],
            }
        ]
    }
    path = tmp_path / "sampled.jsonl"
    path.write_text(json.dumps(line) + "\n")
    result = otel_rl(str(path))
    assert result.returncode == 3
    assert "3 iteration(s) were sampled (3 by schedule)" in result.stderr
    assert json.loads(result.stdout)["children"]["iteration"]["count"] == 3
