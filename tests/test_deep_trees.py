"""Valid traces thousands of levels deep (recursive code) go through every command.

Issue 12 found `RecursionError` at 500 levels; the readers, the tree model, the renderers and
the JSON writer now walk with explicit stacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_rl._internal import semconv
from otel_rl._internal.cli import main
from otel_rl._internal.otlp.requests import request_to_json_line
from otel_rl._internal.otlp.spans import encode_spans
from otel_rl._internal.readers.boundary import parse_json
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree

T0 = 1_700_000_000_000_000_000


def deep_spans(depth: int) -> list[SpanData]:
    """A run span and a chain of `depth` nested blocks, each 1 µs shorter than its parent."""
    trace = "ab" * 16
    resource = {semconv.SERVICE_NAME: "deep", semconv.PROCESS_PID: 7}
    end = T0 + 2_000 * depth + 10_000
    spans = [SpanData(trace, f"{1:016x}", "", "run", T0, end, {semconv.KIND: semconv.KIND_RUN}, resource)]
    for level in range(depth):
        spans.append(
            SpanData(
                trace,
                f"{level + 2:016x}",
                spans[-1].span_id,
                f"level{level}",
                T0 + 1_000 * (level + 1),
                end - 1_000 * (level + 1),
                {semconv.THREAD_ID: 1},
                resource,
            )
        )
    return spans


def write_spans(path: Path, spans: list[SpanData]) -> Path:
    path.write_text(request_to_json_line(encode_spans(spans)) + "\n", encoding="utf-8")
    return path


def chain_depth(tree: dict[str, object]) -> int:
    depth, node = 0, tree
    while "children" in node:
        (node,) = node["children"].values()  # type: ignore[attr-defined]
        depth += 1
    return depth


@pytest.mark.parametrize("depth", [500, 5000])
def test_tree_and_html_report_of_a_deep_valid_trace(
    depth: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans_file = write_spans(tmp_path / "spans.jsonl", deep_spans(depth))
    timers = tmp_path / "timers.json"
    assert main(["tree", str(spans_file), "-o", str(timers)]) == 0, capsys.readouterr().err
    written = parse_json(timers.read_text(encoding="utf-8"), "timers.json")  # json.loads recurses
    assert chain_depth(written) == depth
    assert Tree.from_dict(written).find([f"level{i}" for i in range(depth)]) is not None
    page = tmp_path / "report.html"
    assert main(["report", str(spans_file), "--html", str(page)]) == 0
    out, err = capsys.readouterr()
    assert f"level{depth - 1}" in out and f"[depth {depth}] " in out  # indentation cut, said
    assert err == f"wrote {page}\n"
    assert f"level{depth - 1}" in page.read_text(encoding="utf-8")


def test_deep_timers_json_through_report_diff_and_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans_file = write_spans(tmp_path / "spans.jsonl", deep_spans(5000))
    timers = tmp_path / "timers.json"
    assert main(["tree", str(spans_file), "-o", str(timers)]) == 0
    assert main(["report", str(timers)]) == 0
    assert main(["diff", str(timers), str(timers)]) == 0
    imported = tmp_path / "imported.jsonl"
    assert main(["import", str(timers), "--output", str(imported)]) == 0
    again = tmp_path / "again.json"
    assert main(["tree", str(imported), "-o", str(again)]) == 0
    capsys.readouterr()
    assert Tree.from_json(again.read_text()).root == Tree.from_json(timers.read_text()).root
