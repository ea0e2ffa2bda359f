"""GPU timing on a real CUDA device: runs where torch is importable and
``torch.cuda.is_available()``; skipped elsewhere (CI has no GPU)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._internal import gpu
from otel_rl.timers import get_timer_root, hierarchical_timer

torch: Any = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def real_device() -> Iterator[None]:
    gpu.use_api(None)  # look torch.cuda up, as in a real run
    torch.cuda.init()
    yield
    gpu.use_api(None)


def _wait_resolved(timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while gpu.outstanding() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gpu.outstanding() == 0


def test_gpu_time_goes_to_the_kernels_block_not_the_synchronizing_one(tmp_path: Path) -> None:
    x = torch.randn(4096, 4096, device="cuda")
    w = torch.randn(4096, 4096, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    otel_rl.configure(output_dir=str(tmp_path), gpu_blocks="forward,backward,update,after_*")
    for _ in range(10):
        with hierarchical_timer("forward"):
            loss = (x @ w).square().mean()
        with hierarchical_timer("backward"):
            loss.backward()
        with hierarchical_timer("update"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        with hierarchical_timer("after_optimizer"):
            loss.item()
    otel_rl.shutdown()
    tree = json.loads((tmp_path / "timers.json").read_text())["children"]
    assert all(tree[p]["gpu_count"] == 10 for p in ("forward", "backward", "after_optimizer"))
    # The matmuls ran in forward/backward; after_optimizer only waited for them.
    assert tree["forward"]["gpu_total"] > 20 * tree["after_optimizer"]["gpu_total"]
    assert tree["backward"]["gpu_total"] > 20 * tree["after_optimizer"]["gpu_total"]


def test_events_are_pooled_per_device_and_never_synchronize() -> None:
    a = torch.randn(1024, 1024, device="cuda")
    synchronized = []
    real = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *args: synchronized.append(args) or real(*args)
    try:
        for _ in range(50):
            with hierarchical_timer("mm", gpu=True):
                a @ a
            _wait_resolved()
    finally:
        torch.cuda.synchronize = real
    assert synchronized == []
    assert get_timer_root().children["mm"].gpu_count == 50
    assert len(gpu._pools[torch.cuda.current_device()]) == 2  # one pair, reused 50 times


def test_a_side_stream_is_timed_on_its_own_stream() -> None:
    side = torch.cuda.Stream()
    a = torch.randn(2048, 2048, device="cuda")
    with torch.cuda.stream(side):
        with hierarchical_timer("side", gpu=True):
            for _ in range(5):
                a @ a
    with hierarchical_timer("main", gpu=True):
        pass
    _wait_resolved()
    children = get_timer_root().children
    assert children["side"].gpu_total > 10 * children["main"].gpu_total
