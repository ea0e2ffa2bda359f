"""A killed main process's loss, counted by the process that outlives it (issue 16).

Under ``otel-rl run`` the launcher survives the program. The program's main process then
counts as a relaying worker does (`tallyfile`: its timed blocks' span ids in a shared file,
its other records in slot 0) and copies its ledger, as it changes, into a second small shared
file (`Mirror`, ``otel-rl-<run id>-<pid>.ledger`` next to the tally): per sink what was offered,
delivered, lost by reason and is being sent now, the losses before any sink, and the records
handed in by workers. Both are a few stores per batch, off the training thread; the page cache
keeps them when the process is SIGKILLed (or OOM-killed).

When the main process ends without its shutdown (which removes both files), the launcher
(`after_main`) reads them and computes, per sink, what the main process still held: its own
records and the workers' records it had received, neither offered to the sink nor lost yet
(its buffer, its open blocks, the relay's buffer), plus what sat in the sink's queue. That is
lost ("killed main"); the request being sent at that moment is "unconfirmed" (a spans file's
line being written is looked up in the file: there whole, delivered; else lost). So,
per sink: recorded = delivered + lost + unconfirmed, exactly (with ``spans="auto"`` too: the
windows' records left out for good and made up are mirrored, `Ledger.windowed`). It says so
in one line and writes it into the run's timers.json (`otel_rl_ledger`, a note, ``complete:
false``). Without a tally file the count is a lower bound, and the line says so.

``configure()`` in code has a survivor only with ``count_if_killed`` (`watcher`, which runs
`after_main` too). Without one nothing is copied: the main process runs the plain hot path; a
SIGKILL then loses its unflushed records uncounted, and only the periodic timers.json's note
("never finished") says it (see docs/DESIGN.md).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import time
from collections.abc import MutableSequence
from typing import TYPE_CHECKING, Any, cast

from otel_rl._internal import tallyfile
from otel_rl._internal.ledger import REASONS, UNCONFIRMED

if TYPE_CHECKING:
    from otel_rl._internal.ledger import Ledger

__all__ = ["DROPPED_KEY", "LEDGER_KEY", "SURVIVOR_ENV", "Mirror", "after_main", "alive",
           "has_survivor", "share"]

#: A file in the output folder naming the run (and its main pid) that writes there.
RUN_MARK = ".otel-rl-run"
#: Metadata keys of timers.json (`ledger_hooks.ledger_metadata` writes them too).
DROPPED_KEY = "otel_rl_dropped_spans"
LEDGER_KEY = "otel_rl_ledger"

#: Set by ``otel-rl run`` for the program: the launcher's pid (the survivor).
SURVIVOR_ENV = "OTEL_RL_SURVIVOR"
#: Set by ``otel-rl run``: the main process is the first to claim it (see `zerocode`).
_MAIN_ENV = "OTEL_RL_ZEROCODE_MAIN"

_MAGIC = 0x6F746C6C65646731  # "otlledg1"
#: uint64 slots: 0 magic, 1 taken in, 2 outside, 3 header length, 4 left out and 5 made up
#: by the windows (``spans="auto"``), 6 set when the workers' table below could not grow,
#: 7 what Ray workers had reported and not delivered plus one (0: no Ray workers);
#: 8.. upstream by reason;
#: from 32, per sink: offered, delivered, sending, lost by reason (9), then a file sink's line
#: being written: its first and end byte and what was delivered before it (16 slots each).
_UPSTREAM = 8
_SINKS = 32
_PER_SINK = 16
_MAX_SINKS = 14
_INCOMPLETE = 6
_ELSEWHERE = 7
_AT = 3 + len(REASONS)
_ALL = 2 ** 64 - 1
_HEADER_AT = 4096  # bytes: the JSON header (sink names and labels, output folder, ...)
#: From byte 8192 to the end of the file: (worker pid, records received from it) pairs, in the
#: order workers first sent, for orphans and for workers killed with it; room for 128 at
#: first, the file grows (doubling) as more workers come.
_SIZE = 8192
_PAIRS = 128
#: The reason a survivor gives for what the killed main process held.
KILLED_MAIN = REASONS[5]


class Mirror:
    """The ledger's counts in a shared file (see the module's docstring)."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        import ctypes  # only in a main process that has a survivor

        self._ctypes = ctypes
        self.path = path
        self._header = header
        #: Every mapping made (kept: a grown file is mapped again, the old one stays valid).
        self._mappings: list[object] = []
        self._mapping = self._map(_SIZE + 16 * _PAIRS, create=True)
        self._slots = cast(MutableSequence[int],
                           (ctypes.c_uint64 * (_HEADER_AT // 8)).from_buffer(self._mapping))
        self._pairs = self._pairs_in(self._mapping)
        self._slots[0] = _MAGIC
        #: Worker pid -> its pair's index (pid, records received from it).
        self._sources: dict[int, int] = {}

    def _map(self, size: int, create: bool = False) -> mmap.mmap:
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0), 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._mappings.append(mapping)
        return mapping

    def _pairs_in(self, mapping: mmap.mmap) -> MutableSequence[int]:
        pairs = (self._ctypes.c_uint64 * ((len(mapping) - _SIZE) // 8)).from_buffer(mapping,
                                                                                     _SIZE)
        self._mappings.append(pairs)
        return cast(MutableSequence[int], pairs)

    def _pair(self, source: int) -> int | None:
        """The index of worker `source`'s pair, a new one for a new worker (the file grows
        when full; None if it cannot: slot 6 then says the table is incomplete)."""
        index = self._sources.get(source)
        if index is not None:
            return index
        index = len(self._sources)
        if 2 * index + 2 > len(self._pairs):
            try:
                self._pairs = self._pairs_in(self._map(_SIZE + 2 * 8 * len(self._pairs)))
            except (OSError, ValueError):
                self._slots[_INCOMPLETE] = 1
                return None
        self._sources[source] = index
        self._pairs[2 * index] = source
        return index

    def sinks(self, accounts: dict[str, Any]) -> None:
        self._header["sinks"] = [[name, a.label] for name, a in accounts.items()
                                 if a.index < _MAX_SINKS]
        data = json.dumps(self._header).encode("utf-8")[:_SIZE - _HEADER_AT]
        self._mapping[_HEADER_AT:_HEADER_AT + len(data)] = data
        self._slots[3] = len(data)

    def account(self, account: Any, lost: bool = False) -> None:
        """`account`'s counts (with `lost`: its losses too, which change rarely)."""
        if account.index >= _MAX_SINKS:
            return
        slots = self._slots
        base = _SINKS + _PER_SINK * account.index
        if account.sending:  # (before the count it qualifies: the process may die between)
            slots[base + _AT:base + _AT + 3] = account.sending_at
        slots[base] = account.offered
        slots[base + 1] = account.delivered
        slots[base + 2] = account.sending
        if lost:
            for i, reason in enumerate(REASONS):
                slots[base + 3 + i] = account.lost.get(reason, 0)

    def totals(self, ledger: Ledger, source: int | None = None) -> None:
        slots = self._slots
        if source is not None:
            index = self._pair(source)
            if index is not None:  # (all ones: its death was counted there)
                self._pairs[2 * index + 1] = ledger.sources.get(source, 0) & _ALL
        slots[1] = ledger.taken_in
        slots[2] = ledger.outside
        slots[4] = ledger.left_out
        slots[5] = ledger.made_up
        slots[_ELSEWHERE] = 0 if ledger.elsewhere is None else ledger.elsewhere + 1
        for i, reason in enumerate(REASONS):
            slots[_UPSTREAM + i] = ledger.upstream.get(reason, 0)


def _path(run_id: str, pid: int) -> str:
    return os.path.join(tallyfile.folder(), f"{tallyfile.prefix(run_id)}{pid}.ledger")


def has_survivor() -> bool:
    """This is the program's main process under ``otel-rl run`` (its child, or a grandchild
    through a shell), whose launcher outlives it."""
    survivor = os.environ.get(SURVIVOR_ENV, "")
    return (survivor.isdigit() and int(survivor) != os.getpid()
            and os.environ.get(_MAIN_ENV) == f"pid:{os.getpid()}")


def share(ledger: Ledger, run_id: str, output_dir: str | None, spans: str,
          tally: str | None, made_before: int) -> None:
    """Copy `ledger` where the launcher reads it (`tally`: this process's tally file, None
    if it could not be made; `made_before`: what it had counted for an earlier runtime)."""
    header = {"pid": os.getpid(), "run_id": run_id, "spans": spans, "tally": tally,
              "output_dir": os.path.abspath(output_dir) if output_dir else None,
              "made_before": made_before}
    try:
        mirror = Mirror(_path(run_id, os.getpid()), header)
    except (OSError, ValueError):
        return  # the launcher finds no file: it says nothing was counted
    ledger.attach(mirror)


def _read(path: str) -> tuple[list[int], dict[str, Any], dict[int, int]] | None:
    """A mirror's slots, header and received count per worker pid (None: no mirror)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _SIZE or len(data) % 16:
        return None
    slots = list(struct.unpack(f"<{_HEADER_AT // 8}Q", data[:_HEADER_AT]))
    if slots[0] != _MAGIC:
        return None
    try:
        header = json.loads(data[_HEADER_AT:_HEADER_AT + slots[3]].decode("utf-8"))
    except ValueError:
        return None
    pairs = memoryview(data)[_SIZE:].cast("Q")
    received = {}
    for i in range(0, len(pairs), 2):
        if pairs[i] == 0:
            break  # (filled in order)
        received[pairs[i]] = pairs[i + 1]
    return slots, header if isinstance(header, dict) else {}, received


def count(slots: list[int], header: dict[str, Any], made: int | None) -> dict[str, Any]:
    """The killed main process's ledger (as `Ledger.summary`), from its mirror and its tally
    count (`made`; None: unknown, the result is then a lower bound), with what its Ray
    workers had reported and it never received (`_elsewhere`)."""
    upstream = {r: slots[_UPSTREAM + i] for i, r in enumerate(REASONS) if slots[_UPSTREAM + i]}
    taken, outside = slots[1], slots[2]
    inside = sum(upstream.values()) - outside  # upstream losses of records it had held
    # Under spans="auto": records the windows had left out for good are not held; the ones
    # they made up were offered but never recorded (`Ledger.windowed`).
    left_out, made_up = slots[4], slots[5]
    sinks: dict[str, Any] = {}
    for index, (name, label) in enumerate(header.get("sinks") or ()):
        base = _SINKS + _PER_SINK * index
        offered, delivered, sending = slots[base:base + 3]
        lost = {r: slots[base + 3 + i] for i, r in enumerate(REASONS) if slots[base + 3 + i]}
        unconfirmed = lost.pop(UNCONFIRMED, 0)
        pending = max(0, offered - delivered - sum(lost.values()) - unconfirmed)
        flying = min(sending, pending)  # being written when it died: it may have arrived
        if flying and name == "file":
            line = _written(label, header, slots[base + _AT:base + _AT + 3], delivered)
            if line is not None:  # a file says whether the line is in it
                if line:
                    delivered += flying
                    pending -= flying
                flying = 0
        held = (max(0, made + taken + made_up - offered - inside - left_out)
                if made is not None else 0)
        for reason, n in upstream.items():
            lost[reason] = lost.get(reason, 0) + n
        killed = held + pending - flying
        if killed:
            lost[KILLED_MAIN] = lost.get(KILLED_MAIN, 0) + killed
        sinks[name] = {"sink": label, "recorded": offered + sum(upstream.values()) + held,
                       "delivered": delivered, "lost": lost, "pending": 0}
        if unconfirmed + flying:
            sinks[name]["unconfirmed"] = unconfirmed + flying
    summary: dict[str, Any] = {"sinks": sinks, "upstream": upstream, "notes": []}
    _elsewhere(summary, slots)
    if left_out:  # (not lost: the spans policy's)
        summary["left_out"] = left_out
    if made_up:  # (records, not blocks: what was lost or unconfirmed holds some of them)
        summary["made_up"] = made_up
    return summary


def _written(label: str, header: dict[str, Any], at: list[int], delivered: int) -> bool | None:
    """Whether the file sink's line being written when the process died is in the file
    (`at`: its first and end byte, and what was delivered before it; None: cannot tell). A
    torn line is cut off, as the sink does when a write fails."""
    start, end, before = at
    if end <= start or before != delivered:
        return None  # (not a line of this count: the process died after counting it)
    folder = header.get("output_dir")
    path = label if os.path.isabs(label) or not isinstance(folder, str) \
        else os.path.join(folder, os.path.basename(label))
    try:
        size = os.stat(path).st_size
        if start < size < end:
            os.truncate(path, start)
            size = start
    except OSError:
        return None
    return size >= end


def after_main(pid: int, run_id: str, returncode: int, folder: str | None = None) -> str | None:
    """In the launcher, once the main process `pid` has ended: if it ended without its
    shutdown, its loss counted from what it left; the exit line (None: nothing to say).
    `folder`: the run's output folder as the launcher knows it."""
    path = _path(run_id, pid)
    if not os.path.exists(path):  # the main process may be a grandchild (a shell between)
        found = tallyfile.run_files(run_id, ".ledger")  # (one per run)
        path = found[0] if len(found) == 1 else path
    read = _read(path)
    if read is None:
        tallyfile.remove_run(run_id)  # (a tally without a ledger: nothing to say with it)
        if returncode < 0 and folder is not None and _unfinished(folder, run_id, pid):
            return (f"the main process (pid {pid}) was killed by {_signal_name(-returncode)}: "
                    "at least 0 span(s) were not exported [a lower bound: it could make no "
                    "tally or ledger file (no writable /dev/shm or temp dir), so what it had "
                    "not exported is not counted]")
        return None
    slots, header, received = read
    if header.get("pid") != pid:  # not the launcher's child: how it ended is unknown here
        pid, returncode = int(header.get("pid") or 0), 0
    tally = header.get("tally")
    made = tallyfile.count(tally) if isinstance(tally, str) else None
    if made is not None:
        made = max(0, made - int(header.get("made_before") or 0))
    summary = count(slots, header, made)
    if _with_it(summary, slots, received, run_id, tally):
        # Workers still alive become orphans: each reads what it received from them
        # (`received_from`) and the last to end removes the file (`orphan_ended`). Their
        # tally files stay until they read it (each removes its own then): while one is
        # there, the mirror stays.
        for tally_path in tallyfile.run_files(run_id, ".tally"):
            owner = tallyfile.pid_of(tally_path, run_id)
            if owner is None or not alive(owner):
                tallyfile.remove(tally_path)
    else:
        tallyfile.remove(path)
        tallyfile.remove_run(run_id)
    how = (f"was killed by {_signal_name(-returncode)}" if returncode < 0
           else "ended without its shutdown")
    worst = max((sum(s["lost"].values()) for s in summary["sinks"].values()), default=0)
    parts = []
    for name, s in summary["sinks"].items():
        n = sum(s["lost"].values())
        unsure = s.get("unconfirmed", 0)
        where = f"{name} {s['sink']}" if s["sink"] != name else name
        reasons = ", ".join(f"{r} {k}" for r, k in s["lost"].items())
        text = (f"{where}: {n} of {s['recorded']} lost ({reasons})" if n
                else f"{where}: {s['delivered']} of {s['recorded']} delivered")
        parts.append(text + (f", {unsure} unconfirmed (being sent when it died)"
                             if unsure else ""))
    if made is None:
        exactness = "at least (no tally file: its open and unflushed blocks are not counted)"
    elif slots[_ELSEWHERE]:
        exactness = ("at least (Ray workers' blocks since their last report to it are not "
                     "counted)")
    elif header.get("spans") == "off":
        exactness = "at most (spans=off: records it left out count as held)"
    else:
        exactness = "exact"
        if slots[4]:
            exactness += f"; {slots[4]} left out by spans={header.get('spans')}, not lost"
    note = (f"the main process (pid {pid}) {how}: {worst} span(s) were not exported "
            f"[{exactness}]: " + "; ".join(parts or ["no sink"])
            + "".join(f" [{more}]" for more in summary["notes"]))
    summary["notes"].insert(0, note)
    folder = header.get("output_dir")
    if isinstance(folder, str):
        _into_timers(folder, note, summary, worst)
    return note


def received_from(run_id: str, parent: int, pid: int) -> int | None:
    """In an orphaned worker: how many of its records its dead parent (the run's main
    process, under ``otel-rl run``) had received, from the parent's mirror (None: unknown)."""
    read = _read(_path(run_id, parent))
    if read is None:
        return None
    slots, _header, received = read
    if pid in received:
        return None if received[pid] == _ALL else received[pid]
    # Not in the table (filled in order, complete): nothing it sent had arrived.
    return None if slots[_INCOMPLETE] else 0


def orphan_ended(run_id: str, parent: int) -> None:
    """An orphaned worker ends: the parent's mirror goes once no worker of the run is left
    (their tally files are gone by then, or belong to dead processes)."""
    for path in tallyfile.run_files(run_id, ".tally"):
        pid = tallyfile.pid_of(path, run_id)
        if pid is not None and pid != os.getpid() and alive(pid):
            return  # a worker that has not read it yet
    for path in tallyfile.run_files(run_id, ".tally"):
        tallyfile.remove(path)  # (workers that died before they read it)
    tallyfile.remove(_path(run_id, parent))


def _with_it(summary: dict[str, Any], slots: list[int], received: dict[int, int],
             run_id: str, own: object) -> int:
    """Workers that died with the main process (a process group killed, a cgroup OOM) left
    their tally files: what each recorded and the main process had not received is lost
    ("killed worker"), for every sink. A worker still alive is left alone: it becomes an
    orphan and exports the rest itself."""
    lost = dead = living = 0
    paths = [path for path in tallyfile.run_files(run_id, ".tally") if path != own]
    _settle([(pid, path) for path in paths if (pid := tallyfile.pid_of(path, run_id))])
    for path in paths:
        pid = tallyfile.pid_of(path, run_id)
        if pid is None or received.get(pid) == _ALL:
            continue  # not a worker's; or counted by the main process already
        if alive(pid):
            living += 1  # it becomes an orphan and says its own losses
            continue
        recorded = tallyfile.count(path)
        if recorded is None or (pid not in received and slots[_INCOMPLETE]):
            continue  # unreadable; or past the mirror's table (received unknown)
        dead += 1
        lost += max(0, recorded - received.get(pid, 0))
    if not dead:
        return living
    summary["upstream"]["killed worker"] = summary["upstream"].get("killed worker", 0) + lost
    for sink in summary["sinks"].values():
        sink["lost"]["killed worker"] = sink["lost"].get("killed worker", 0) + lost
        sink["recorded"] += lost
    summary["notes"].append(f"{dead} worker(s) died with it: {lost} of their block(s) had not "
                            "reached it (counted from their tally files)")
    return living


def _elsewhere(summary: dict[str, Any], slots: list[int]) -> None:
    """Ray workers deliver only to the driver, through a mailbox only it reads (Ray ends the
    job's workers with it): what they had reported recorded and not delivered is lost
    ("killed worker"), for every sink."""
    lost = max(0, slots[_ELSEWHERE] - 1)
    if not lost:
        return
    summary["upstream"]["killed worker"] = summary["upstream"].get("killed worker", 0) + lost
    for sink in summary["sinks"].values():
        sink["lost"]["killed worker"] = sink["lost"].get("killed worker", 0) + lost
        sink["recorded"] += lost
    summary["notes"].append(f"Ray workers had reported {lost} block(s) it had not received")


def _settle(workers: list[tuple[int, str]], limit_s: float = 5.0) -> None:
    """Until every worker that still has its tally file (`(pid, path)`) has either ended or
    removed the file, at most `limit_s`. A process group's SIGKILL (or a cgroup's OOM kill)
    reaches its members one by one: one not yet gone would pass for an orphan that counts
    itself, and be counted by nobody. A live orphan removes its tally file once it has read
    the mirror, at its next flush (every 2 s by default): one killed before that is counted
    here too."""
    limit = time.monotonic() + limit_s
    waiting = [(pid, path) for pid, path in workers if alive(pid)]
    while waiting and time.monotonic() < limit:
        time.sleep(0.02)
        waiting = [(pid, path) for pid, path in waiting
                   if os.path.exists(path) and alive(pid)]


def alive(pid: int) -> bool:
    """Process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # a zombie is dead
    except (OSError, IndexError):
        return True


def _unfinished(folder: str, run_id: str, pid: int) -> bool:
    """The run in `folder` is this main process's (its mark), and its timers.json is missing
    or a checkpoint's (never the final one)."""
    for where in (folder, os.path.join(folder, run_id), os.path.join(folder, f"{run_id}-{pid}")):
        try:
            with open(os.path.join(where, RUN_MARK), encoding="utf-8") as f:
                if f.read().strip() != f"{run_id} {pid}":
                    continue
        except OSError:
            continue
        try:
            with open(os.path.join(where, "timers.json"), encoding="utf-8") as f:
                return "never finished" in f.read()
        except OSError:
            return True
    return False


def _signal_name(signum: int) -> str:
    try:
        return f"{signal.Signals(signum).name} (signal {signum})"
    except ValueError:
        return f"signal {signum}"


def _into_timers(folder: str, note: str, summary: dict[str, Any], worst: int) -> None:
    """The run's timers.json (its last checkpoint) says it: the ledger, the count, partial."""
    from otel_rl._internal import atomic, jsonout, wholerun
    from otel_rl._internal.strictjson import parse_json

    path = os.path.join(folder, "timers.json")
    try:
        with open(path, encoding="utf-8") as f:
            tree = parse_json(f.read(), path)
    except FileNotFoundError:  # killed before its first checkpoint
        tree = wholerun.build(local=[], snapshots=[], root_total=0.0, gauges={},
                              metadata={}, places=[], main=None).to_dict()
        note += " (no timers.json had been written: this one holds no blocks)"
    except Exception:
        return  # unreadable: the readers say so themselves
    if not isinstance(tree, dict):
        return
    metadata = tree.setdefault("metadata", {})
    if isinstance(metadata, dict):
        metadata[LEDGER_KEY] = json.dumps(summary, separators=(",", ":"), sort_keys=True)
        metadata[DROPPED_KEY] = str(worst)
    tree["complete"] = False
    tree["notes"] = [note, *(n for n in tree.get("notes") or () if n != note)]
    try:
        atomic.write_text(path, jsonout.dumps(tree, indent=2, allow_nan=True))
    except Exception:
        pass
