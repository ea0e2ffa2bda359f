"""otel_rl's background threads: they never take the process's termination signals, and none
of them is alive at the moment the program forks.

**Signals.** A process-directed signal (``Pool.terminate()``'s SIGTERM, Ctrl-C's SIGINT) goes to
any thread that does not block it. Python runs handlers in the main thread only, so when the
kernel picks a background thread while the main thread sits in a blocking C call (a pool worker
waiting on its task queue's lock), the handler never runs and the process never exits. Blocking
those signals in every thread otel_rl starts leaves the main thread the only one that can take
them.

**Fork.** A program that is single-threaded until `otel_rl.configure()` must stay safe to fork
(Sample Factory's and ML-Agents' workers, a fork `multiprocessing.Pool`): a thread alive at
``fork()`` may hold a lock the child inherits locked, and Python 3.12+ warns about it
(``DeprecationWarning: This process ... is multi-threaded``). So every thread started here is a
`Daemon` that can be stopped and started again: the runtime's fork hook calls `stop_all` before
the fork (each daemon is asked to stop and joined, bounded by `FORK_WAIT_S`) and
`resume_after_fork` after it in the parent; in the child, `forget_all` drops the parent's
daemons (a child that joins the run starts its own).

Where the parent starts them again matters. Python 3.12 counts the threads before the
``after_in_parent`` fork hooks run, Python 3.13 after them (``warn_about_fork_with_threads``
moved behind ``PyOS_AfterFork_Parent``), so a thread started again from the hook is counted
there. On 3.13+ `wrap_os_fork` therefore wraps ``os.fork`` (what `multiprocessing`, Sample
Factory and ML-Agents call): inside it the hook leaves the restart to the wrapper, which does it
once ``fork()`` has returned, and re-emits the warnings raised meanwhile at its caller's line
(a program with threads of its own is still warned, where it forks, and its filters by module
still match). A fork that bypasses it (``os.forkpty``, a ``fork`` bound before the run
started) gets its threads back from the hook itself.

The contract for a daemon's `target` (every otel_rl thread): return promptly once `stopping()`
is true, and be callable again to carry on where it stopped (keep state outside the call). Wait
on an event with a timeout, or with `sleep`, never in a call nobody can wake; give `start_daemon`
a `wake` callable that interrupts the wait (sets the event, writes to the socket). A target that
returns while not asked to stop has ended for good and is not restarted.

**Priority.** On Linux, where a thread has a niceness of its own, the daemons run
`set_niceness`'s steps nicer than the thread that configured otel_rl (the ``thread_nice``
setting), so that where the cores are short the training's threads are scheduled first and
otel_rl's work fills the gaps; on an idle core it changes nothing. A daemon started with
``yields=False`` (the SIGTERM watcher, which has a grace period to meet) keeps the program's.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable

__all__ = ["FORK_WAIT_S", "TERMINATION_SIGNALS", "Daemon", "forget_all", "live",
           "pause_for_fork", "restart", "resume_after_fork", "set_niceness", "sleep",
           "start_daemon", "stop_all", "stopping", "wrap_os_fork"]

#: Signals otel_rl's threads leave to the main thread.
TERMINATION_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

#: How long a fork waits, at most, for otel_rl's threads to stop. An idle thread stops in well
#: under a millisecond; one in the middle of an export finishes that request first (bounded by
#: the export timeout), so past this the fork goes ahead with it alive (`stop_all` says which),
#: and later forks do not wait for it again while it is still busy (a pool of 8 workers started
#: while the collector hangs waits once, not 8 times). It carries on after its export.
FORK_WAIT_S = 1.0


class Daemon:
    """One of otel_rl's background threads, by name and target; survives being stopped for a
    fork and started again (`join` and `is_alive` speak of its current thread)."""

    __slots__ = ("carry_on", "ended", "exited", "lingering", "name", "stop", "target",
                 "thread", "wake", "yields")

    def __init__(self, name: str, target: Callable[[], None],
                 wake: Callable[[], None] | None, yields: bool = True) -> None:
        self.name = name
        self.target = target
        self.wake = wake
        #: Runs at `set_niceness`'s priority (see the module docstring).
        self.yields = yields
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        #: The target returned without being asked to: it is done, never restarted.
        self.ended = False
        #: The current thread's target has returned (set under `_lock`).
        self.exited = False
        #: A fork went ahead while this thread was still busy: later forks do not wait for it.
        self.lingering = False
        #: Set after such a fork: once the target returns (it was asked to stop), it starts
        #: again by itself.
        self.carry_on = False

    def is_alive(self) -> bool:
        thread = self.thread
        return thread is not None and thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def ident(self) -> int | None:
        thread = self.thread
        return None if thread is None else thread.ident

    def _run(self, stop: threading.Event) -> None:
        _local.daemon = self
        _local.stop = stop
        niceness = _Priority.niceness
        if self.yields and niceness is not None:
            _lower_priority(niceness)
        again = False
        try:
            self.target()
        finally:
            with _lock:
                if self.stop is stop:  # (always: a new thread starts only once this one ended)
                    self.exited = True
                    again = stop.is_set() and self.carry_on
                    if not stop.is_set():
                        self.ended = True
                        if self in _daemons:
                            _daemons.remove(self)
        if again:
            self._start()

    def _start(self) -> None:
        """A new thread for this daemon, born with the termination signals blocked.

        The signals are blocked in the starting thread around the start, so the new thread is
        born with them blocked (a thread inherits its creator's mask). Blocking them from inside
        the new thread came too late: a SIGTERM sent while the thread was being created (the
        creator blocks every signal in there) stayed pending, and the new thread, unblocking
        first, took it; its handler then waited for a main thread asleep on a queue lock
        (`Pool.terminate()` hung joining such a worker, about one run in twenty under load).
        """
        with _lock:
            self.stop = stop = threading.Event()
            self.exited = self.lingering = self.carry_on = False
        try:
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION_SIGNALS)
        except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
            previous = None
        try:
            thread = threading.Thread(target=self._run, args=(stop,), name=self.name,
                                      daemon=True)
            self.thread = thread
            thread.start()
        finally:
            if previous is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_lock = threading.Lock()
#: Daemons started and not ended (stopped ones included until restarted or forgotten).
_daemons: list[Daemon] = []
_local = threading.local()


class _Priority:
    """The niceness a yielding daemon runs at (`set_niceness`); None: the one it starts with."""

    niceness: int | None = None


#: A thread's own niceness is Linux's (elsewhere ``setpriority`` takes a process id).
_PER_THREAD = sys.platform.startswith("linux") and hasattr(os, "setpriority")


def set_niceness(steps: int) -> None:
    """Run the yielding daemons `steps` nicer than the calling thread (at most 19); 0: at the
    priority they start with. Daemons alive now follow at once, new ones as they start. A
    thread cannot be made less nice again without privileges: a later, smaller value holds
    for threads started after it."""
    _Priority.niceness = None
    if not _PER_THREAD or steps <= 0:
        return
    try:
        niceness = min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + steps)
    except OSError:
        return
    _Priority.niceness = niceness
    for daemon in live():
        native = getattr(daemon.thread, "native_id", None)
        if daemon.yields and native is not None:
            _lower_priority(niceness, native)


def _lower_priority(niceness: int, tid: int | None = None) -> None:
    """Make thread `tid` (default: the calling one) at least `niceness` nice; never raises."""
    try:
        tid = threading.get_native_id() if tid is None else tid
        if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
    except OSError:  # gone, or not allowed: it runs as it is
        pass


def start_daemon(name: str, target: Callable[[], None], *,
                 wake: Callable[[], None] | None = None, yields: bool = True) -> Daemon:
    """Start `target` in a daemon thread named `name`, with termination signals blocked, and
    stop it around every fork (see the module docstring for what `target` must do; `wake`
    interrupts whatever it waits on; `yields`: at `set_niceness`'s priority)."""
    daemon = Daemon(name, target, wake, yields)
    with _lock:
        _daemons.append(daemon)
    daemon._start()
    return daemon


def stopping() -> bool:
    """In a daemon's thread: whether it has been asked to stop (False in any other thread)."""
    stop: threading.Event | None = getattr(_local, "stop", None)
    return stop is not None and stop.is_set()


def sleep(seconds: float) -> bool:
    """`time.sleep` that a daemon's stop interrupts; True if it was asked to stop."""
    stop: threading.Event | None = getattr(_local, "stop", None)
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


def live() -> list[Daemon]:
    """The daemons whose thread is alive now."""
    with _lock:
        return [d for d in _daemons if d.is_alive()]


def stop_all(timeout: float = FORK_WAIT_S) -> tuple[list[Daemon], list[Daemon]]:
    """Ask every live daemon (but the calling thread's) to stop and wait for its thread to be
    gone, at most `timeout` seconds in all: ``(stopped, still alive)``. The stopped ones go on
    with `restart`."""
    me = threading.current_thread()
    with _lock:
        running = [d for d in _daemons if d.is_alive() and d.thread is not me]
        for daemon in running:
            daemon.carry_on = False
    if not running:
        return [], []
    tasks = _task_count()
    for daemon in running:
        daemon.stop.set()
        if daemon.wake is not None:
            try:
                daemon.wake()
            except Exception:
                pass
    deadline = time.monotonic() + timeout
    for daemon in running:
        if not daemon.lingering:
            daemon.join(max(0.0, deadline - time.monotonic()))
    stopped = [d for d in running if not d.is_alive()]
    if tasks is not None and stopped:
        # `join` returns once the thread's Python state is gone; its OS thread ends a moment
        # later, and Python 3.12 counts OS threads (/proc/self/task) when it decides to warn.
        while (_task_count() or 0) > tasks - len(stopped) and time.monotonic() < deadline:
            time.sleep(0.0002)
    alive = [d for d in running if d.is_alive()]
    for daemon in alive:
        daemon.lingering = True
    return stopped, alive


def restart(daemons: list[Daemon]) -> None:
    """Start again the daemons `stop_all` stopped (in the process that stopped them)."""
    for daemon in daemons:
        with _lock:
            wanted = not daemon.ended and daemon in _daemons
        if wanted and not daemon.is_alive():
            daemon._start()


def pause_for_fork(timeout: float = FORK_WAIT_S) -> list[Daemon]:
    """Before a fork: `stop_all`, remembering (per forking thread) what to start again; the
    daemons still alive at the deadline are returned."""
    stopped, alive = stop_all(timeout)
    _local.paused = stopped
    _local.lingering = alive
    return alive


def resume_after_fork() -> None:
    """After a fork, in the parent: start again what `pause_for_fork` stopped, unless the fork
    runs inside the `wrap_os_fork` wrapper, which does it once ``fork()`` has returned."""
    if not getattr(_local, "in_fork", False):
        _resume()


def _resume() -> None:
    paused: list[Daemon] = getattr(_local, "paused", None) or []
    lingering: list[Daemon] = getattr(_local, "lingering", None) or []
    _local.paused = _local.lingering = None
    restart(paused)
    for daemon in lingering:  # still busy at the fork: it starts again once its target returns
        with _lock:
            returned = daemon.exited and not daemon.ended and daemon in _daemons
            daemon.carry_on = not daemon.exited
        if returned:
            daemon._start()


def forget_all() -> None:
    """In a forked child: the daemons are the parent's (their threads did not survive the
    fork); drop them all."""
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _daemons.clear()
    _local.paused = _local.lingering = None


_os_fork: Callable[[], int] | None = None


def wrap_os_fork() -> None:
    """On Python 3.13+, make ``os.fork`` start otel_rl's threads again in the parent after it
    has returned (see the module docstring); once per process, idempotent. (Up to 3.12 the
    threads are counted before the hooks run: the hook restarts them.)"""
    global _os_fork
    if _os_fork is not None or not hasattr(os, "fork") or sys.version_info < (3, 13):
        return
    original = _os_fork = os.fork

    @functools.wraps(original)
    def fork() -> int:
        pid = -1
        _local.in_fork = True
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                pid = original()
        finally:
            _local.in_fork = False
            if pid != 0:  # the parent (also when fork() failed)
                _resume()
        _warn_again(caught, sys._getframe(1))
        return pid

    os.fork = fork


def _warn_again(caught: list[warnings.WarningMessage], caller: types.FrameType) -> None:
    """Warnings raised while the wrapped fork ran, through the program's own filters: the
    fork's own (a program with threads of its own) at the caller's line, as without the
    wrapper, so filters by module and the shown location stay the program's."""
    for w in caught:
        here = w.filename == __file__
        frame_globals = caller.f_globals if here else {}
        warnings.warn_explicit(
            w.message, w.category, caller.f_code.co_filename if here else w.filename,
            caller.f_lineno if here else w.lineno,
            module=frame_globals.get("__name__") if here else None,
            registry=frame_globals.setdefault("__warningregistry__", {}) if here else None,
            source=w.source)


def _task_count() -> int | None:
    """The OS threads of this process, as Python 3.12+ counts them before it warns (Linux:
    /proc/self/stat's 20th field); None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[17])  # field 20; fields[0] is field 3 (the state)
    except (OSError, IndexError, ValueError):
        return None
