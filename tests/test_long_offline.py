"""Long runs, offline and against a Tempo-shaped server: `otel-rl tree --tempo --run-id`
gives the exact tree from the run trace's aggregates (a window's trace alone is flagged
partial), and `otel-rl report` on a windowed run's file shows the exact tree with a timeline
that covers the whole run."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal.aggregates import derive_trace_id
from otel_rl.timers import hierarchical_timer
from tests.test_readers import _Server
from tests.trees import assert_tree_is_timers_json

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tempo() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


def windowed_run(out: Path, run_id: str) -> dict[str, Any]:
    otel_rl.configure(output_dir=str(out), run_id=run_id, window=0.05, sample_every=3,
                      flush_interval=0.05)
    with hierarchical_timer("start_learning"):
        until = time.monotonic() + 0.8
        while time.monotonic() < until:
            with hierarchical_timer("advance"):
                with hierarchical_timer("env_step"):
                    pass
    otel_rl.shutdown()
    return dict(json.loads((out / "timers.json").read_text()))


def tempo_traces(spans_file: Path) -> dict[str, dict[str, Any]]:
    """Tempo's /api/v2/traces answer per trace id, from the spans file (ids in base64)."""
    traces: dict[str, list[Any]] = {}
    for line in spans_file.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    copy = dict(span)
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if copy.get(key):
                            copy[key] = base64.b64encode(bytes.fromhex(copy[key])).decode()
                    traces.setdefault(span["traceId"], []).append(
                        {"resource": rs["resource"], "scopeSpans": [{"spans": [copy]}]})
    return {tid: {"trace": {"resourceSpans": rss}} for tid, rss in traces.items()}


def tree_cli(*args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "tree", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def test_tree_from_tempo_by_run_id_is_the_timers_json(tempo: _Server, tmp_path: Path) -> None:
    written = windowed_run(tmp_path / "run", "tempo-run-1")
    for trace_id, answer in tempo_traces(tmp_path / "run" / "spans.otlp.jsonl").items():
        tempo.routes[f"/api/v2/traces/{trace_id}"] = (200, answer)
    rc, tree, err = tree_cli("--tempo", tempo.url, "--run-id", "tempo-run-1")
    assert rc == 0, err
    assert_tree_is_timers_json(tree, written)
    run_trace = f"{derive_trace_id('tempo-run-1', 'run'):032x}"
    assert tempo.requests == [f"/api/v2/traces/{run_trace}"]  # by its derived id, no search
    window = f"{derive_trace_id('tempo-run-1', 'w0'):032x}"
    rc, partial, err = tree_cli("--tempo", tempo.url, "--trace-id", window)
    assert rc == 3 and partial["complete"] is False
    rc, _, err = tree_cli("--tempo", tempo.url, "--run-id", "no-such-run")
    assert rc != 0 and "not found" in err and len(err.strip().splitlines()) == 1


def test_report_on_a_windowed_run_shows_the_exact_tree_and_the_whole_run(
        tmp_path: Path) -> None:
    written = windowed_run(tmp_path / "run", "report-run-1")
    html = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "report",
                           str(tmp_path / "run" / "spans.otlp.jsonl"), "--html", str(html)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    page = html.read_text()
    start = page.index('<script id="report-data" type="application/json">') + 49
    data = json.loads(page[start:page.index("</script>", start)])
    # The exact tree (from the aggregates, not from the sampled windows)...
    learning = data["tree"]["k"][0]
    advance = next(k for k in learning["k"] if k["n"] == "advance")
    assert advance["c"] == written["children"]["start_learning"]["children"]["advance"]["count"]
    assert data["complete"] is True
    # ...and a timeline over the kept windows of the whole run, not only its first seconds.
    timeline = data["timeline"]
    assert timeline["shown"] > 0
    assert timeline["runEnd"] >= 0.7 * written["total"] * 1000
    markers = [row for row in timeline["spans"] if row[5] & 2]
    assert len(markers) >= 3  # the run span and window spans
