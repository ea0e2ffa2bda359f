"""Environment values as input: malformed ones warn once, naming the variable, then fall back;
a traced CI job's TRACEPARENT and OTEL_SDK_DISABLED leave ``otel-rl demo`` working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = (sys.executable, "-m", "otel_rl", "demo")
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"

#: Ten malformed values a shell or CI system might hand over.
MALFORMED = {
    "TRACEPARENT": "garbage",
    "OTEL_RL_SPANS": "bogus",
    "OTEL_RL_SPAN_BUDGET": "-5",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "abc",
    "OTEL_SDK_DISABLED": "maybe",
    "OTEL_RESOURCE_ATTRIBUTES": "novalue",
    "OTEL_BSP_SCHEDULE_DELAY": "inf",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
    "OTEL_RL_WORKER_INDEX": "x",
    "OTEL_RL_FLUSH_INTERVAL": "nan",
}


def _demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}
    return subprocess.run(
        [*DEMO, "--output", str(tmp_path), "--steps", "3000", "--workers", "1", "--quiet"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**clean, **env},
        timeout=300,
    )


def _spans(path: Path) -> list[dict[str, object]]:
    spans = []
    for line in path.read_text(encoding="utf-8").splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans.extend(ss["spans"])
    return spans


def test_demo_under_an_external_traceparent_is_the_runs_main_process(tmp_path: Path) -> None:
    done = _demo(tmp_path, TRACEPARENT=f"00-{TRACE}-{PARENT}-01")
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "demo" / "run_logs"
    assert (logs / "timers.json").is_file()
    assert not list(logs.glob("timers.*.json"))  # not mistaken for a worker
    run = [s for s in _spans(logs / "spans.otlp.jsonl") if s["name"] == "run"]
    assert len(run) == 1
    assert run[0]["traceId"] == TRACE and run[0]["parentSpanId"] == PARENT  # continues the job
    assert f"Trace ID:    {TRACE}" in done.stdout


def test_demo_with_otel_sdk_disabled_still_writes_the_timers(tmp_path: Path) -> None:
    done = _demo(tmp_path, OTEL_SDK_DISABLED="true")
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "demo" / "run_logs"
    tree = json.loads((logs / "timers.json").read_text(encoding="utf-8"))
    assert tree["children"]["TrainerController.start_learning"]["count"] == 1
    assert not (logs / "spans.otlp.jsonl").exists()
    assert (logs / "report.html").is_file()
    assert "Trace ID" not in done.stdout and "no spans" in done.stdout


def test_malformed_environment_values_warn_once_each_naming_the_variable(tmp_path: Path) -> None:
    done = _demo(tmp_path, **MALFORMED)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for name, value in MALFORMED.items():
        lines = [line for line in done.stderr.splitlines() if f"ignoring {name}=" in line]
        assert len(lines) == 1, (name, done.stderr)
        assert repr(value) in lines[0] and len(lines[0]) <= 200
    assert (tmp_path / "demo" / "run_logs" / "timers.json").is_file()  # the defaults were used


def test_malformed_otel_rl_context_is_ignored_and_the_traceparent_still_joined(
    tmp_path: Path,
) -> None:
    done = _demo(tmp_path, TRACEPARENT=f"00-{TRACE}-{PARENT}-01", OTEL_RL_CONTEXT="{not json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("OTEL_RL_CONTEXT") == 1
    assert (tmp_path / "demo" / "run_logs" / "timers.json").is_file()
