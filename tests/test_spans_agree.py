"""Spans and tree agree: a workload exported with policy `all` to a real local OTLP receiver
(HTTP and gRPC) arrives complete, with correct parent chains, and the tree rebuilt from the
received spans equals the timers.json written at shutdown."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import semconv
from otel_rl._internal.tree import Tree
from otel_rl._internal.treebuild import build_tree
from otel_rl.timers import hierarchical_timer, set_gauge, timed


def workload() -> int:
    """Returns the number of timed blocks it ran."""
    blocks = 0

    @timed
    def env_step() -> None:
        with hierarchical_timer("physics"):
            pass

    def trainer() -> None:
        nonlocal blocks
        for _ in range(4):
            with hierarchical_timer("update"):
                with hierarchical_timer("gradient"):
                    pass
            blocks += 2

    with hierarchical_timer("run_training.setup"):
        blocks += 1
    with hierarchical_timer("start_learning"):
        blocks += 1
        thread = threading.Thread(target=trainer, name="trainer-0")
        thread.start()
        for i in range(20):
            with hierarchical_timer("advance"):
                env_step()
                blocks += 3
                set_gauge("reward", float(i))
        try:
            with hierarchical_timer("save_model"):
                blocks += 1
                raise OSError("disk full")
        except OSError:
            pass
        thread.join()
    return blocks


def shape(node: dict[str, Any]) -> dict[str, Any]:
    return {"count": node["count"], "is_parallel": node.get("is_parallel", False),
            "children": {k: shape(v) for k, v in node.get("children", {}).items()}}


def assert_totals_close(a: dict[str, Any], b: dict[str, Any], path: str = "root") -> None:
    assert a["total"] == pytest.approx(b["total"], rel=1e-6, abs=2e-6), path
    for name, child in a.get("children", {}).items():
        assert_totals_close(child, b["children"][name], f"{path}/{name}")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_every_block_arrives_and_rebuilds_timers_json(protocol: str, otlp_receiver: Any,
                                                      tmp_path: Path) -> None:
    endpoint = otlp_receiver.http_endpoint if protocol == "http/protobuf" else otlp_receiver.grpc_endpoint
    otel_rl.configure(service_name="agree", endpoint=endpoint, protocol=protocol, spans="all",
                      output_dir=str(tmp_path), batch_size=16)
    blocks = workload()
    otel_rl.shutdown(timeout=20)

    spans = otlp_receiver.wait_for(blocks + 2)
    assert len(spans) == blocks + 2  # every block, the run span and its aggregate, nothing twice
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans)
    assert len({s.trace_id for s in spans}) == 1
    roots = [s for s in spans if not s.parent_span_id]
    assert [r.attributes[semconv.KIND] for r in roots] == ["run"]
    assert all(s.parent_span_id in ids for s in spans if s.parent_span_id)
    by_id = {s.span_id: s for s in spans}
    gradient = next(s for s in spans if s.name == "gradient")
    assert by_id[gradient.parent_span_id].name == "update"
    assert by_id[by_id[gradient.parent_span_id].parent_span_id].name == "start_learning"
    failed = next(s for s in spans if s.name == "save_model")
    assert failed.is_error and failed.events[0].attributes["exception.type"] == "OSError"
    resource = spans[0].resource
    assert resource["service.name"] == "agree"
    assert resource["process.pid"] == os.getpid()
    assert resource[semconv.RUN_ID]
    assert gradient.attributes["thread.name"] == "trainer-0"

    written = json.loads((tmp_path / "timers.json").read_text())
    rebuilt = build_tree(spans).to_dict()
    assert shape(rebuilt) == shape(written)
    assert_totals_close(rebuilt, written)
    assert rebuilt["gauges"]["reward"] == written["gauges"]["reward"]
    assert written["children"]["start_learning"]["children"]["update"]["is_parallel"] is True
    assert written["gauges"]["reward"] == {"value": 19.0, "min": 0.0, "max": 19.0, "count": 20}
    # The file sink wrote the same spans.
    Tree.from_dict(written)


def test_spans_file_rebuilds_the_same_tree(tmp_path: Path) -> None:
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file

    otel_rl.configure(spans="all", output_dir=str(tmp_path))
    blocks = workload()
    otel_rl.shutdown()
    spans = read_otlp_json_file(str(tmp_path / "spans.otlp.jsonl"))
    assert len(spans) == blocks + 2  # and the run span and the aggregate span
    written = json.loads((tmp_path / "timers.json").read_text())
    assert shape(build_tree(spans).to_dict()) == shape(written)


def test_standard_span_exporter_receives_every_block(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    tree_exporter = otel_rl.TimerTreeExporter()
    otel_rl.configure(spans="all", output_dir=str(tmp_path), exporters=[memory, tree_exporter])
    blocks = workload()
    otel_rl.shutdown()
    finished = memory.get_finished_spans()
    assert len(finished) == blocks + 2  # and the run span and the aggregate span
    assert {s.name for s in finished} >= {"advance", "physics", "gradient", "run"}
    written = json.loads((tmp_path / "timers.json").read_text())
    assert shape(tree_exporter.timer_tree()) == shape(written)


def test_the_tree_from_aggregate_spans_is_timers_json_without_a_dict_between(
        tmp_path: Path) -> None:
    # The read side builds the whole-run tree from the aggregate span as a `Tree` (no
    # timers.json dict in between): it says, and draws, exactly what timers.json says.
    from otel_rl._internal.readers.otlp_json import read_otlp_json_file
    from otel_rl.renderers import treeview

    otel_rl.configure(spans="all", output_dir=str(tmp_path))
    workload()
    otel_rl.shutdown()
    tree = build_tree(read_otlp_json_file(str(tmp_path / "spans.otlp.jsonl")))
    text = (tmp_path / "timers.json").read_text()
    from_file = Tree.from_json(text)
    assert tree.to_dict() == json.loads(text)
    assert tree.to_json() == from_file.to_json()
    for per_process in (False, True):
        assert (treeview.render(tree, per_process=per_process)
                == treeview.render(from_file, per_process=per_process))
