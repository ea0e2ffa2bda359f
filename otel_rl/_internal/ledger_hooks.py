"""The runtime's side of the ledger: timers.json's ledger keys, the spans file's reserve,
workers that died, workers whose parent is gone, and two runs sharing one output folder.

Kept out of `runtime` so that the runtime's edits stay small hooks: `Runtime` holds one
`LedgerState` and calls `main_started`, `output_dir`, `relayed`, `snapshot_seen`,
`worker_lost`, `before_final_flush`, `checkpoint_inputs`, `timers_written`, `ledger_metadata`,
`snapshot_extras`, `windowed`, `watch_parent`, `parent_gone`, `orphaned` and `shut_down` at the
points their docstrings name. A relaying worker's exact record count lives in `tallyfile`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from otel_rl._internal import log, mainledger, tallyfile
from otel_rl._internal.config import run_folder
from otel_rl._internal.mainledger import DROPPED_KEY, LEDGER_KEY, RUN_MARK
from otel_rl._internal.record import SPAN_ID, TRACE_ID, OpenSpan

if TYPE_CHECKING:
    from otel_rl._internal.carrier import Context
    from otel_rl._internal.config import Settings
    from otel_rl._internal.otlp.records import Batch
    from otel_rl._internal.pipeline import Pipeline
    from otel_rl._internal.recorder import Trace
    from otel_rl._internal.relay import RelayClient
    from otel_rl._internal.shapes import AttributeValue
    from otel_rl._internal.sinks.base import Sink, Stats
    from otel_rl._internal.sinks.queue import SinkQueue
    from otel_rl._internal.wholerun import Snapshot, TreeInputs

__all__ = ["DROPPED_KEY", "LEDGER_KEY", "LedgerState", "before_final_flush",
           "checkpoint_inputs", "ledger_metadata", "main_started", "orphaned", "output_dir",
           "parent_gone", "relayed", "shut_down", "snapshot_extras", "snapshot_seen",
           "timers_written", "watch_parent", "windowed", "worker_lost"]


class Runtime(Protocol):
    """What the ledger reads and sets of `runtime.Runtime` (named here, not imported: the
    runtime imports this module, and imports point one way)."""

    settings: Settings
    ctx: Context | None
    closed: bool
    is_worker: bool
    spans_on: bool
    run_id: str
    role: str | None
    index: int | None
    stats: Stats
    ledger_state: LedgerState
    snapshots: dict[str, Snapshot]
    snapshots_lock: threading.Lock
    relay_client: RelayClient | None
    output_dir: str | None
    pipeline: Pipeline
    trace: Trace
    windower: Any

    def own_sinks(self) -> list[Sink]: ...

    def relayed_snapshots(self) -> list[Snapshot]: ...



def ledger_metadata(metadata: dict[str, str], stats: Stats) -> None:
    """timers.json's ledger keys, when anything was lost: the most spans any one sink lost,
    and the ledger itself (per sink: recorded, delivered, lost by reason). A run that lost
    nothing has neither, so its timers.json equals the tree rebuilt from its spans."""
    ledger = stats.ledger
    worst = ledger.lost_most()
    if worst or ledger.notes or ledger.unconfirmed():
        metadata[DROPPED_KEY] = str(worst)
        metadata[LEDGER_KEY] = json.dumps(ledger.summary(), separators=(",", ":"),
                                          sort_keys=True)
    else:
        metadata.pop(DROPPED_KEY, None)
        metadata.pop(LEDGER_KEY, None)


def checkpoint_inputs(inputs: TreeInputs, final: bool) -> TreeInputs:
    """The main process's timers.json before the run ends (a periodic checkpoint) says so: if
    the process is then killed (SIGKILL, OOM) it is what stays, and readers call it partial."""
    if final:
        return inputs
    from otel_rl._internal.aggregates import MAIN_UNFINISHED

    return {**inputs, "notes": [*inputs.get("notes", ()), MAIN_UNFINISHED]}


def main_started(rt: Runtime) -> None:
    """The runtime started. The program's main process under ``otel-rl run`` (a launcher
    survives it), or with ``count_if_killed`` (it starts a `watcher` that survives it), counts
    in a tally file and mirrors its ledger there (`mainledger`)."""
    if rt.is_worker or rt.settings.disabled:
        return
    if not mainledger.has_survivor():
        if not rt.settings.count_if_killed:
            return
        from otel_rl._internal import watcher

        if not watcher.start(rt.run_id, rt.output_dir):
            rt.stats.warn_once("watcher", "count_if_killed: could not start the watcher "
                               "process; a killed main process's loss will not be counted")
            return
    from otel_rl._internal import recorder

    # Configured again: what it counted for the runtime before was settled by that one.
    made_before = recorder.tallied() if tallyfile.sharing() else 0
    tally = tallyfile.share(rt.run_id)
    rt.ledger_state.tally = tally
    mainledger.share(rt.stats.ledger, rt.run_id, rt.output_dir, rt.settings.spans, tally,
                     made_before)


def windowed(rt: Runtime, taken: list[Batch], out: list[Batch]) -> None:
    """After the windows (``spans="auto"``) took a flush, in a main process whose ledger is
    mirrored (`mainledger`): how many records they have left out for good (taken, neither
    given out nor waiting in an undecided window) and made up (continuations, window spans),
    so that a survivor counts a killed main process exactly under ``auto`` too."""
    ledger = rt.stats.ledger
    windower = rt.windower
    if ledger.mirror is None or windower is None:
        return
    state = rt.ledger_state
    try:
        state.windows_in += sum(len(batch.records) for batch in taken)
        state.windows_out += sum(len(batch.records) for batch in out)
        made_up = windower.stats["continuations"] + (windower.stats["windows"] if windower.main
                                                     else 0)
        waiting = sum(window.held() for window in windower.windows.values())  # (rings too)
    except Exception:  # (a bug costs the count's exactness, never the flush)
        return
    ledger.windowed(max(0, state.windows_in - (state.windows_out - made_up) - waiting), made_up)


def timers_written(rt: Runtime, size: int) -> None:
    """After timers.json was written (`size` characters): the spans file leaves room for
    three times that (the atomic rewrite needs the old and the new copy at once)."""
    from otel_rl._internal.sinks.file import MIN_RESERVE, FileSink

    for sink in rt.pipeline.sinks:
        if isinstance(sink, FileSink):
            sink.reserve = max(MIN_RESERVE, 3 * size)


def output_dir(rt: Runtime, path: str | None) -> str | None:
    """The output folder of this run. A folder another run already wrote to is never written
    over: this run goes to a sub-folder named by its run id (said in one line). Another run is
    one with another run id, or the same run id in another process (a script re-run with a
    fixed ``OTEL_RL_RUN_ID``); the same process configuring again continues its folder."""
    if path is None or rt.is_worker:
        return path
    mine = f"{rt.run_id} {os.getpid()}"
    mark = os.path.join(path, RUN_MARK)
    try:
        with open(mark, encoding="utf-8") as f:
            other = f.read().strip()
    except FileNotFoundError:
        other = "" if not os.path.exists(os.path.join(path, "timers.json")) else "?"
    except OSError:
        return path  # unreadable: the writes will say what is wrong
    if other and other != mine:
        other_id = other.split(" ")[0] if other != "?" else "(unknown)"
        name = rt.run_id if other_id != rt.run_id else f"{rt.run_id}-{os.getpid()}"
        moved = os.path.join(path, name)
        log.warning("otel_rl: %s already holds run %s; this run (%s) writes to %s", path,
                    other_id, rt.run_id, moved)
        path = moved
        mark = os.path.join(path, RUN_MARK)
    try:
        os.makedirs(path, exist_ok=True)
        with open(mark, "w", encoding="utf-8") as f:
            f.write(mine + "\n")
    except OSError:
        pass  # the sinks and timers.json report an unwritable folder themselves
    return path


# -- workers ---------------------------------------------------------------------------------

class LedgerState:
    """The ledger's process state, one per `Runtime` (`Runtime.ledger_state`): in the main
    process, records received per relaying worker's pid, the `multiprocessing` Process of each pid (so
    its exit code is known after `join()` took it out of multiprocessing's own list) and the
    workers that died; in a relaying worker, its parent's pid and, once that parent is gone,
    the queues of its own sinks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: dict[int, int] = {}
        #: Workers whose death `worker_lost` handles (once each).
        self.died: set[int] = set()
        #: Held until the worker's final report or its death was handled (the program may
        #: drop its own reference as soon as `join()` returns).
        self.processes: dict[int, Any] = {}
        self.parent_pid: int | None = None
        self.own: list[SinkQueue] | None = None
        #: In a relaying worker: its shared record count's file (`tallyfile`).
        self.tally: str | None = None
        #: In the main process: what the latest relayed batches of each worker recorded of
        #: the blocks its snapshot said were open (their span ids), so that a worker that
        #: dies is not given a cut-short copy of a block whose span already arrived.
        self.open_sids: dict[int, set[int]] = {}
        #: Per worker pid: its latest batch's resource, offset, thread names and trace id,
        #: the shape of the cut-short spans the parent exports for it if it dies.
        self.shape: dict[int, tuple[Any, int, Any, int]] = {}
        #: Once orphaned under ``otel-rl run``: the dead parent whose mirror it read.
        self.orphan_of: int | None = None
        #: Records the windows took and gave out so far (`windowed`; a mirrored main only).
        self.windows_in = 0
        self.windows_out = 0
        #: Records counted lost by `worker_lost` here (workers of this process that died);
        #: a relaying worker reports it, the main process adds it from every report.
        self.killed = 0


