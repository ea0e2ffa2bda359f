"""Span policy: `all` exports every block, `auto` keeps every trace within its budget (whole
iterations sampled on a schedule, plus slow outliers), `off` exports none; the tree is exact
in all three."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import semconv
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.treebuild import build_tree
from otel_rl.timers import hierarchical_timer, timed

ITERATIONS = 400


@timed
def advance(i: int, slow: bool) -> None:
    with hierarchical_timer("env_step"):
        if slow:
            time.sleep(0.05)
    with hierarchical_timer("update"):
        pass


def run(tmp_path: Path, policy: str, slow_at: int | None = None, **settings: Any) -> tuple[dict[str, Any], list[SpanData]]:
    otel_rl.configure(spans=policy, output_dir=str(tmp_path), **settings)
    with hierarchical_timer("start_learning"):
        for i in range(ITERATIONS):
            advance(i, slow=i == slow_at)
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    spans_file = tmp_path / "spans.otlp.jsonl"
    spans = read_otlp_json_file(spans_file) if spans_file.exists() else []
    return tree, spans


def assert_exact(tree: dict[str, Any]) -> None:
    learning = tree["children"]["start_learning"]
    assert learning["count"] == 1
    adv = learning["children"]["advance"]
    assert adv["count"] == ITERATIONS
    assert adv["children"]["env_step"]["count"] == ITERATIONS
    assert adv["children"]["update"]["count"] == ITERATIONS


def test_all_exports_every_block(tmp_path: Path) -> None:
    tree, spans = run(tmp_path, "all", span_budget=50)
    assert_exact(tree)
    assert len(spans) == 1 + 1 + 3 * ITERATIONS
    assert len({s.trace_id for s in spans}) == 1
    assert build_tree(spans).complete


def test_off_exports_nothing_and_the_tree_is_exact(tmp_path: Path) -> None:
    tree, spans = run(tmp_path, "off")
    assert_exact(tree)
    assert spans == []


def test_auto_under_budget_is_everything(tmp_path: Path) -> None:
    tree, spans = run(tmp_path, "auto", span_budget=10_000)
    assert_exact(tree)
    assert len(spans) == 2 + 3 * ITERATIONS
    assert len({s.trace_id for s in spans}) == 1


def test_auto_keeps_every_trace_within_budget_and_samples_whole_iterations(tmp_path: Path) -> None:
    budget = 90
    tree, spans = run(tmp_path, "auto", span_budget=budget, sample_every=25, slow_at=300)
    assert_exact(tree)
    per_trace = Counter(s.trace_id for s in spans)
    assert max(per_trace.values()) <= budget
    run_span = next(s for s in spans if s.attributes.get(semconv.KIND) == "run")
    run_trace = run_span.trace_id
    assert per_trace[run_trace] == budget  # the run trace is filled to its budget, not beyond
    by_key = {(s.trace_id, s.span_id): s for s in spans}

    iteration_roots = [s for s in spans if s.trace_id != run_trace and not s.parent_span_id]
    assert iteration_roots, "no iteration was sampled"
    for root in iteration_roots:
        # A whole iteration: the root and all its blocks, in a trace of its own...
        members = [s for s in spans if s.trace_id == root.trace_id]
        if root.name == "advance":
            assert sorted(s.name for s in members) == ["advance", "env_step", "update"]
        # ...linked to the block it ran under in the run trace.
        assert len(root.links) == 1
        assert root.links[0] in by_key and root.links[0][0] == run_trace
        if root.name == "advance":
            assert by_key[root.links[0]].name == "start_learning"
        assert root.attributes[semconv.SAMPLED] in ("schedule", "outlier")

    sampled = Counter(r.attributes[semconv.SAMPLED] for r in iteration_roots if r.name == "advance")
    # Iterations past the budget: about ITERATIONS - 30 of them; one in 25 kept on schedule.
    assert 10 <= sampled["schedule"] <= 16
    # The slow iteration is kept as an outlier even though the schedule skipped it.
    slow = [r for r in iteration_roots if r.attributes[semconv.SAMPLED] == "outlier"]
    assert len(slow) >= 1
    assert max(r.duration_s for r in slow) >= 0.05
    # Outliers earn no more room than the schedule does.
    assert sampled["outlier"] <= sampled["schedule"] + 1
    # A tree from sampled spans says it is incomplete.
    rebuilt = build_tree(spans)
    assert not rebuilt.complete and rebuilt.notes


def test_auto_budget_is_shared_with_worker_processes(tmp_path: Path) -> None:
    import multiprocessing as mp

    from tests import mp_workloads as w

    budget = 60
    otel_rl.configure(spans="auto", output_dir=str(tmp_path), span_budget=budget)
    with hierarchical_timer("start_workers"):
        procs = [mp.get_context("spawn").Process(target=w.worker, args=(200,)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["children"]["start_workers"]["children"]["env_step"]["count"] == 600
    spans = read_otlp_json_file(tmp_path / "spans.otlp.jsonl")
    per_trace = Counter(s.trace_id for s in spans)
    assert max(per_trace.values()) <= budget


@pytest.mark.parametrize("policy", ["all", "auto", "off"])
def test_policy_from_environment(policy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RL_SPANS", policy)
    otel_rl.configure(output_dir=str(tmp_path))
    with hierarchical_timer("x"):
        pass
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert tree["metadata"]["otel_rl_spans"] == policy
    assert tree["children"]["x"]["count"] == 1
