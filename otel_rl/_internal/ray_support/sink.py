"""A Ray worker's delivery to the driver: one push into the run's mailbox per flush.

Ray's own channel (the GCS's key-value store, `mailbox`), so it works from any node (no
socket, file or clock shared with the driver). The frames are the relay's (records as column
frames, the tree snapshot as a snapshot frame); the mailbox only holds them until the driver
takes them.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence

from otel_rl._internal import relay
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.ray_support.mailbox import WORKER_CAP, Mailbox
from otel_rl._internal.relay import RelayClient
from otel_rl._internal.sinks.base import Stats
from otel_rl._internal.wholerun import Snapshot

#: The prefix of a joining carrier's ``relay`` that names a Ray mailbox, not a socket.
RELAY_PREFIX = "ray:"
#: Seconds a push may take before its records are counted lost.
PUSH_TIMEOUT = 10.0


class RaySink(RelayClient):
    """A Ray worker's end of the delivery: one push into the run's mailbox per flush.

    A push carries the worker's key (node id : pid), the frames (records as relay column
    frames, the snapshot as a relay snapshot frame), and ``meta``: a sequence number, the
    number of records, whether calls were running (``busy``: if the worker dies before its
    next push, the driver counts it lost), whether this push answers the driver's request for
    a last delivery, and whether it is this process's last (``final``)."""

    name = "ray"

    def __init__(self, address: str, stats: Stats) -> None:  # no socket: see RelayClient
        self.address = address
        self._mailbox_name = address[len(RELAY_PREFIX):].partition("/")[2]
        self._stats = stats
        self._lock = threading.Lock()
        self._broken = False
        self._mailbox: Mailbox | None = None
        self._puts = itertools.count()  # every put's number (pushes and notices alike)
        #: Bytes put since the driver's last take (as its `drains` count says): at
        #: `mailbox.WORKER_CAP` a push's frames are refused (their records counted lost).
        self._waiting_bytes = 0
        self._drains_seen = -1
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
        #: Calls running now and started so far, and what starts a flush at once (set by
        #: `worker.join`).
        self.running: Callable[[], int] = lambda: 0
        self.started: Callable[[], int] = lambda: 0
        self.wake: Callable[[], None] = lambda: None

    def _connect(self) -> Mailbox | None:
        with self._connect_lock:
            if self._mailbox is None:
                import ray

                if not ray.is_initialized():
                    return None
                node = ray.get_runtime_context().get_node_id()
                self.key = f"{node[:12]}:{os.getpid()}"
                self._mailbox = Mailbox(self._mailbox_name)
            return self._mailbox

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
        """A call starts: if the last push said idle, tell the driver now (one put before the
        call goes on), so a worker killed before its next push is counted lost, not presumed
        idle."""
        if self._last_busy or self._notified_busy:
            return
        self._notified_busy = True
        try:
            mailbox = self._connect()
            if mailbox is not None:
                mailbox.put(self.key, next(self._puts),
                            {"seq": self.seq, "busy": True, "notice": True}, [], PUSH_TIMEOUT)
        except Exception:
            pass

    def _push(self, timeout: float = PUSH_TIMEOUT) -> None:
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
            # until a last delivery was said or asked for: the driver is ending, and what is
            # put after its end stays unread in the GCS). A push that said busy is always
            # followed by one more (saying idle, or not); an idle worker has nothing to answer.
            quiet = (not records and not final
                     and not self._last_busy and started_before == self._started_pushed
                     and (self._ticks % 8 or self._final_said or self._answering))
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
                mailbox = self._connect()
                if mailbox is None:
                    raise RuntimeError("not connected to Ray")
                self.seq += 1
                meta = {"seq": self.seq, "records": records, "busy": busy,
                        "answer": self._answering, "final": self.final, "pid": os.getpid(),
                        "index_given": self.index_given}
                size = sum(len(frame) for frame in frames)
                if frames and self._waiting_bytes and self._waiting_bytes + size > WORKER_CAP:
                    # The driver takes nothing: keep the GCS bounded (it counts them lost).
                    meta["refused"] = True
                    frames, size = [], 0
                deadline = time.monotonic() + timeout
                mailbox.put(self.key, next(self._puts), meta, frames, timeout)
            except Exception as exc:
                self._stats.warn_once("ray-push", f"cannot deliver to the driver: {exc!r}")
                self._stats.add_dropped("unreachable", records, None,
                                        "the driver's Ray mailbox")
                return
            self.pushes += 1
            self._waiting_bytes += size
            try:  # delivered; what the driver says back is read after it
                said = mailbox.state(max(0.1, deadline - time.monotonic()))
            except Exception as exc:
                self._stats.warn_once("ray-state", f"cannot read the driver's word: {exc!r}")
                said = {"drains": self._drains_seen}
            drains = int(said.get("drains") or 0)
            if drains != self._drains_seen:  # the driver took what waited (this push, maybe)
                self._drains_seen, self._waiting_bytes = drains, size
            asked = bool(said.get("final"))
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
