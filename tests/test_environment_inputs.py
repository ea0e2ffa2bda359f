"""Environment values as input: malformed ones warn once, naming the variable, then fall back;
a traced CI job's TRACEPARENT and OTEL_SDK_DISABLED leave ``otel-rl demo`` working."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_rl._internal import config

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


#: Values no setting takes, and the ones that only some refuse.
HOSTILE_VALUES = ["garbage", " ", "-1", "0", "nan", "inf", "1e999", "9" * 30, "\x7f", "é",
                  "x" * 100_000, "[1]", "a=b%0D%0AX: y", "http://[::1", "http://h:99999", "ftp://h:1"]  # fmt: skip


def test_every_setting_refuses_a_hostile_environment_value_with_one_bounded_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every row of the settings table, every hostile value: the value either parses, or the
    setting keeps its default with one warning that names the variable and stays short (a value
    can be 100,000 characters long). Never an exception out of `resolve`."""
    checked = 0
    for setting in config.TABLE:
        for var in setting.env:
            for value in HOSTILE_VALUES:
                try:
                    setting.parse(value)
                    continue  # a value this setting takes
                except ValueError:
                    pass
                config._warned.clear()
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="otel_rl"):
                    settings = config.resolve({}, {var: value})
                lines = [r.getMessage() for r in caplog.records]
                assert len(lines) == 1 and f"ignoring {var}=" in lines[0], (var, value, lines)
                assert len(lines[0]) <= 250, (var, len(lines[0]))
                if setting.name not in ("service_name", "run_id"):  # derived when unset
                    assert getattr(settings, setting.name) == setting.default, (var, value)
                checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    ("var", "value"),
    [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:99999"),
     ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://h:1"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a b:1"),
     ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost"), ("OTEL_EXPORTER_OTLP_HEADERS", "a=b%0D%0AX: y"),
     ("OTEL_EXPORTER_OTLP_HEADERS", "bad key=v"), ("OTEL_RL_WORKER_INDEX", "-3"),
     ("OTEL_RL_WORKER_INDEX", "99999999999999999999999")],
)  # fmt: skip
def test_values_that_would_fail_later_are_refused_where_they_are_read(var: str, value: str) -> None:
    """An endpoint no transport can use, a header no request can carry, a worker index no
    span can hold: refused (with the variable named) when read, not when the first export or
    report fails."""
    setting = next(s for s in config.TABLE if var in s.env)
    with pytest.raises(ValueError):
        setting.parse(value)


def test_good_endpoints_headers_and_indices_still_parse() -> None:
    by_name = {s.name: s for s in config.TABLE}
    for endpoint in ("http://127.0.0.1:4318", "https://otel.example:443/v1/traces", "localhost:4317",
                     "http://[::1]:4318", "none", "OFF"):  # fmt: skip
        assert by_name["endpoint"].parse(endpoint) == endpoint
    assert by_name["headers"].parse("Authorization=Bearer%20x,x-tenant=a") == {
        "Authorization": "Bearer x", "x-tenant": "a"}  # fmt: skip
    assert by_name["worker_index"].parse(" 7 ") == 7


def test_huge_intervals_and_counts_are_refused_where_read_not_in_the_exporters_thread(
    tmp_path: Path,
) -> None:
    """A flush interval of 1e20 s overflowed the OS timer inside the exporter's thread (a
    traceback in the middle of training); now it is a malformed value like any other."""
    program = tmp_path / "prog.py"
    program.write_text("import otel_rl.timers as t\nwith t.hierarchical_timer('a'):\n    pass\n"
                       "print('PROGRAM-OK')\n")  # fmt: skip
    huge = {"OTEL_RL_FLUSH_INTERVAL": "1e20", "OTEL_BSP_SCHEDULE_DELAY": "9" * 25,
            "OTEL_RL_MAX_BUFFER": "9" * 25, "OTEL_RL_SHUTDOWN_TIMEOUT": "1e300"}  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}
    done = subprocess.run(
        [sys.executable, "-m", "otel_rl", "run", "--output", str(tmp_path / "out"), "--",
         sys.executable, str(program)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**clean, **huge, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0 and "PROGRAM-OK" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    for name in huge:
        assert sum(f"ignoring {name}=" in line for line in done.stderr.splitlines()) == 1, name


@pytest.mark.parametrize(
    "extra",
    ["[" * 60_000 + "]" * 60_000, '{"pid": 1e999}', '{"relay": 5}', '{"budget": "x"}',
     '{"role": [1]}', '{"index": true}', '{"offset": "0"}', '{"run": ["zz", "1"]}'],
)  # fmt: skip
def test_a_hostile_otel_rl_context_is_ignored_not_raised(extra: str) -> None:
    """OTEL_RL_CONTEXT nested 60,000 deep (a RecursionError: `otel-rl demo` ended with an
    internal error before training), a number out of range, fields of the wrong types: the
    otel_rl part is ignored with one warning and the traceparent is still continued."""
    from otel_rl._internal import carrier

    ctx = carrier.parse({"traceparent": f"00-{TRACE}-{PARENT}-01", "otel_rl": extra})
    assert ctx is not None and ctx.external and ctx.trace_id == int(TRACE, 16)
