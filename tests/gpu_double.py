"""A device-clock double: the part of ``torch.cuda`` that GPU timing uses, on a simulated GPU.

Each device has its own clock (milliseconds) that moves only when the test says so, or when the
program "synchronizes" the way real code does (``loss.item()`` waits for the stream:
`FakeCuda.wait_idle`). Work launched on a stream queues behind what that stream already has;
an event completes when its device's clock reaches the point where the stream gets to it. So
events complete late (never while the block that recorded them runs, unless the test moves
the clock) and out of order across streams and devices, and a stalled stream's events never
complete — what real CUDA does, with a clock the test controls.

It is as strict as CUDA: ``elapsed_time`` on an incomplete event raises (CUDA's
``cudaErrorNotReady``), an event recorded on another device than its first raises, and
``synchronize`` — which otel_rl must never call — raises too.
"""

from __future__ import annotations

import math
import threading
from typing import Any


class FakeStream:
    """A queue of work on one device: `busy_until` is where its last launched work ends."""

    def __init__(self, cuda: FakeCuda, device_index: int) -> None:
        self.cuda = cuda
        self.device_index = device_index
        self.busy_until = 0.0
        self.stalled = False
        #: The device time of every event recorded on this stream, in order (the truth a test
        #: can sum: a block's GPU time includes any idle gap before its kernel, as in CUDA).
        self.recorded_at: list[float] = []


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)`` on the simulated device."""

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False) -> None:
        self.cuda = cuda
        self.enable_timing = enable_timing
        self.device_index: int | None = None
        self.at: float | None = None  # device time the stream reaches this event
        self.records = 0

    def record(self, stream: FakeStream | None = None) -> None:
        cuda = self.cuda
        stream = stream or cuda.current_stream()
        with cuda.lock:
            if self.device_index is None:
                self.device_index = stream.device_index
            elif self.device_index != stream.device_index:
                raise RuntimeError("event device does not match the recording stream's device")
            clock = cuda.clocks[stream.device_index]
            self.at = math.inf if stream.stalled else max(stream.busy_until, clock)
            stream.recorded_at.append(self.at)
            self.records += 1
            cuda.recorded += 1

    def query(self) -> bool:
        cuda = self.cuda
        with cuda.lock:
            cuda.queries += 1
            if self.at is None:
                return True  # as CUDA: an event never recorded counts as complete
            return self.at <= cuda.clocks[self.device_index or 0]

    def elapsed_time(self, end: FakeEvent) -> float:
        if not self.enable_timing or not end.enable_timing:
            raise RuntimeError("events were not created with enable_timing=True")
        if self.at is None or end.at is None:
            raise RuntimeError("event was not recorded")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")  # cudaErrorNotReady
        return end.at - self.at


class FakeCuda:
    """The ``torch.cuda`` surface otel_rl uses, plus controls for the test."""

    def __init__(self, devices: int = 1, initialized: bool = True) -> None:
        self.lock = threading.Lock()
        self.clocks = [0.0] * devices
        self.initialized = initialized
        self._local = threading.local()
        self.default_streams = [FakeStream(self, d) for d in range(devices)]
        self.recorded = 0
        self.queries = 0
        self.events_made = 0

    # -- what torch.cuda offers -------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def current_stream(self, device: int | None = None) -> FakeStream:
        stream = getattr(self._local, "stream", None)
        return stream if stream is not None else self.default_streams[device or 0]

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # torch's name
        with self.lock:
            self.events_made += 1
        return FakeEvent(self, enable_timing)

    def synchronize(self, device: Any = None) -> None:
        raise AssertionError("otel_rl must never synchronize the device")

    # -- controls ---------------------------------------------------------------------------
    def new_stream(self, device: int = 0) -> FakeStream:
        return FakeStream(self, device)

    def set_stream(self, stream: FakeStream | None) -> None:
        """Make `stream` this thread's current stream (``torch.cuda.set_stream``)."""
        self._local.stream = stream

    def launch(self, ms: float, stream: FakeStream | None = None) -> None:
        """Queue a kernel taking `ms` of device time on `stream` (default: the current one)."""
        stream = stream or self.current_stream()
        with self.lock:
            start = max(stream.busy_until, self.clocks[stream.device_index])
            stream.busy_until = start + ms

    def advance(self, ms: float, device: int = 0) -> None:
        """Let `ms` of device time pass on `device`."""
        with self.lock:
            self.clocks[device] += ms

    def wait_idle(self, stream: FakeStream | None = None) -> None:
        """What ``loss.item()`` does: the host waits until `stream`'s work is done."""
        stream = stream or self.current_stream()
        with self.lock:
            clock = self.clocks[stream.device_index]
            self.clocks[stream.device_index] = max(clock, stream.busy_until)


def gpu_worker(index: int, n: int, explicit: bool = True) -> None:
    """A worker process on its own simulated device `index`: `n` GPU-timed blocks whose
    events complete only after the worker's code has returned (late, during its shutdown).
    Without `explicit`, the blocks are opted in only by the parent's `gpu_blocks` setting."""
    from otel_rl._internal import gpu
    from otel_rl.timers import hierarchical_timer

    cuda = FakeCuda(devices=index + 1)
    gpu.use_api(cuda)
    cuda.set_stream(cuda.new_stream(index))
    with hierarchical_timer("rollout"):
        for _ in range(n):
            with hierarchical_timer("policy", gpu=True if explicit else None):
                cuda.launch(index + 1.0)
    later = threading.Timer(0.2, cuda.advance, args=(1000.0, index))
    later.daemon = True
    later.start()
