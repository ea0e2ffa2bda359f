"""GPU time for opted-in blocks, tested on a device-clock double (tests/gpu_double.py).

The double's clock moves only when a test (or the simulated program's own ``.item()``)
moves it, so these tests control when each event completes: late, out of order, or never.
What is checked is where GPU time ends up — the right block, thread, process, span and
timers.json entry — and that the training thread never waits for the device.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import gpu, recorder, semconv
from otel_rl._internal.readers.otlp_json import read_otlp_json_file
from otel_rl._internal.tree import Tree
from otel_rl._internal.treebuild import build_tree
from otel_rl.testing import capture_spans
from otel_rl.timers import get_timer_root, get_timer_tree, hierarchical_timer, timed
from otel_rl.timing import Timing
from tests.gpu_double import FakeCuda


@pytest.fixture
def cuda() -> Iterator[FakeCuda]:
    double = FakeCuda(devices=2)
    saved = gpu.timeout
    gpu.use_api(double)
    yield double
    gpu.use_api(None)
    gpu.configure((), saved)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the GPU resolver"
        time.sleep(0.002)


def train_step(cuda: FakeCuda, forward_ms: float, backward_ms: float, update_ms: float) -> None:
    """Sample Factory's shape: kernels are queued, `.item()` in after_optimizer waits."""
    with hierarchical_timer("forward", gpu=True):
        cuda.launch(forward_ms)
    with hierarchical_timer("backward", gpu=True):
        cuda.launch(backward_ms)
    with hierarchical_timer("update", gpu=True):
        cuda.launch(update_ms)
    with hierarchical_timer("after_optimizer", gpu=True):
        cuda.wait_idle()  # loss.item(): the host waits for everything queued so far


def test_gpu_time_lands_in_the_block_that_queued_the_work(cuda: FakeCuda) -> None:
    for _ in range(10):
        train_step(cuda, forward_ms=5.0, backward_ms=4.0, update_ms=0.25)
    root = get_timer_root()
    wait_until(lambda: gpu.outstanding() == 0)
    gpu_ms = {name: node.gpu_total * 1e3 for name, node in root.children.items()}
    assert gpu_ms == pytest.approx({"forward": 50.0, "backward": 40.0, "update": 2.5,
                                    "after_optimizer": 0.0})
    assert all(node.gpu_count == 10 for node in root.children.values())
    # ML-Agents' own tree is unchanged: no GPU keys in get_timer_tree().
    assert "gpu_total" not in json.dumps(get_timer_tree())


def test_blocks_never_wait_for_the_device_and_late_events_still_count(cuda: FakeCuda) -> None:
    cuda.launch(1000.0)  # a long queue: nothing below completes until the clock moves
    for _ in range(200):
        with hierarchical_timer("forward", gpu=True):
            cuda.launch(2.0)
    node = get_timer_root().children["forward"]
    # Every block has returned although none of its events has completed.
    assert node.count == 200 and node.gpu_count == 0
    assert gpu.outstanding() == 200
    time.sleep(0.05)
    assert node.gpu_count == 0  # still nothing: the device clock has not moved
    cuda.advance(1000.0 + 2.0 * 100)
    wait_until(lambda: node.gpu_count == 100)
    assert gpu.outstanding() == 100
    cuda.advance(2.0 * 100)
    wait_until(lambda: gpu.outstanding() == 0)
    assert node.gpu_count == 200
    assert node.gpu_total == pytest.approx(0.4)
    assert cuda.events_made <= 2 * 200  # pooled: completed pairs are reused


