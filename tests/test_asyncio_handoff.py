"""A coroutine handed to another thread's event loop (``asyncio.run_coroutine_threadsafe``)
from inside a block runs under that block, each on a stack of its own (Ray Serve runs a
deployment's code so, on a loop thread of its own), as threads and executors do already;
and a module patched on import that is not as otel_rl knows it still imports and runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rl.testing import capture_spans
from otel_rl.timers import hierarchical_timer as timer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="other-loop")
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def work(i: int) -> int:
    """Awaits before its first block: the ones handed together interleave with none of them
    in a block yet when the next one starts."""
    await asyncio.sleep(0.001 * (i % 3))
    with timer("handed"):
        await asyncio.sleep(0.002)
        with timer("inner"):
            await asyncio.sleep(0)
    return i


def test_coroutines_handed_to_another_loop_run_under_the_handing_block(
        loop: asyncio.AbstractEventLoop) -> None:
    with capture_spans(propagate=True) as captured:
        with timer("caller"):
            handed = [asyncio.run_coroutine_threadsafe(work(i), loop) for i in range(4)]
            assert [f.result(10) for f in handed] == [0, 1, 2, 3]
        # Handed from the thread's root: the loop thread's own place, as before.
        assert asyncio.run_coroutine_threadsafe(work(4), loop).result(10) == 4
    spans: dict[Any, Any] = {s.span_id: s for s in captured.spans}
    (caller,) = [s.span_id for s in spans.values() if s.name == "caller"]
    outer = {s.span_id: s.parent_span_id for s in spans.values() if s.name == "handed"}
    assert len(outer) == 5
    assert sorted(parent == caller for parent in outer.values()) == [False] + [True] * 4
    inner = [s.parent_span_id for s in spans.values() if s.name == "inner"]
    assert sorted(inner) == sorted(outer)  # each under its own `handed`, none under another
    # The tree says the same: four under `caller` (run in another thread: parallel), one at
    # the other loop thread's root.
    tree: Any = captured.timer_tree()
    assert tree["children"]["caller"]["children"]["handed"]["count"] == 4
    assert tree["children"]["caller"]["children"]["handed"]["children"]["inner"]["count"] == 4


def test_what_the_loop_sees_is_the_coroutines_result_error_and_cancellation(
        loop: asyncio.AbstractEventLoop) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("inside")

    started = threading.Event()

    async def waits() -> None:
        started.set()
        await asyncio.sleep(60)

    with capture_spans(propagate=True), timer("caller"):
        assert asyncio.run_coroutine_threadsafe(work(7), loop).result(10) == 7
        with pytest.raises(KeyError, match="inside"):
            asyncio.run_coroutine_threadsafe(fails(), loop).result(10)
        pending = asyncio.run_coroutine_threadsafe(waits(), loop)
        assert started.wait(10)
        pending.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            pending.result(10)


def test_a_module_otel_rl_cannot_patch_still_imports_and_runs(tmp_path: Path) -> None:
    """An ``anyio`` whose ``to_thread`` has no ``run_sync`` (another version than otel_rl
    knows): importing it after ``configure`` works, one warning says what was skipped."""
    (tmp_path / "anyio").mkdir()
    (tmp_path / "anyio" / "__init__.py").write_text("")
    (tmp_path / "anyio" / "to_thread.py").write_text("def run_later(f):\n    return f()\n")
    program = ("import otel_rl\n"
               "otel_rl.configure(propagate=True, output_dir=r'%s')\n"
               "import anyio.to_thread\n"
               "print(anyio.to_thread.run_later(lambda: 'ran'))\n"
               "otel_rl.shutdown()\n") % (tmp_path / "out")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(tmp_path), str(ROOT)])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"
    warned = [line for line in done.stderr.splitlines() if "anyio.to_thread" in line]
    assert len(warned) == 1 and "cannot instrument anyio.to_thread" in warned[0], done.stderr
