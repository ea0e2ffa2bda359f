"""The public surface is deliberate: these lists change only on purpose."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import otel_rl
import otel_rl.testing
import otel_rl.timers
import otel_rl.timing


def test_top_level_names_are_pinned() -> None:
    assert otel_rl.__all__ == sorted(otel_rl.__all__)
    assert otel_rl.__all__ == [
        "SpanData", "ThreadAttributesSpanProcessor", "TimerTreeExporter", "Tree", "TreeNode",
        "UserError", "__version__", "attach_context", "build_tree", "configure",
        "context_from_env", "fetch_jaeger", "fetch_tempo", "force_flush", "get_context",
        "inject_env", "read_spans_file", "shutdown",
    ]
    for name in otel_rl.__all__:
        assert getattr(otel_rl, name) is not None
        if name != "__version__":
            assert getattr(otel_rl, name).__doc__, f"{name} has no docstring"


def test_the_read_side_rebuilds_the_tree_a_run_wrote(tmp_path: Path) -> None:
    from otel_rl.timers import hierarchical_timer

    otel_rl.configure(spans="all", output_dir=str(tmp_path), propagate=False)
    for _ in range(3):
        with hierarchical_timer("advance"):
            with hierarchical_timer("env_step"):
                pass
    otel_rl.shutdown()
    spans = otel_rl.read_spans_file(tmp_path / "spans.otlp.jsonl")
    assert all(isinstance(span, otel_rl.SpanData) for span in spans)
    tree = otel_rl.build_tree(spans)
    assert isinstance(tree, otel_rl.Tree) and isinstance(tree.root, otel_rl.TreeNode)
    written = otel_rl.Tree.from_json((tmp_path / "timers.json").read_text(encoding="utf-8"))
    for found in (tree, written):
        node = found.find(["advance", "env_step"])
        assert node is not None and node.count == 3
    with pytest.raises(otel_rl.UserError):
        otel_rl.read_spans_file(tmp_path / "timers.json")  # not a spans file: one-line error


def test_timers_names_are_pinned() -> None:
    assert sorted(otel_rl.timers.__all__) == [
        "GaugeNode", "TIMER_FORMAT_VERSION", "TimerNode", "TimerStack", "add_metadata",
        "get_timer_root", "get_timer_stack_for_thread", "get_timer_tree", "hierarchical_timer",
        "merge_gauges", "reset_timers", "set_gauge", "timed",
    ]


def test_timing_names_match_sample_factory() -> None:
    for name in ("Timing", "TimingContext", "TimingTreeNode", "AvgTime", "init_global_profiler"):
        assert hasattr(otel_rl.timing, name)


def test_import_is_light() -> None:
    code = ("import sys, otel_rl, otel_rl.timers\n"
            "heavy = [m for m in ('opentelemetry.sdk', 'grpc', 'numpy', 'google.protobuf') if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_docstring_examples_run() -> None:
    for module in (otel_rl.timers, otel_rl.testing):
        failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert tried > 0 and failures == 0, module.__name__


def test_package_ships_type_information() -> None:
    from importlib import resources

    assert resources.files("otel_rl").joinpath("py.typed").is_file()