def test_events_completing_out_of_order_go_to_their_own_thread_and_block(
    cuda: FakeCuda,
) -> None:
    # Three threads, three streams on two devices; the stream that started first finishes last.
    plans = {"slow": (0, 30.0), "fast": (0, 1.0), "other_device": (1, 7.0)}
    nodes = {}
    barrier = threading.Barrier(len(plans))

    def worker(name: str) -> None:
        device, ms = plans[name]
        stream = cuda.new_stream(device)
        cuda.set_stream(stream)
        if name == "slow":
            cuda.launch(500.0)  # a backlog on this stream only
        barrier.wait()
        with hierarchical_timer("rollout"):
            for _ in range(5):
                with hierarchical_timer(name, gpu=True):
                    cuda.launch(ms)
        nodes[name] = get_timer_root().children["rollout"].children[name]

    threads = [threading.Thread(target=worker, args=(n,)) for n in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(node.gpu_count == 0 for node in nodes.values())
    cuda.advance(5.0)
    cuda.advance(35.0, device=1)
    wait_until(lambda: nodes["fast"].gpu_count == 5 and nodes["other_device"].gpu_count == 5)
    assert nodes["slow"].gpu_count == 0  # its stream is still busy with the backlog
    cuda.advance(500.0 + 150.0)
    wait_until(lambda: gpu.outstanding() == 0)
    for name, (_, ms) in plans.items():
        assert nodes[name].gpu_total == pytest.approx(5 * ms / 1e3), name
        assert nodes[name].gpu_count == 5


def test_an_event_that_never_completes_is_given_up_after_the_timeout(cuda: FakeCuda) -> None:
    gpu.configure((), 0.2)
    stalled = cuda.new_stream()
    stalled.stalled = True
    cuda.set_stream(stalled)
    started = time.monotonic()
    with hierarchical_timer("forward", gpu=True):
        cuda.launch(1.0)
    assert time.monotonic() - started < 0.1  # the block itself did not wait
    wait_until(lambda: gpu.outstanding() == 0, timeout=2.0)
    assert time.monotonic() - started >= 0.2
    assert get_timer_root().children["forward"].gpu_count == 0


def test_span_waits_for_its_gpu_time_then_carries_it(cuda: FakeCuda) -> None:
    cuda.launch(100.0)
    with capture_spans() as captured:
        with hierarchical_timer("update"):
            with hierarchical_timer("forward", gpu=True):
                cuda.launch(3.0)
        otel_rl.force_flush()
        exported = {s.name for s in captured._exporter.spans()}
        assert "update" in exported and "forward" not in exported  # held back, not lost
        cuda.advance(103.0)
        wait_until(lambda: gpu.outstanding() == 0)
        otel_rl.force_flush()
        forward = [s for s in captured._exporter.spans() if s.name == "forward"]
        assert len(forward) == 1
        assert forward[0].attributes[semconv.GPU_SECONDS] == pytest.approx(0.003)
        assert forward[0].attributes[semconv.GPU_DEVICE] == 0
    tree = captured.tree()
    assert tree.find(["update", "forward"]).gpu_total == pytest.approx(0.003)
    assert tree.find(["update"]).gpu_count == 0


def test_shutdown_exports_a_never_completing_span_marked_timed_out(cuda: FakeCuda) -> None:
    stalled = cuda.new_stream()
    stalled.stalled = True
    cuda.set_stream(stalled)
    started = time.monotonic()
    with capture_spans(gpu_timeout=0.3) as captured:
        with hierarchical_timer("forward", gpu=True):
            pass
    assert time.monotonic() - started < 3.0  # bounded by gpu_timeout, not the stall
    (forward,) = [s for s in captured.spans if s.name == "forward"]
    assert forward.attributes[semconv.GPU_TIMED_OUT] is True
    assert semconv.GPU_SECONDS not in forward.attributes


def test_gpu_blocks_setting_opts_blocks_in_by_name_and_pattern(
    cuda: FakeCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RL_GPU_BLOCKS", "forward, back*")
    otel_rl.configure(output_dir=str(tmp_path))
    for _ in range(3):
        with hierarchical_timer("forward"):
            cuda.launch(2.0)
        with hierarchical_timer("backward_pass"):
            cuda.launch(3.0)
        with hierarchical_timer("update"):
            cuda.launch(1.0)
        with hierarchical_timer("backward_check", gpu=False):  # explicit opt-out wins
            cuda.launch(1.0)
    cuda.advance(100.0)
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())["children"]
    assert tree["forward"]["gpu_total"] == pytest.approx(0.006)
    assert tree["backward_pass"]["gpu_total"] == pytest.approx(0.009)
    assert tree["forward"]["gpu_count"] == 3
    assert "gpu_total" not in tree["update"] and "gpu_total" not in tree["backward_check"]


def test_timed_and_decorator_forms_time_the_gpu(cuda: FakeCuda) -> None:
    @timed(gpu=True)
    def forward() -> None:
        cuda.launch(2.0)

    @hierarchical_timer("backward", gpu=True)
    def backward() -> None:
        cuda.launch(5.0)

    @timed
    def plain() -> None:
        cuda.launch(1.0)

    for _ in range(4):
        forward()
        backward()
        plain()
    cuda.advance(100.0)
    wait_until(lambda: gpu.outstanding() == 0)
    children = {name.rpartition(".")[2]: node for name, node in get_timer_root().children.items()}
    assert children["forward"].gpu_total == pytest.approx(0.008)
    assert children["backward"].gpu_total == pytest.approx(0.020)
    assert children["plain"].count == 4 and children["plain"].gpu_count == 0
    # As ML-Agents names it: a second @timed on top is named after the inner wrapper.
    outer = timed(gpu=True)(forward)
    outer()
    assert "timed.<locals>.wrapped" in get_timer_root().children


def test_sample_factory_timing_gpu_option_times_the_mirror_block(
    cuda: FakeCuda, tmp_path: Path
) -> None:
    otel_rl.configure(output_dir=str(tmp_path))
    timing = Timing("learner")
    for _ in range(5):
        with timing.add_time("train"):
            with timing.timeit("forward", gpu=True):
                cuda.launch(4.0)
            with timing.add_time("update", gpu=True):
                cuda.launch(1.0)
            with timing.time_avg("after_optimizer", gpu=True):
                cuda.wait_idle()
    otel_rl.shutdown()
    train = Tree.from_json((tmp_path / "timers.json").read_text()).find(["train"])
    assert train is not None and train.gpu_count == 0
    assert train.children["forward"].gpu_total == pytest.approx(0.020)
    assert train.children["update"].gpu_total == pytest.approx(0.005)
    assert train.children["after_optimizer"].gpu_total == pytest.approx(0.0)
    assert train.children["after_optimizer"].gpu_count == 5
    # Timing's own numbers stay wall-clock, as in Sample Factory.
    assert isinstance(timing["forward"], float) and timing["update"] >= 0


def test_timers_json_and_the_tree_from_spans_agree_on_gpu_time(
    cuda: FakeCuda, tmp_path: Path
) -> None:
    otel_rl.configure(output_dir=str(tmp_path), spans="all")
    with hierarchical_timer("train"):
        for _ in range(3):
            train_step(cuda, 2.0, 3.0, 0.5)
    otel_rl.shutdown()
    from_file = Tree.from_json((tmp_path / "timers.json").read_text())
    from_spans = build_tree(read_otlp_json_file(tmp_path / "spans.otlp.jsonl"))
    for name, gpu_s in (("forward", 0.006), ("backward", 0.009), ("update", 0.0015),
                        ("after_optimizer", 0.0)):
        for tree in (from_file, from_spans):
            node = tree.find(["train", name])
            assert node is not None and node.gpu_count == 3
            assert node.gpu_total == pytest.approx(gpu_s)


def test_without_torch_gpu_blocks_run_plain_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu.use_api(None)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(gpu, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for _ in range(3):
            with hierarchical_timer("forward", gpu=True):
                pass
    assert get_timer_root().children["forward"].count == 3
    assert get_timer_root().children["forward"].gpu_count == 0
    warnings = [r for r in caplog.records if "torch is not imported" in r.getMessage()]
    assert len(warnings) == 1
    assert "torch" not in sys.modules  # otel_rl never imports it


def test_with_torch_but_no_cuda_gpu_blocks_run_plain_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu.use_api(None)
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(gpu, "_warned", set())
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            for _ in range(3):
                with hierarchical_timer("forward", gpu=True):
                    pass
    finally:
        gpu.use_api(None)
    assert get_timer_root().children["forward"].count == 3
    assert len([r for r in caplog.records if "CUDA is not available" in r.getMessage()]) == 1


def test_no_gpu_time_before_the_program_initializes_cuda(cuda: FakeCuda) -> None:
    cuda.initialized = False
    with hierarchical_timer("forward", gpu=True):
        pass
    cuda.initialized = True
    with hierarchical_timer("forward", gpu=True):
        cuda.launch(1.0)
    cuda.advance(10.0)
    wait_until(lambda: gpu.outstanding() == 0)
    node = get_timer_root().children["forward"]
    assert (node.count, node.gpu_count) == (2, 1)
    assert cuda.recorded == 2  # only the second block touched the device


def test_a_failing_device_never_reaches_training_code(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(stream: object = None) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu, "_warned", set())
    monkeypatch.setattr(cuda, "current_stream", broken)
    for _ in range(3):
        with hierarchical_timer("forward", gpu=True):
            pass
    assert get_timer_root().children["forward"].count == 3
    assert get_timer_root().children["forward"].gpu_count == 0


@pytest.mark.parametrize(("method", "explicit"),
                         [("spawn", True), ("fork", True), ("spawn", False)])
def test_worker_processes_gpu_time_reaches_the_parents_tree_and_spans(
    method: str, explicit: bool, tmp_path: Path
) -> None:
    import multiprocessing as mp

    from tests.gpu_double import gpu_worker

    # Without `explicit`, the workers learn which blocks to time from the parent's setting.
    otel_rl.configure(output_dir=str(tmp_path), spans="all",
                      gpu_blocks=None if explicit else ["pol*"])
    ctx = mp.get_context(method)
    with hierarchical_timer("collect"):
        procs = [ctx.Process(target=gpu_worker, args=(i, 4, explicit)) for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    otel_rl.shutdown()
    assert [p.exitcode for p in procs] == [0, 0]
    expected = 4 * (1.0 + 2.0) / 1e3  # worker i: 4 blocks of i + 1 ms
    from_file = Tree.from_json((tmp_path / "timers.json").read_text())
    spans = read_otlp_json_file(tmp_path / "spans.otlp.jsonl")
    from_spans = build_tree(spans)
    for tree in (from_file, from_spans):
        policy = tree.find(["collect", "rollout", "policy"])
        assert policy is not None and policy.is_parallel
        assert (policy.gpu_total, policy.gpu_count) == (pytest.approx(expected), 8)
        per_worker = sorted((w.index, w.node.children["rollout"].children["policy"].gpu_total)
                            for w in tree.workers)
        assert per_worker == [(0, pytest.approx(0.004)), (1, pytest.approx(0.008))]
    devices = sorted(s.attributes[semconv.GPU_DEVICE] for s in spans if s.name == "policy")
    assert devices == [0] * 4 + [1] * 4  # each worker its own device


def _tree_with_gpu() -> Tree:
    return Tree.from_dict({
        "name": "root", "total": 2.0, "count": 1,
        "children": {"train": {"total": 1.5, "count": 10, "children": {
            "forward": {"total": 0.291, "count": 50, "gpu_total": 0.549, "gpu_count": 50},
            "after_optimizer": {"total": 0.614, "count": 50, "gpu_total": 0.006,
                                "gpu_count": 50},
            "log": {"total": 0.1, "count": 10}}}},
        "workers": [
            {"role": "rollout", "index": i, "pid": 100 + i, "path": [],
             "tree": {"total": 0.0, "count": 0, "children": {"policy": {
                 "total": 0.2, "count": 5, "gpu_total": 0.05 * (i + 1), "gpu_count": 5}}}}
            for i in range(2)],
    })


def test_reports_show_gpu_columns_only_when_there_is_gpu_data() -> None:
    from otel_rl.renderers import crossworker, html, treeview

    tree = _tree_with_gpu()
    text = treeview.render(tree)
    header = text.splitlines()[0].split()
    assert header[:4] == ["block", "total", "gpu", "self"]
    forward = next(line for line in text.splitlines() if "forward" in line)
    assert "291.00 ms" in forward and "549.00 ms" in forward
    log = next(line for line in text.splitlines() if "log" in line)
    assert log.split()[4] == "-"  # not measured on the GPU
    cross = crossworker.render(tree)
    policy = next(line for line in cross.splitlines() if "policy" in line)
    assert "75.00 ms" in policy and "100.00 ms" in policy  # gpu mean and max over workers
    page = html.render(tree)
    assert 'id="gpu-section"' in page and "549.00 ms" in page
    assert "gpu mean" in page
    plain = Tree.from_dict({"name": "root", "total": 1.0, "count": 1,
                            "children": {"a": {"total": 0.5, "count": 1}}})
    assert "gpu" not in treeview.render(plain)
    assert 'id="gpu-section"' not in html.render(plain)


def test_gpu_keys_round_trip_through_timers_json_and_import() -> None:
    from otel_rl._internal.cli.import_ import tree_to_spans

    tree = _tree_with_gpu()
    again = Tree.from_json(tree.to_json())
    assert again == tree
    forward = again.find(["train", "forward"])
    assert forward is not None and (forward.gpu_total, forward.gpu_count) == (0.549, 50)
    rebuilt = build_tree(tree_to_spans(tree, "trainer", 1_700_000_000_000_000_000))
    node = rebuilt.find(["train", "forward"])
    assert node is not None and node.gpu_total == pytest.approx(0.549) and node.gpu_count == 50
    with pytest.raises(Exception, match="gpu_total"):
        Tree.from_dict({"name": "root", "total": 1.0, "count": 1,
                        "children": {"a": {"total": 0.5, "count": 1, "gpu_total": -1}}})


def test_gpu_benchmark_runs_and_checks_its_counts() -> None:
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu.py"
    proc = subprocess.run([sys.executable, str(bench), "--smoke"], capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for row in ("| mlagents |", "| now |", "| now, gpu_blocks set |",
                "| opted in, device double |", "| opted in, null device |"):
        assert row in proc.stdout
    assert "CHECKS FAILED" not in proc.stdout


@pytest.mark.parametrize("bad", [float("inf"), -1.0, "0.5", True])
def test_spans_from_outside_with_a_malformed_gpu_time_are_bad_input(bad: object) -> None:
    from otel_rl._internal.errors import UserError
    from otel_rl._internal.readers.semantics import check_span
    from otel_rl._internal.spandata import SpanData

    span = SpanData("1" * 32, "2" * 16, "", "forward", 0, 10,
                    attributes={semconv.GPU_SECONDS: bad})
    with pytest.raises(UserError, match=r"otel_rl\.gpu\.seconds"):
        check_span(span, "spans.json")
    check_span(SpanData("1" * 32, "2" * 16, "", "forward", 0, 10,
                        attributes={semconv.GPU_SECONDS: 0.25}), "spans.json")


def test_many_threads_sharing_the_event_pool_while_the_device_runs(cuda: FakeCuda) -> None:
    stop = threading.Event()

    def device() -> None:  # the clock moves while blocks are recorded and resolved
        while not stop.is_set():
            cuda.advance(0.5)
            time.sleep(0.0002)

    nodes = {}
    streams = {}
    alive = threading.Barrier(8)  # all at once: a thread id reused would share a timer stack

    def worker(i: int) -> None:
        streams[i] = cuda.new_stream()
        cuda.set_stream(streams[i])
        alive.wait()
        for _ in range(200):
            with hierarchical_timer("policy", gpu=True):
                cuda.launch(1.0 + i)
        nodes[i] = get_timer_root().children["policy"]
        alive.wait()

    clock = threading.Thread(target=device)
    clock.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_until(lambda: gpu.outstanding() == 0, timeout=20.0)
    finally:
        stop.set()
        clock.join()
    for i, node in nodes.items():
        assert node.gpu_count == 200
        # Each block's device time is its kernel's, plus the idle gap when the device clock
        # overtook the stream between the start event and the launch (a thread descheduled
        # under load): the double's own record of the events' device times is the truth.
        at = streams[i].recorded_at
        assert len(at) == 400
        device_ms = sum(at[1::2]) - sum(at[0::2])
        assert device_ms >= 200 * (1.0 + i) - 1e-9
        assert node.gpu_total == pytest.approx(device_ms / 1e3)
    assert not gpu._disabled


@pytest.mark.chromium
def test_html_report_shows_gpu_time_in_the_tooltip_and_table(
    chromium_driver: object, tmp_path: Path
) -> None:
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.by import By

    from otel_rl.renderers import html

    driver: Any = chromium_driver
    path = tmp_path / "report.html"
    path.write_text(html.render(_tree_with_gpu()), encoding="utf-8")
    driver.get_log("browser")
    driver.get(path.as_uri())
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#gpu tbody tr")]
    assert len(rows) == 2 and "549.00 ms" in rows[0] and "1.89×" in rows[0]
    forward = driver.find_element(By.CSS_SELECTOR, "#icicle div.node[data-name='forward'] .val")
    ActionChains(driver).move_to_element(forward).perform()
    tip = driver.find_element(By.ID, "tooltip")
    deadline = time.monotonic() + 3
    while not tip.is_displayed():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    lines = tip.text.splitlines()
    assert lines[:4] == ["forward", "train", "total 291.00 ms", "gpu 549.00 ms"], lines


def test_gpu_time_pending_across_reset_timers_stays_in_the_whole_run_tree(
    cuda: FakeCuda, tmp_path: Path
) -> None:
    from otel_rl.timers import reset_timers

    otel_rl.configure(output_dir=str(tmp_path))
    cuda.launch(50.0)
    for _ in range(3):
        with hierarchical_timer("forward", gpu=True):
            cuda.launch(2.0)
    reset_timers()  # ML-Agents' env workers do this after every step they report
    # A flush reading the whole run before the GPU is done adds the reset's root to the
    # retired tree: its pending GPU time must follow it there.
    recorder.stack_contribution(recorder.thread_stack())
    with hierarchical_timer("forward", gpu=True):
        cuda.launch(2.0)
    cuda.advance(100.0)
    otel_rl.shutdown()
    forward = json.loads((tmp_path / "timers.json").read_text())["children"]["forward"]
    assert (forward["count"], forward["gpu_count"]) == (4, 4)
    assert forward["gpu_total"] == pytest.approx(0.008)
    assert "forward" in get_timer_tree()["children"]  # ML-Agents' view: only since the reset
    assert get_timer_root().children["forward"].count == 1


def test_no_events_are_recorded_into_a_cuda_graph_capture(cuda: FakeCuda) -> None:
    capturing = [True]
    cuda.is_current_stream_capturing = lambda: capturing[0]  # type: ignore[attr-defined]
    with hierarchical_timer("captured", gpu=True):
        cuda.launch(1.0)
    capturing[0] = False
    with hierarchical_timer("capture_starts_inside", gpu=True):
        capturing[0] = True
    capturing[0] = False
    assert cuda.recorded == 1  # only the second block's start, before its capture began
    with hierarchical_timer("after", gpu=True):
        cuda.launch(1.0)
    cuda.advance(10.0)
    wait_until(lambda: gpu.outstanding() == 0)
    children = get_timer_root().children
    assert children["captured"].count == 1 and children["captured"].gpu_count == 0
    assert children["capture_starts_inside"].gpu_count == 0
    assert children["after"].gpu_count == 1  # GPU timing carries on after a capture


@pytest.mark.jaeger
@pytest.mark.timeout(180)
def test_gpu_time_survives_a_real_jaeger_and_rebuilds_the_same_tree(
    cuda: FakeCuda, jaeger: Any, jaeger_service: str, tmp_path: Path
) -> None:
    from otel_rl._internal.readers.jaeger import parse_jaeger

    otel_rl.configure(output_dir=str(tmp_path), service_name=jaeger_service, spans="all",
                      endpoint=jaeger.otlp_http_endpoint, gpu_blocks=["forward", "backward"])
    cuda.launch(20.0)  # a backlog: the spans are held until the device gets there
    with hierarchical_timer("train"):
        for _ in range(3):
            with hierarchical_timer("forward"):
                cuda.launch(2.5)
            with hierarchical_timer("backward"):
                cuda.launch(4.0)
    threading.Timer(0.3, cuda.advance, args=(100.0,)).start()
    otel_rl.shutdown(timeout=20)
    written = Tree.from_json((tmp_path / "timers.json").read_text())
    spans = read_otlp_json_file(tmp_path / "spans.otlp.jsonl")
    stored = parse_jaeger(jaeger.wait_for_spans(spans[0].trace_id, len(spans), timeout=30))
    from_jaeger = build_tree(stored)
    for name, seconds in (("forward", 0.0075), ("backward", 0.012)):
        for tree in (written, from_jaeger):
            node = tree.find(["train", name])
            assert node is not None and node.gpu_count == 3
            assert node.gpu_total == pytest.approx(seconds)
    assert all(semconv.GPU_TIMED_OUT not in s.attributes for s in stored)


def test_sampled_iterations_that_are_gpu_blocks_carry_their_gpu_time(
    cuda: FakeCuda, tmp_path: Path
) -> None:
    # Past the span budget a kept window holds only its first spans (the policy decides on the
    # flush thread, after the blocks ended and their GPU time was read).
    otel_rl.configure(output_dir=str(tmp_path), spans="auto", span_budget=5, sample_every=4)
    for i in range(40):
        with hierarchical_timer("step", gpu=True):
            cuda.launch(1.0 + i % 2)
    cuda.advance(1000.0)
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())["children"]["step"]
    assert (tree["count"], tree["gpu_count"]) == (40, 40)
    assert tree["gpu_total"] == pytest.approx(0.060)
    steps = [s for s in read_otlp_json_file(tmp_path / "spans.otlp.jsonl") if s.name == "step"]
    assert 0 < len(steps) < 40  # sampled
    assert all(semconv.GPU_SECONDS in s.attributes for s in steps)
    assert not gpu.spans  # nothing left waiting for a span that was not kept
