"""`otel-rl report`: timers.json or spans file in, tree view (+ cross-worker view, HTML) out."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_rl._internal.cli import main
from otel_rl._internal.otlp.requests import request_to_json_line
from otel_rl._internal.otlp.spans import encode_spans
from otel_rl._internal.spandata import SpanData
from tests.test_renderers_html import mlagents_tree, run_spans

REPO = Path(__file__).resolve().parent.parent


def _spans_file(path: Path, spans: list[SpanData], batch: int = 40) -> Path:
    """An OTLP-JSON lines file as the Collector's file exporter writes it, several requests."""
    lines = [
        request_to_json_line(encode_spans(spans[i : i + batch]))
        for i in range(0, len(spans), batch)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_prints_the_tree_view_of_a_timers_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "timers.json"
    path.write_text(mlagents_tree().to_json(), encoding="utf-8")
    code, out, err = _report(capsys, str(path))
    assert code == 0, err
    assert out.splitlines()[0].split() == ["block", "total", "self", "count", "mean", "%", "parent"]
    assert re.search(r"^   ├─ communicator\.exchange .* 4 ", out, re.M)
    assert "∥ thread_root" in out
    assert "reward.mean" in out and "run_id: ppo-7" in out
    assert "workers" not in out  # no cross-worker section without workers


def test_report_rebuilds_the_tree_from_a_spans_file_and_merges_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = run_spans()
    code, out, err = _report(capsys, str(_spans_file(tmp_path / "spans.jsonl", spans)))
    assert code == 0, err
    assert re.search(r"├─ env_step\s+168\.00 ms .* 12 ", out)
    assert re.search(r"∥ rollout_step\s+408\.00 ms .* 36 ", out)
    section = out[out.index("== rollout: 3 workers (pids 201, 202, 203), started under env_step") :]
    assert re.search(r"└─ rollout_step\s+3/3\s+108\.00 ms\s+136\.00 ms\s+180\.00 ms", section)
    assert "#2 (pid 203)" in section


def test_report_reads_gzip_spans_and_writes_html_with_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = run_spans(iterations=3)
    plain = _spans_file(tmp_path / "spans.jsonl", spans)
    packed = tmp_path / "spans.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    out_html = tmp_path / "report.html"
    code, out, err = _report(capsys, str(packed), "--html", str(out_html), "--title", "run 7")
    assert code == 0, err
    assert err.strip() == f"wrote {out_html}"
    page = out_html.read_text(encoding="utf-8")
    data = json.loads(
        page.split('<script id="report-data" type="application/json">')[1].split("</script>")[0]
    )
    assert data["title"] == "run 7"
    assert data["timeline"]["total"] == len(spans)
    assert len(data["timeline"]["lanes"]) == 5
    assert "env_step" in out


def test_report_html_from_timers_json_has_no_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "timers.json"
    path.write_text(mlagents_tree().to_json(), encoding="utf-8")
    out_html = tmp_path / "r.html"
    assert _report(capsys, str(path), "--html", str(out_html))[0] == 0
    page = out_html.read_text(encoding="utf-8")
    assert '"timeline":null' in page
    assert "<title>otel-rl report: timers.json</title>" in page


def test_per_process_and_workers_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spans_path = _spans_file(tmp_path / "spans.jsonl", run_spans(iterations=2))
    code, out, _ = _report(capsys, str(spans_path), "--per-process", "--ascii")
    assert code == 0
    assert out.isascii()
    assert out.startswith("== main process ==")
    assert "== worker rollout #0 (pid 201), started under env_step ==" in out
    main_section = out.split("\n== worker")[0]
    assert "rollout_step" not in main_section and "policy_forward" in main_section
    timers = tmp_path / "timers.json"
    timers.write_text(mlagents_tree().to_json(), encoding="utf-8")
    assert _report(capsys, str(timers), "--workers")[1].endswith(
        "no worker processes in this tree\n"
    )


def test_spans_with_missing_parents_give_an_incomplete_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Drop the update spans: their children's parents are missing.
    spans = [s for s in run_spans(iterations=2) if s.name != "update"]
    path = str(_spans_file(tmp_path / "spans.jsonl", spans))
    code, out, err = _report(capsys, path)
    assert code == 3  # partial: reported, with a banner, but not accepted silently
    assert out.startswith("INCOMPLETE")
    assert err.count("\n") == 1 and "--allow-partial" in err
    code, out, err = _report(capsys, path, "--allow-partial")
    assert code == 0 and out.startswith("INCOMPLETE") and err.startswith("otel-rl report: warning")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("", "empty file"),
        ("import os\n", "not a timers.json or an OTLP-JSON spans file"),
        ('{"name": "root", "total": 1.0, "count": "one"}', "root: 'count' must be an integer"),
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}\n', "traceId"),
        ('{"resourceSpans": []}\n{"resourceSp', "truncated"),
        ('{"resourceSpans": []}\n', "no spans in the file"),
    ],
)
def test_bad_input_is_a_one_line_error_exit_4(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "input.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    out_html = tmp_path / "r.html"
    result = subprocess.run(
        [sys.executable, "-m", "otel_rl", "report", str(path), "--html", str(out_html)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 4
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"otel-rl report: {path}")
    assert message in result.stderr
    assert not out_html.exists()


def test_unwritable_html_output_is_exit_5_before_printing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timers = tmp_path / "timers.json"
    timers.write_text(mlagents_tree().to_json(), encoding="utf-8")
    target = tmp_path / "missing-dir" / "r.html"
    code, out, err = _report(capsys, str(timers), "--html", str(target))
    assert code == 5
    assert out == ""
    assert err.startswith(f"otel-rl report: cannot write {target}")