def relayed(rt: Runtime, batch: Batch) -> None:
    """A worker's batch arrived (the relay's thread): count it for its pid."""
    pid = batch.resource.get("process.pid")
    if not isinstance(pid, int):
        rt.stats.ledger.taken(len(batch.records))
        return
    rt.stats.ledger.taken(len(batch.records), source=pid)
    workers = rt.ledger_state
    with workers.lock:
        if pid not in workers.received:
            _remember_process(workers, pid)
        workers.received[pid] = workers.received.get(pid, 0) + len(batch.records)
        try:
            records = batch.records
            if records:
                workers.shape[pid] = (batch.resource, batch.offset_ns, batch.thread_names,
                                      int(records[-1][TRACE_ID]))
            opened = workers.open_sids.get(pid)
            if opened:  # blocks open at its last report that ended since
                columns = batch.columns  # (a relayed batch's records are made on first need)
                opened.difference_update(columns.sids if columns is not None
                                         else [record[SPAN_ID] for record in records])
        except (TypeError, IndexError, ValueError):
            pass  # not records as this module knows them: no cut-short copies then


def snapshot_seen(rt: Runtime, snap: Snapshot) -> None:
    """A worker's snapshot arrived (the relay's thread): the blocks it says are open; a final
    one means its tally file is no longer needed."""
    pid = snap.get("pid")
    if not isinstance(pid, int):
        return
    workers = rt.ledger_state
    if snap.get("final"):  # it finished: nothing of it will be cut short or counted
        with workers.lock:
            workers.open_sids.pop(pid, None)
            workers.shape.pop(pid, None)
            workers.processes.pop(pid, None)
        path = snap.get("tally")
        if isinstance(path, str):
            tallyfile.remove(path)
        return
    with workers.lock:
        if pid not in workers.processes:  # (its exit code, once `join()` forgot it)
            _remember_process(workers, pid)
        workers.open_sids[pid] = {block.span_id for block in OpenSpan.all_from_wire(pid, snap.get("open"))}


