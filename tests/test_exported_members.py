"""The public surface is deliberate: these lists change only on purpose."""

from __future__ import annotations

import doctest
import subprocess
import sys

import otel_rl
import otel_rl.testing
import otel_rl.timers
import otel_rl.timing


def test_top_level_names_are_pinned() -> None:
    assert otel_rl.__all__ == sorted(otel_rl.__all__)
    assert otel_rl.__all__ == [
        "ThreadAttributesSpanProcessor", "TimerTreeExporter", "__version__", "attach_context",
        "configure", "context_from_env", "force_flush", "get_context", "inject_env", "shutdown",
    ]
    for name in otel_rl.__all__:
        assert getattr(otel_rl, name) is not None
        if name != "__version__":
            assert getattr(otel_rl, name).__doc__, f"{name} has no docstring"


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
