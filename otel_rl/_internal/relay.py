"""Worker -> parent channel: span records and tree snapshots over a Unix socket.

The socket lives in a fresh directory only its owner can enter (mode 0700), so only the run's
own processes can connect. Frames are ``!IB`` (length, kind) + UTF-8 JSON; nothing read from
the socket is ever unpickled. One server thread multiplexes every worker with `selectors`.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from otel_rl._internal import jsonout, log, relay_columns
from otel_rl._internal.aggregates import loads_deep
from otel_rl._internal.node import json_default
from otel_rl._internal.otlp.records import Batch, Columns
from otel_rl._internal.otlp.rows import Rows
from otel_rl._internal.record import EXTRA
from otel_rl._internal.sinks.base import Sink, Stats
from otel_rl._internal.threads import start_daemon, stopping
from otel_rl._internal.wholerun import Snapshot, received

FRAME_HEADER = struct.Struct("!IB")
KIND_SNAPSHOT = 2
KIND_COLUMNS = 3
MAX_FRAME = 256 * 1024 * 1024
_LEN = struct.Struct("!I")
#: Record columns as arrays, in `record.FIELDS` order (the records are zipped and unzipped
#: whole): span id, parent id, name index, start, end, thread id, trace index; extras in JSON.
_COLUMN_CODES = relay_columns.CODES


def encode_frame(kind: int, payload: Snapshot) -> bytes:
    """A frame of `kind` holding `payload` as JSON (nodes as their timers.json dicts)."""
    body = jsonout.dumps(payload, separators=(",", ":"), allow_nan=True,
                         default=json_default).encode("utf-8")
    return FRAME_HEADER.pack(len(body), kind) + body


def encode_columns(batch: Batch) -> bytes:
    """A batch as a frame of typed columns (array bytes) plus a small JSON header for the
    names, trace ids, rare extras and the resource: about 4x cheaper than JSON records, and
    still nothing that runs code when read. The columns are written by `relay_columns`
    (compiled where built: a worker pays this step per record it relays)."""
    records = batch.records
    if isinstance(records, relay_columns.Packed):  # laid out already, between flushes
        columns, names, traces, positions = (records.raw, records.names, records.traces,
                                             records.positions)
    elif records:
        columns, names, traces, positions = relay_columns.write(records)
    else:  # (what `zip` of no records gave: no columns at all)
        columns, names, traces, positions = b"", [], [], []
    header = json.dumps({
        "resource": dict(batch.resource), "offset_ns": batch.offset_ns,
        "threads": {str(k): v for k, v in batch.thread_names.items()}, "n": len(records),
        "names": names, "traces": [f"{t:x}" for t in traces],
        "extras": {str(i): records[i][EXTRA] for i in positions},
    }, separators=(",", ":")).encode("utf-8")
    body = b"".join([_LEN.pack(len(header)), header, columns])
    return FRAME_HEADER.pack(len(body), KIND_COLUMNS) + body


def decode_columns(body: bytes) -> Batch:
    """The inverse of `encode_columns`; raises ValueError on a malformed frame."""
    if len(body) < _LEN.size:
        raise ValueError("truncated frame")
    (header_len,) = _LEN.unpack_from(body)
    header = json.loads(body[_LEN.size:_LEN.size + header_len])
    n = int(header["n"])
    offset = _LEN.size + header_len
    columns = []
    for code in _COLUMN_CODES:
        column = array(code)
        size = n * column.itemsize
        column.frombytes(body[offset:offset + size])
        if len(column) != n:
            raise ValueError("truncated column")
        columns.append(column)
        offset += size
    if offset != len(body):
        raise ValueError("trailing bytes")
    names = [str(x) for x in header["names"]]
    traces = [int(x, 16) for x in header["traces"]]
    extras: list[Any] = [None] * n
    for index, extra in header["extras"].items():
        extras[int(index)] = extra
    sids, psids, name_idx, starts, ends, tids, trace_idx = columns
    if max(name_idx, default=-1) >= len(names) or max(trace_idx, default=-1) >= len(traces):
        raise ValueError("index out of range")
    # The records are made from the columns when first needed (`Rows`): under `auto` most
    # of a worker's records are placed by their columns and dropped without ever being made.
    frame = Columns(sids, psids, name_idx, names, starts, ends, tids,
                    sorted(int(i) for i, e in header["extras"].items() if e))
    return Batch(header["resource"], int(header["offset_ns"]),
                 Rows(frame, trace_idx, traces, extras),
                 {int(k): v for k, v in header["threads"].items()}, frame)


def _socket_name(address: str) -> str:
    """A relay address as `socket` takes it: "@name" is Linux's abstract namespace."""
    return "\0" + address[1:] if address.startswith("@") else address