def _remember_process(workers: LedgerState, pid: int) -> None:
    mp = sys.modules.get("multiprocessing.process")
    for process in list(getattr(mp, "_children", ()) if mp is not None else ()):
        try:
            if process.pid == pid:
                workers.processes[pid] = process
        except (AttributeError, TypeError):
            continue


def _exit_code(workers: LedgerState, pid: int) -> int | None:
    """The exit code `multiprocessing` saw for child `pid`, if it started it."""
    process = workers.processes.get(pid)
    if process is None:
        _remember_process(workers, pid)
        process = workers.processes.get(pid)
    if process is None:
        return None
    try:
        code = process.exitcode
    except Exception:
        return None
    return code if isinstance(code, int) else None


def worker_lost(rt: Runtime, pid: int) -> None:
    """The relay connection of worker `pid` closed before its final snapshot: it died (killed,
    OOM, os._exit). Its records recorded by its last snapshot and never received are lost
    ("killed worker"); its blocks in the tree are flagged partial."""
    if pid <= 0:
        return
    workers = rt.ledger_state
    with rt.snapshots_lock:
        snap = rt.snapshots.get(str(pid))
    if snap is None or snap.get("final"):
        return
    path = snap.get("tally")
    if isinstance(path, str) and tallyfile.count(path) == 0 and not received_any(rt, pid):
        tallyfile.remove(path)  # it recorded nothing (it said hello, then exited): no loss
        with workers.lock:
            workers.processes.pop(pid, None)
        return
    code = _exit_code(workers, pid)
    for _ in range(20):  # the socket closes a moment before the process is gone
        if code is not None:
            break
        time.sleep(0.05)
        code = _exit_code(workers, pid)
    with workers.lock:
        if pid in workers.died:
            return
        received = workers.received.get(pid, 0)
        how = (f"killed by signal {-code}" if code is not None and code < 0
               else f"exit code {code}" if code is not None else "connection closed")
        role = f"{snap.get('role') or 'worker'} {snap.get('index') or 0}"
        workers.died.add(pid)
    cut = _cut_short(rt, pid, snap, how)
    counted = tallyfile.count(path) if isinstance(path, str) else None
    if counted is not None:
        # Exact: everything it recorded (its open blocks included) that neither arrived, nor
        # was dropped by its full buffer (counted from its report), nor is exported cut short.
        lost = max(0, counted - received - int(snap.get("dropped") or 0) - cut)
        note = (f"worker {role} (pid {pid}) died before it finished ({how}): {lost} of its "
                f"block(s) since its last report were lost (counted)"
                + (f", {cut} open block(s) exported cut short" if cut else ""))
    else:
        recorded = int(snap.get("recorded") or 0)
        lost = max(0, recorded - received)
        note = (f"worker {role} (pid {pid}) died before it finished ({how}): at least {lost} "
                f"of its block(s) were lost (a lower bound: it had no tally file, no writable "
                f"/dev/shm or temp dir; what it recorded after its last report is not counted)")
    rt.stats.add_dropped("killed worker", lost, None, f"worker pid {pid}: {how}")
    # (never records of this process; and a launcher reading the mirror must not count it
    # again from its tally file, removed only now)
    rt.stats.ledger.taken(0, outside=lost, source=pid, counted=True)
    if isinstance(path, str):
        tallyfile.remove(path)
    with workers.lock:
        workers.killed += lost
        workers.processes.pop(pid, None)
    rt.stats.ledger.note(note)
    with rt.snapshots_lock:
        current = rt.snapshots.get(str(pid))
        if current is not None:
            current["died"] = note


