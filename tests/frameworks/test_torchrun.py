"""torchrun (torch 2.5.1, in the Ray venv) under ``otel-rl run``: each rank joins the run as
role ``rank`` with its index, and two torchrun nodes rendezvousing on localhost share one run
id derived from the rendezvous id, each exporting on its own to a real Jaeger, whose run trace
gives back one tree holding both nodes' ranks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal.aggregates import run_trace_id
from tests.fixtures.jaeger import free_port, spans_of
from tests.frameworks.conftest import (
    Venv,
    assert_tree_from_spans_equals_timers_json,
    load,
    node_at,
    span_lines,
)

HERE = Path(__file__).resolve().parent
STEPS = 3


@pytest.fixture(scope="module")
def torch_venv(venvs: Any) -> Venv:
    return venvs("ray")  # torch 2.5.1 (torchrun) is there, beside Ray


def _workdir(tmp_path: Path) -> Path:
    shutil.copy(HERE / "torchrun_train.py", tmp_path / "torchrun_train.py")
    return tmp_path


def test_each_rank_joins_the_run_as_role_rank_with_its_index(torch_venv: Venv,
                                                             tmp_path: Path) -> None:
    root = _workdir(tmp_path)
    out = root / "out"
    done = torch_venv.run(torch_venv.bin / "otel-rl", "run", "--spans", "all", "--output", out,
                          "--", "torchrun", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), "torchrun_train.py", str(STEPS),
                          cwd=root, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "rank 0 of 2" in done.stdout and "rank 1 of 2" in done.stdout
    tree = load(out / "timers.json")
    assert sorted((w["role"], w["index"], w["path"]) for w in tree["workers"]) == \
        [("rank", 0, []), ("rank", 1, [])]
    train = node_at(tree, "train")
    assert train["count"] == 2 and train["is_parallel"]
    assert node_at(tree, "train", "step", "all_reduce")["count"] == 2 * STEPS
    spans = list(span_lines(out / "spans.otlp.jsonl"))
    ranks = {(s["resource"].get("otel_rl.worker.role"), s["resource"].get("otel_rl.worker.index"),
              s["resource"]["process.pid"]) for s in spans if s["name"] == "all_reduce"}
    assert sorted((role, index) for role, index, _ in ranks) == [("rank", 0), ("rank", 1)]
    assert len({pid for _, _, pid in ranks}) == 2
    # The agent is the run's main process; the service is named after the training script.
    run_span = next(s for s in spans if s["attributes"].get("otel_rl.kind") == "run")
    assert "otel_rl.worker.role" not in run_span["resource"]
    assert {s["resource"]["service.name"] for s in spans} == {"torchrun_train"}
    assert_tree_from_spans_equals_timers_json(torch_venv, out, root)


def _tree_from_jaeger(venv: Venv, url: str, run_id: str, cwd: Path) -> dict[str, Any]:
    """`otel-rl tree --jaeger --run-id`, once Jaeger holds every node's final aggregate."""
    deadline = time.monotonic() + 60
    while True:
        done = venv.run(venv.bin / "otel-rl", "tree", "--jaeger", url, "--run-id", run_id,
                        cwd=cwd, timeout=120)
        if done.returncode == 0:
            return dict(json.loads(done.stdout))
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.5)


#: Steps per rank in the two-node test (few: its time goes to starting torch six times).
TWO_NODE_STEPS = 2
#: Seconds torchrun's rendezvous may take in the two-node test (``join_timeout``).
RDZV_TIMEOUT = 420


def _communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """`proc`'s output; past `timeout`, it and its children (its session) are killed and
    their output so far is shown."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
        raise AssertionError(f"torchrun node still running after {timeout:g} s:\n"
                             + (stdout + stderr)[-3000:]) from None


@pytest.mark.jaeger
@pytest.mark.parametrize("node_rank", ["given", "from_the_rendezvous"])
def test_two_torchrun_nodes_are_one_run_in_jaeger(torch_venv: Venv, jaeger: Any,
                                                  tmp_path: Path, node_rank: str) -> None:
    """Two nodes, with ``--node-rank`` each, or without (c10d gives the node ranks at the
    rendezvous: the agent of the node that gets rank 1 joins node 0's run when it starts its
    ranks)."""
    root = _workdir(tmp_path)
    job = f"job-{uuid.uuid4().hex[:8]}"
    port = free_port()
    procs = []
    for node in (0, 1):
        # Nothing shared between the nodes but torchrun's arguments: own output folder each.
        # Robust under a loaded machine (six processes importing torch on two cores): node 0
        # hosts the rendezvous store, node 1 waits for it up to read_timeout; the rendezvous
        # may take up to join_timeout, below this test's own limit, so a rendezvous that
        # fails says so in torchrun's output instead of being cut off.
        conf = f"is_host={1 - node},join_timeout={RDZV_TIMEOUT},read_timeout=300"
        command = [str(torch_venv.bin / "otel-rl"), "run", "--spans", "all",
                   "--output", str(root / f"node{node}"), "--",
                   "torchrun", "--nnodes", "2",
                   *(["--node-rank", str(node)] if node_rank == "given" else []),
                   "--nproc-per-node", "2",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
                   "--rdzv-conf", conf,
                   "--rdzv-id", job, "torchrun_train.py", str(TWO_NODE_STEPS)]
        env = torch_venv.env(OTEL_RL_ENDPOINT=jaeger.otlp_http_endpoint)
        procs.append(subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    outputs = [_communicate(proc, RDZV_TIMEOUT + 120) for proc in procs]
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, (stdout + stderr)[-3000:]
    assert sum(stdout.count(" of 4 ") for stdout, _ in outputs) == 4
    run_id = f"torchrun-{job}"
    # Node 0 is the run; node 1 joined it (its own files are a worker's, and no report).
    # Without --node-rank, either invocation may get node rank 0.
    first, second = root / "node0", root / "node1"
    if node_rank != "given" and not (first / "timers.json").exists():
        first, second = second, first
    assert sorted(p.name for p in first.iterdir() if p.name in ("timers.json", "report.html")) \
        == ["report.html", "timers.json"]
    assert load(first / "timers.json")["metadata"]["otel_rl_run_id"] == run_id
    node1_files = sorted(p.name for p in second.iterdir())
    assert not any(name in node1_files for name in ("timers.json", "report.html"))
    assert any(name.startswith("timers.") for name in node1_files), node1_files
    tree = _tree_from_jaeger(torch_venv, jaeger.query_url, run_id, root)
    assert tree.get("complete", True) is True and not tree.get("notes")
    assert sorted((w["role"], w["index"]) for w in tree["workers"]) == \
        [("rank", 0), ("rank", 1), ("rank", 2), ("rank", 3)]
    assert node_at(tree, "train")["count"] == 4
    assert node_at(tree, "train", "step", "all_reduce")["count"] == 4 * TWO_NODE_STEPS
    # In the run trace, node 1's process span hangs under node 0's run span.
    trace = jaeger.get_trace(f"{run_trace_id(run_id):032x}")
    spans = spans_of(trace)
    run_span = next(s for s in spans if s["name"] == "run")
    node_span = next(s for s in spans if s["name"] == "process node")
    assert node_span["parentSpanId"] == run_span["spanId"]
    assert node_span["_resource"]["otel_rl.worker.index"] == 1
    hosts = {s["_resource"]["process.pid"] for s in spans if s["name"] == "all_reduce"}
    assert len(hosts) == 4  # every rank of both nodes