class RelayServer:
    """Receives frames from workers; `on_batch(Batch)` and `on_snapshot(dict)` run on its thread."""

    def __init__(self, on_batch: Callable[[Batch], None],
                 on_snapshot: Callable[[Snapshot], None],
                 on_closed: Callable[[int], None] | None = None) -> None:
        self._on_batch = on_batch
        self._on_snapshot = on_snapshot
        #: Called with a worker's pid when its connection closes (it exited or died).
        self._on_closed = on_closed
        self._pids: dict[socket.socket, int] = {}
        import tempfile

        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._dir: str | None = tempfile.mkdtemp(prefix="otel-rl-")
        except OSError:
            if not sys.platform.startswith("linux"):
                raise
            # No writable temp dir: Linux's abstract socket names need none ("@" marks one
            # in the carrier; unlike the 0600 file, any local user could connect to it).
            self._dir = None
            self.address = f"@otel-rl-{os.getpid()}-{os.urandom(8).hex()}"
            self._sock.bind(_socket_name(self.address))
        else:
            os.chmod(self._dir, 0o700)
            self.address = os.path.join(self._dir, "relay.sock")
            self._sock.bind(self.address)
            os.chmod(self.address, 0o600)
        self._sock.listen(128)
        self._sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._buffers: dict[socket.socket, bytearray] = {}
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._owner_pid = os.getpid()
        self._thread = start_daemon("otel_rl-relay", self._loop, wake=self._wake)

    def _loop(self) -> None:
        while not self._stop.is_set() and not stopping():
            self._poll(1.0)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _poll(self, timeout: float) -> bool:
        """One round of the event loop; True if any worker data was read."""
        got = False
        for key, _mask in self._selector.select(timeout):
            if key.data == "wake":
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
            elif key.fileobj is self._sock:
                try:
                    conn, _ = self._sock.accept()
                except OSError:
                    continue
                conn.setblocking(False)
                self._buffers[conn] = bytearray()
                self._selector.register(conn, selectors.EVENT_READ, "conn")
            else:
                got |= self._read(key.fileobj)  # type: ignore[arg-type]
        return got

    def _read(self, conn: socket.socket) -> bool:
        buf = self._buffers[conn]
        try:
            chunk = conn.recv(1 << 20)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._close(conn)
            pid = self._pids.pop(conn, 0)
            if pid and self._on_closed is not None:
                try:
                    self._on_closed(pid)
                except Exception as exc:
                    log.warning("otel_rl: relay close hook failed: %r", exc)
            return False
        buf += chunk
        while len(buf) >= FRAME_HEADER.size:
            length, kind = FRAME_HEADER.unpack_from(buf)
            if length > MAX_FRAME:
                log.warning("otel_rl: relay frame too large (%d bytes); closing", length)
                self._close(conn)
                return True
            if len(buf) < FRAME_HEADER.size + length:
                break
            body = bytes(buf[FRAME_HEADER.size:FRAME_HEADER.size + length])
            del buf[:FRAME_HEADER.size + length]
            self._dispatch(kind, body, conn)
        return True

    def _dispatch(self, kind: int, body: bytes, conn: socket.socket | None = None) -> None:
        try:
            if kind == KIND_COLUMNS:
                self._on_batch(decode_columns(body))
            elif kind == KIND_SNAPSHOT:
                snapshot: Snapshot = loads_deep(body)  # type: ignore[assignment]
                if conn is not None and isinstance(snapshot.get("pid"), int):
                    self._pids[conn] = snapshot["pid"]
                self._on_snapshot(received(snapshot))
        except Exception as exc:  # a malformed frame costs that frame only
            log.warning("otel_rl: ignoring a malformed relay frame: %r", exc)

    def _close(self, conn: socket.socket) -> None:
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        self._buffers.pop(conn, None)
        try:
            conn.close()
        except OSError:
            pass

    def drain(self, deadline: float) -> None:
        """Read what workers already sent (their last words before exiting): while one is
        connected, until two polls of 50 ms in a row read nothing; with none connected, one
        look that does not wait (it accepts a worker connecting now, and a worker that is not
        connected has nothing in flight). The run's end no longer waits 0.1 s for workers that
        have all exited, as ML-Agents' and Sample Factory's have by then."""
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:
            connected = bool(self._buffers)
            got = self._poll(0.05 if connected else 0.0)
            if not connected and not self._buffers:
                return
            quiet = 0 if got else quiet + 1

    def stop(self, deadline: float) -> None:
        if os.getpid() != self._owner_pid:
            return
        self._stop.set()
        self._wake()
        self._thread.join(max(0.0, min(2.0, deadline - time.monotonic())))
        if not self._thread.is_alive():
            self.drain(deadline)
        for conn in list(self._buffers):
            self._close(conn)
        for s in (self._sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        import shutil

        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copies of the parent's sockets (the socket
        file and the parent's connections stay the parent's)."""
        for s in (*self._buffers, self._sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        self._buffers.clear()
        try:
            self._selector.close()
        except (OSError, ValueError):
            pass


class RelayClient(Sink):
    """A worker's end: sends batches and snapshots; `connect` fails fast when no parent listens."""

    name = "relay"

    def __init__(self, address: str, stats: Stats, timeout: float = 5.0) -> None:
        self.address = address
        self.label = "parent process"
        self._stats = stats
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(_socket_name(address))
        self._lock = threading.Lock()
        self._broken = False
        #: Records written whole into the connection (see `records_sent`).
        self._sent = 0
        #: Called (once) when the parent is gone, and then with each batch the relay could
        #: not take, so the worker can write them itself (`ledger_hooks.orphaned`).
        self.on_broken: Callable[[Sequence[Batch]], None] | None = None

    def records_sent(self) -> int:
        """Records written whole into the connection so far (counted with the write, under
        its lock: an orphan compares it with what its dead parent had read)."""
        with self._lock:
            return self._sent

    def _send(self, frame: bytes, records: int = 0) -> bool:
        if self._broken:
            return False
        with self._lock:
            try:
                self._sock.sendall(frame)
                self._sent += records
                return True
            except OSError as exc:
                self._broken = True
                if self.on_broken is None:
                    self._stats.warn_once("relay", f"lost the parent process's relay: {exc}")
                return False

    def export(self, batches: Sequence[Batch], deadline: float) -> None:
        for batch in batches:
            if not batch.records:
                continue
            if self._send(encode_columns(batch), len(batch.records)):
                self._stats.add_exported(self.name, len(batch.records))
                continue
            fallback = self.on_broken
            if fallback is None:
                self._stats.add_dropped("unreachable", len(batch.records), self.name,
                                        "lost the parent process's relay")
            else:  # re-routed to this process's own sinks: the relay's ledger lets go of it
                self._stats.ledger.offered(self.name, -len(batch.records))
                fallback([batch])

    def send_snapshot(self, snapshot: Snapshot) -> None:
        self._send(encode_frame(KIND_SNAPSHOT, snapshot))

    def after_flush(self) -> None:
        """Called once a flush has handed everything to the sinks (each frame is already
        sent here; a sink that sends one message per flush sends it now)."""

    def shutdown(self, deadline: float) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def forget_after_fork(self) -> None:
        """In a forked child: close its copy of the parent's (a worker's) connection."""
        self.shutdown(0.0)