def received_any(rt: Runtime, pid: int) -> bool:
    with rt.ledger_state.lock:
        return rt.ledger_state.received.get(pid, 0) > 0


def _cut_short(rt: Runtime, pid: int, snap: Snapshot, how: str) -> int:
    """A dead worker's blocks that were open at its last report (and did not end since) as
    spans ending now, marked cut short and why; returns how many."""
    from otel_rl._internal import recorder, semconv
    from otel_rl._internal.otlp.records import Batch

    workers = rt.ledger_state
    with workers.lock:
        still = workers.open_sids.pop(pid, set())
        shape = workers.shape.pop(pid, None)
    if shape is None or not rt.spans_on:
        return 0
    resource, offset_ns, thread_names, trace_id = shape
    end_ns = recorder.now_ns()
    attrs: dict[str, AttributeValue] = {semconv.CUT_SHORT: True,
                                        semconv.DIED: f"process died ({how})"}
    records = [block.record(end_ns, trace_id, {"attrs": attrs})
               for block in OpenSpan.all_from_wire(pid, snap.get("open")) if block.span_id in still]
    if records:
        rt.stats.ledger.taken(len(records))
        rt.pipeline.add_relayed(Batch(resource, offset_ns, records, thread_names))
    return len(records)


def before_final_flush(rt: Runtime) -> None:
    """At shutdown, after the relay stopped: what relaying workers dropped before their
    records reached this process (their span buffers were full) is lost for every sink
    here too. (Workers whose connection closed without a final snapshot were handled by
    `worker_lost`.)"""
    dropped = killed = 0
    for snap in rt.relayed_snapshots():
        value = snap.get("dropped")
        if isinstance(value, int):
            dropped += value
        value = snap.get("killed")
        if isinstance(value, int):
            killed += value
    rt.stats.add_dropped("buffer full", dropped, None,
                         "worker processes' span buffers were full")
    # A worker's worker that died: its parent (a worker itself) counted it.
    rt.stats.add_dropped("killed worker", killed, None, "a worker's own worker died")
    rt.stats.ledger.taken(0, outside=dropped + killed)


def shut_down(rt: Runtime) -> None:
    """At the end of shutdown: tally files are no longer needed; a worker removes its own
    (its final report is out), the main process those of workers still running (they no
    longer have anyone to read them; their mappings stay valid)."""
    own = rt.ledger_state.tally
    if own is not None:
        tallyfile.remove(own)
        rt.ledger_state.tally = None
    for snap in rt.relayed_snapshots():
        path = snap.get("tally")
        if isinstance(path, str):
            tallyfile.remove(path)
    if not rt.is_worker:
        tallyfile.remove_run(rt.run_id)
    elif rt.ledger_state.orphan_of is not None:
        mainledger.orphan_ended(rt.run_id, rt.ledger_state.orphan_of)


