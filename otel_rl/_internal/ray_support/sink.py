"""A Ray worker's delivery to the driver: one push to the run's collector actor per flush.

Ray's own channel, so it works from any node (no socket, file or clock shared with the
driver). The frames are the relay's (records as column frames, the tree snapshot as a
snapshot frame); the collector only holds them until the driver drains it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from otel_rl._internal import relay
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.relay import RelayClient
from otel_rl._internal.sinks.base import Stats
from otel_rl._internal.wholerun import Snapshot

#: The prefix of a joining carrier's ``relay`` that names a Ray collector, not a socket.
RELAY_PREFIX = "ray:"
#: Seconds a push may take before its records are counted lost.
PUSH_TIMEOUT = 10.0


class RaySink(RelayClient):
    """A Ray worker's end of the delivery: one push to the run's collector per flush.

    A push carries the worker's key (node id : pid), the frames (records as relay column
    frames, the snapshot as a relay snapshot frame), and ``meta``: a sequence number, the
    number of records, whether calls were running (``busy``: if the worker dies before its
    next push, the driver counts it lost), whether this push answers the driver's request for
    a last delivery, and whether it is this process's last (``final``)."""

    name = "ray"

    def __init__(self, address: str, stats: Stats) -> None:  # no socket: see RelayClient
        namespace, _, collector = address[len(RELAY_PREFIX):].partition("/")
        self.address = address
        self._namespace = namespace or None
        self._collector = collector
        self._stats = stats
        self._lock = threading.Lock()
        self._broken = False
        self._handle: Any = None
        self.on_broken = None  # the Unix relay's fallback: Ray reports its own failures
        self._frames: list[bytes] = []
        self._records = 0
        self._snapshot: Snapshot | None = None
        self.seq = 0
        self.key = ""
        self.final = False
        self._final_said = False
        self.index_given = False
        self._answering = False
        self._notified_busy = False
        self._last_busy = False  # so the first call sends a notice: the driver knows of us
        self._started_at_snapshot = 0
        self._running_at_snapshot = 0
        self._started_pushed = -1
        self._ticks = 0
        self._connect_lock = threading.Lock()
        self.pushes = 0
        #: Set in the collector's own process: it delivers nothing (it would push to itself).
        self.left = False
        #: Calls running now and started so far, what starts a flush at once, and what marks
        #: otel_rl's own Ray calls (set by `worker.join`).
        self.running: Callable[[], int] = lambda: 0
        self.started: Callable[[], int] = lambda: 0
        self.wake: Callable[[], None] = lambda: None
        self.calls_internal: Callable[[], Any] = contextlib.nullcontext

    def _connect(self) -> Any:
        with self._connect_lock:
            if self._handle is None:
                import ray

                if not ray.is_initialized():
                    return None
                node = ray.get_runtime_context().get_node_id()
                self.key = f"{node[:12]}:{os.getpid()}"
                self._handle = ray.get_actor(self._collector, namespace=self._namespace)
            return self._handle

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        for batch in batches:
            if batch.records:
                self._frames.append(relay.encode_columns(batch))
                self._records += len(batch.records)

    def send_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._started_at_snapshot = self.started()
        self._running_at_snapshot = self.running()

    def after_flush(self) -> None:
        self._push()

    def note_busy(self) -> None:
        """A call starts: if the last push said idle, tell the driver now (not waited for),
        so a worker killed before its next push is counted lost, not presumed idle."""
        if self._last_busy or self._notified_busy or self.left:
            return
        self._notified_busy = True
        try:
            handle = self._connect()
            if handle is not None:
                with self.calls_internal():
                    handle.push.remote(self.key,
                                       {"seq": self.seq, "busy": True, "notice": True}, [])
        except Exception:
            pass

    def _push(self, timeout: float = PUSH_TIMEOUT) -> None:
        if self.left:
            return
        with self._lock:
            started, started_before = self.started(), self._started_at_snapshot
            running_before = self._running_at_snapshot
            frames, records = self._frames, self._records
            self._frames, self._records = [], 0
            snapshot, self._snapshot = self._snapshot, None
            self._ticks += 1
            # A last delivery is said once; after it, pushes go on only for what is new (a
            # process ending gracefully: no push needed while Ray tears it down).
            final = self.final and not self._final_said
            # Nothing ran since a push that said idle: skip (a snapshot every 8th tick anyway,
            # until a last delivery was said). A push that said busy is always followed by one
            # more (saying idle, or not).
            quiet = (not records and not final and not self._answering
                     and not self._last_busy and started_before == self._started_pushed
                     and (self._ticks % 8 or self._final_said))
            if quiet or (snapshot is None and not frames and not final):
                return
            if not started and not records and not final and not self._answering:
                # A pooled worker that has run nothing: nothing to say. (A push from a worker
                # Ray has not leased yet can wait until it is leased.)
                return
            if snapshot is not None:
                frames.append(relay.encode_frame(relay.KIND_SNAPSHOT, snapshot))
            # Busy: a call runs now, started since the snapshot, or ran when it was taken (it
            # may have ended since, its last blocks not in this push: the driver waits for more).
            busy = self.running() > 0 or started != started_before or running_before > 0
            try:
                handle = self._connect()
                if handle is None:
                    raise RuntimeError("not connected to Ray")
                self.seq += 1
                meta = {"seq": self.seq, "records": records, "busy": busy,
                        "answer": self._answering, "final": self.final, "pid": os.getpid(),
                        "index_given": self.index_given}
                # Waited on through the reference's future, not `ray.get`: in an async
                # actor's process Ray warns of any `ray.get` ("Using blocking ray.get inside
                # async actor..."), once, and stays quiet about the program's own after it.
                asked = handle.push.remote(self.key, meta, frames).future().result(
                    timeout=max(0.1, timeout))
                self.pushes += 1
            except Exception as exc:
                self._stats.warn_once("ray-push", f"cannot deliver to the driver: {exc!r}")
                self._stats.add_dropped("unreachable", records, None,
                                        "the driver's Ray collector")
                return
            self._started_pushed = started_before
            self._final_said = self._final_said or self.final
            self._last_busy = busy
            self._notified_busy = False
            self._stats.add_exported(self.name, records)
            if asked and not self._answering:
                # The driver wants a last delivery: one more flush now, drained after this.
                self._answering = True
                self.wake()

    def push_rest(self, deadline: float) -> None:
        """Push the records the sink took since its last push, if any (a last delivery)."""
        if self._frames:
            self._push(min(PUSH_TIMEOUT, deadline - time.monotonic()))

    def shutdown(self, deadline: float) -> None:
        self.final = True
        self._push(min(PUSH_TIMEOUT, deadline - time.monotonic()))