def snapshot_extras(rt: Runtime) -> Snapshot:
    """What a worker's snapshot adds for the parent's ledger: records it has recorded so far
    (handed to its relay or still buffered), whether this is its final word, and where its
    shared record count is (a worker whose records are discarded has none to count)."""
    extras: Snapshot = {"recorded": rt.pipeline.drained + len(rt.pipeline.buffer),
                        "final": rt.closed}
    path = rt.ledger_state.tally
    if path is not None and rt.trace.sink is rt.pipeline.buffer:
        extras["tally"] = path
    killed = rt.ledger_state.killed
    if killed:
        extras["killed"] = killed
    return extras


# -- orphans ---------------------------------------------------------------------------------

def watch_parent(rt: Runtime) -> None:
    """In a relaying worker (at start): when the parent goes away, `orphaned` takes over."""
    client = rt.relay_client
    if client is None:
        return
    rt.ledger_state.parent_pid = os.getppid()
    client.on_broken = lambda batches: orphaned(rt, batches)
    if rt.ctx is not None and not rt.ctx.sampled:
        return  # its records are discarded: nothing for the parent to count
    path = rt.ledger_state.tally = tallyfile.share(rt.run_id)
    if path is not None:
        # A first word at once, so that a worker killed before its first flush is known to
        # the parent (by pid) and counted too.
        client.send_snapshot({"pid": os.getpid(), "role": rt.role or "worker",
                              "index": rt.index if rt.index is not None else 0,
                              "recorded": 0, "final": False, "tally": path})


def _relay_gap(rt: Runtime) -> None:
    """Orphaned: batches this worker wrote to the relay that its parent died before reading
    were counted delivered; the parent's mirror (under ``otel-rl run``) says how many it had
    received from this worker, so the rest is lost ("killed main"), said by this worker."""
    parent = rt.ledger_state.parent_pid
    if parent is None:
        return
    received = mainledger.received_from(rt.run_id, parent, os.getpid())
    if received is None:
        return
    from otel_rl._internal.relay import RelayClient

    client = next((q.sink for q in rt.pipeline.queues if isinstance(q.sink, RelayClient)), None)
    if client is None:
        return
    sent = client.records_sent()
    if sent > received:
        rt.stats.ledger.recall("relay", sent - received, mainledger.KILLED_MAIN,
                               f"relay: {sent - received} span(s) sent to the parent process "
                               f"(pid {parent}), which died before reading them")
    rt.ledger_state.orphan_of = parent


def parent_gone(rt: Runtime) -> bool:
    """Checked at each flush of a relaying worker (cheap): was it re-parented?"""
    ppid = rt.ledger_state.parent_pid
    return ppid is not None and os.getppid() != ppid


def orphaned(rt: Runtime, batches: Sequence[Batch] = ()) -> None:
    """The parent process is gone (killed, or exited first): this worker stops relaying and
    exports on its own, as a worker with no relay does: its own spans file (and collector)
    from now on, its own timers.<pid>.json and aggregate, and at its end its open blocks cut
    short. `batches` the relay could not take go there too."""
    from otel_rl._internal.sinks.queue import SinkQueue

    with rt.ledger_state.lock:
        own = rt.ledger_state.own
        if own is None:
            client = rt.relay_client
            rt.relay_client = None  # from now on the runtime checkpoints on its own
            if client is not None:
                client.on_broken = lambda more: orphaned(rt, more)
            if rt.output_dir is None and not rt.settings.endpoint:
                rt.output_dir = run_folder(rt.run_id)
            sinks = rt.own_sinks()
            own = [SinkQueue(sink, rt.stats, queue.max_spans, queue.export_timeout)
                   for sink in sinks for queue in rt.pipeline.queues[:1]]
            rt.ledger_state.own = own
            # Before its tally goes: while the tally is there, the launcher keeps the
            # parent's mirror for it (`mainledger.orphan_ended`).
            _relay_gap(rt)
            if rt.ledger_state.tally is not None:  # nobody reads it any more
                tallyfile.remove(rt.ledger_state.tally)
                rt.ledger_state.tally = None
            # New flushes go to the own sinks only: in one step with the hand-off, so that
            # a flush under way puts its batch into the relay or into these, never neither.
            rt.pipeline.reroute([q for q in rt.pipeline.queues
                                 if client is not None and q.sink is client], own)
            rt.pipeline.sinks = [*rt.pipeline.sinks, *sinks]
            where = ", ".join(s.label or s.name for s in sinks) or "nowhere"
            log.warning("otel_rl: worker %d: the parent process is gone; exporting its own "
                        "spans to %s", os.getpid(), where)
            if not rt.closed:
                for queue in own:
                    queue.start()
    for queue in own:
        if rt.closed:  # shutdown has stopped the queues: write them from this thread
            queue.export_now(batches, time.monotonic() + min(2.0, rt.settings.shutdown_timeout))
        else:
            queue.put(batches)
