"""GPU time for the blocks a user opts in: CUDA event pairs, resolved off the training thread.

A CPU timer puts asynchronous GPU work in whichever block happens to synchronize (Sample
Factory's profiling guide: ``after_optimizer`` looks slow, ``update`` fast). For a block opted
in — ``hierarchical_timer(name, gpu=True)``, ``timing.add_time(key, gpu=True)`` or a name the
``gpu_blocks`` setting matches — `GpuTimer` records one event on the current stream when the
block starts and one when it ends. Nothing waits: a daemon thread polls ``query()`` and only
then reads ``elapsed_time``, adding the seconds to the block's node (``gpu_total`` /
``gpu_count``) and to its span (``otel_rl.gpu.seconds``). The pipeline holds a span back
until its GPU time is known, at most `timeout` seconds after the block ended; past that the
span goes out marked ``otel_rl.gpu.timed_out``.

The device API is ``torch.cuda`` — taken from ``sys.modules`` only, so otel_rl never imports
torch, and used only once the program has initialized CUDA, so otel_rl never creates a CUDA
context either — or a stand-in with the same surface (`use_api`; the tests' device double).
Without a usable device the option is a no-op, said once.

Events come from a pool per device and go back once read; a pair whose end never completes
is given up after `timeout` (its events are not reused: the device may still write them).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypedDict

from otel_rl._internal import log, procstate, recorder, semconv
from otel_rl._internal.record import SPAN_ID, Record, with_attrs
from otel_rl._internal.recorder import TimerNode, hierarchical_timer
from otel_rl._internal.threads import Daemon, sleep, start_daemon, stopping

if TYPE_CHECKING:
    from typing_extensions import Unpack

#: Seconds a block's span waits for its GPU time (and shutdown for pending pairs).
timeout = 10.0
#: Seconds between polls of the pending events while any are pending.
POLL_INTERVAL = 0.002
#: Events kept per device for reuse.
POOL_SIZE = 256
#: Seconds a resolved result waits for its span to be exported before it is forgotten (the
#: span was dropped: an iteration the `auto` policy did not keep, or a full buffer).
RESULT_TTL = 60.0

_patterns: tuple[str, ...] = ()
_api: Any = None  # the device API in use; None: look for torch.cuda when needed
_api_given = False  # set by `use_api`: never fall back to torch
_disabled = False  # a device call failed or CUDA is unavailable: blocks run plain
_initialized = False  # the program has initialized CUDA (checked until it has)
_warned: set[str] = set()

_pools: dict[int, list[Any]] = {}
_queue: deque[Pending] = deque()  # ended pairs, handed to the resolver thread
_wake = threading.Event()
_idle = True  # the resolver waits on `_wake` (set only then, to keep `end` cheap)
_thread: Daemon | None = None
_lock = threading.Lock()
_active = 0  # pairs the resolver holds (written only by the resolver thread)
_active_pairs: list[Pending] = []  # the resolver's list as of its last pass
#: Span id -> its pair, for spans whose record may still wait for GPU time.
spans: dict[int, Pending] = {}
_held: list[Record] = []  # records held back by `ready` until their GPU time is known
_closing = False
_generation = 0  # bumped by `reset`: the resolver forgets pairs of an earlier generation




class _State(TypedDict, total=False):
    """This module's state that is rebound (the containers above are only mutated): written
    by `_assign` alone, read as module globals."""

    _patterns: tuple[str, ...]
    timeout: float
    _api: Any
    _api_given: bool
    _disabled: bool
    _initialized: bool
    _wake: threading.Event
    _idle: bool
    _thread: Daemon | None
    _lock: threading.Lock
    _active: int
    _active_pairs: list[Pending]
    _held: list[Record]
    _closing: bool
    _generation: int


def _assign(**values: Unpack[_State]) -> None:
    globals().update(values)


PENDING, RESOLVED, GIVEN_UP = 0, 1, 2  # `Pending.state`


class Pending:
    """One block's event pair on its way from the device to the node and span."""

    __slots__ = ("device", "end", "node", "seconds", "sid", "start", "state", "stream", "t_end")

    def __init__(self, start: Any, stream: Any, device: int, node: TimerNode, sid: int) -> None:
        self.start = start
        self.stream = stream
        self.device = device
        self.node = node
        self.sid = sid
        self.end: Any = None
        self.t_end = 0.0
        self.seconds: float | None = None
        self.state = PENDING


# --- settings ----------------------------------------------------------------------------------

def configure(blocks: Iterable[str], wait: float) -> None:
    """Opt in the blocks whose names match `blocks` (exact names or fnmatch patterns)."""
    _assign(_patterns=tuple(blocks), timeout=wait, _closing=False)
    recorder.use_gpu_blocks(bool(_patterns))


def wanted(name: str) -> bool:
    """Whether the `gpu_blocks` setting opts `name` in (cached per name)."""
    if not _patterns or _closing:
        return False
    cache = recorder.gpu_wanted
    hit = cache.get(name)
    if hit is None:
        import fnmatch

        hit = cache[name] = any(name == p or fnmatch.fnmatchcase(name, p) for p in _patterns)
    return hit


def use_api(api: Any) -> None:
    """Use `api` (``torch.cuda``'s surface: ``is_available``, ``is_initialized``,
    ``current_stream``, ``Event``) instead of looking for torch; None: look again."""
    reset()
    _assign(_initialized=False, _api=api, _api_given=api is not None, _disabled=False)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("otel_rl: %s", message)


def _find_api(name: str) -> Any:
    """torch.cuda if the program imported torch and initialized CUDA; else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        _warn_once("no-torch", f"GPU time asked for block {name!r}, but torch is not imported; "
                               "GPU-timed blocks are timed on the CPU only")
        return None
    cuda = getattr(torch, "cuda", None)
    try:
        available = cuda is not None and bool(cuda.is_available())
    except Exception:
        available = False
    if not available:
        _assign(_disabled=True)
        _warn_once("no-cuda", "GPU time asked for, but CUDA is not available; GPU-timed "
                              "blocks are timed on the CPU only")
        return None
    _assign(_api=cuda)
    return cuda


def _fail(exc: BaseException) -> None:
    _assign(_disabled=True)
    _warn_once("gpu-failed", f"GPU timing failed ({type(exc).__name__}: {exc}); GPU-timed "
                             "blocks are timed on the CPU only from now on")


# --- the hot path of an opted-in block ---------------------------------------------------------

def begin(node: TimerNode, sid: int, name: str) -> Pending | None:
    """Record the start event on the current stream; None when there is nothing to time."""
    if _disabled:
        return None
    api = _api
    if api is None:
        if _api_given:
            return None
        api = _find_api(name)
        if api is None:
            return None
    try:
        if not _initialized and not _check_initialized(api):
            return None  # the program has not used CUDA yet: nothing to time, no context made
        if _capturing(api):
            return None  # an event recorded into a CUDA graph capture would break the capture
        stream = api.current_stream()
        device = getattr(stream, "device_index", None)
        if device is None:  # torch versions name it differently; all have `device`
            device = stream.device.index or 0
        start = _event(api, device)
        start.record(stream)
    except Exception as exc:
        _fail(exc)
        return None
    pending = Pending(start, stream, device, node, sid)
    if recorder.on_retire is None:  # from the first pair on: a reset retargets pending ones
        recorder.set_retire_hook(_retarget)
    if sid:
        spans[sid] = pending
    return pending


def _check_initialized(api: Any) -> bool:
    initialized = bool(api.is_initialized())  # once True, it stays so in this process
    _assign(_initialized=initialized)
    return initialized


def _capturing(api: Any) -> bool:
    capturing = getattr(api, "is_current_stream_capturing", None)
    return capturing is not None and bool(capturing())


def _event(api: Any, device: int) -> Any:
    """An event from the device's pool, or a new one."""
    pool = _pools.get(device)
    if pool:
        try:
            return pool.pop()
        except IndexError:  # another thread took the last one
            pass
    return api.Event(enable_timing=True)


def end(pending: Pending) -> None:
    """Record the end event on the block's stream and hand the pair to the resolver."""
    try:
        if _capturing(_api):  # a graph capture began inside the block: leave it alone
            _drop(pending)
            return
        stop = _event(_api, pending.device)
        stop.record(pending.stream)
    except Exception as exc:
        _fail(exc)
        _drop(pending)
        return
    pending.end = stop
    pending.t_end = time.monotonic()
    _queue.append(pending)  # no lock: deque.append is atomic
    if _idle:
        _ensure_thread()
        _wake.set()


def _drop(pending: Pending) -> None:
    """A pair that will not be measured: its span goes out as a plain one."""
    pending.state = GIVEN_UP
    spans.pop(pending.sid, None)


class GpuTimer(hierarchical_timer):
    """A `hierarchical_timer` that also times its block on the GPU (see the module docs).

    Both events are recorded inside the block's wall-clock interval, so its CPU time includes
    their cost (measured in benchmarks/bench_gpu.py).
    """

    __slots__ = ()

    def __enter__(self) -> TimerNode:
        node = hierarchical_timer.__enter__(self)
        try:
            self._gpu = begin(node, self._sid if self._tr is not None else 0, self._name)
        except Exception as exc:  # telemetry never reaches training code
            _fail(exc)
            self._gpu = None
        return node

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pending = self._gpu
        if pending is not None:
            self._gpu = None
            try:
                end(pending)
            except Exception as error:
                _fail(error)
        hierarchical_timer.__exit__(self, exc_type, exc, tb)


def opt_in(timer: hierarchical_timer, name: str, gpu: bool | None) -> None:
    """Called by `hierarchical_timer.__init__` when `gpu` is given or `gpu_blocks` is set."""
    if gpu is not None:
        recorder.keep_gpu_choice(timer, gpu)
    if gpu if gpu is not None else wanted(name):
        timer.__class__ = GpuTimer


# --- the resolver thread -----------------------------------------------------------------------

def _ensure_thread() -> None:
    if _thread is not None:
        return
    with _lock:
        if _thread is None:
            # Born with SIGTERM/SIGINT blocked, like otel_rl's other threads (`threads`).
            _assign(_thread=start_daemon("otel_rl-gpu", _loop, wake=_wake_resolver))


def _wake_resolver() -> None:
    _wake.set()


def _loop() -> None:
    active: list[Pending] = []
    last_prune = time.monotonic()
    generation = _generation
    while True:
        if stopping():  # a fork: the pairs wait in the queue for the restarted resolver
            _queue.extendleft(reversed(active))
            _assign(_active=0, _active_pairs=[], _idle=True)
            return
        if generation != _generation:
            active, generation = [], _generation
        moving = len(_queue)
        # Counted as held before they leave the queue: `outstanding` may count a pair twice
        # for a moment, never zero times.
        _assign(_active=len(active) + moving)
        for _ in range(moving):
            active.append(_queue.popleft())
        if not active:
            _assign(_idle=True)
            if not _queue:
                _wake.wait(1.0)
            _wake.clear()
            _assign(_idle=False)
            continue
        active = resolve(active, time.monotonic())
        _assign(_active=len(active), _active_pairs=active)
        now = time.monotonic()
        if now - last_prune > 1.0:
            last_prune = now
            _prune(now)
        sleep(POLL_INTERVAL)


def resolve(active: list[Pending], now: float) -> list[Pending]:
    """One pass over the pending pairs: read the completed ones, give up the expired ones;
    returns those still pending."""
    still = []
    for pending in active:
        try:
            complete = pending.end.query()
            seconds = pending.start.elapsed_time(pending.end) / 1000.0 if complete else None
        except Exception as exc:  # a device error: this pair is lost, the run goes on
            _warn_once("gpu-query", f"reading GPU events failed ({type(exc).__name__}: {exc})")
            complete, seconds = False, None
            pending.t_end = -timeout  # give it up below
        if seconds is not None:
            node = pending.node
            node.gpu_total += seconds
            node.gpu_count += 1
            pending.seconds = seconds
            pending.state = RESOLVED
            pool = _pools.setdefault(pending.device, [])
            if len(pool) < POOL_SIZE:
                pool.append(pending.start)
                pool.append(pending.end)
            pending.start = pending.end = pending.stream = None
            pending.t_end = now  # from now on: how long the result waits for its span
        elif now - pending.t_end >= timeout:
            pending.state = GIVEN_UP
            pending.start = pending.end = pending.stream = None
            pending.t_end = now
        else:
            still.append(pending)
    return still


def _prune(now: float) -> None:
    for sid, pending in list(spans.items()):
        if pending.state != PENDING and now - pending.t_end > RESULT_TTL:
            spans.pop(sid, None)


def _retarget(stack: Any, old_root: TimerNode) -> None:
    """`reset_timers()` retired `old_root` into `stack.retired`: GPU time still pending for its
    nodes goes to the retired copies, which the whole-run tree keeps."""
    pairs = [p for p in (*_queue, *_active_pairs) if p.state == PENDING]
    if not pairs:
        return
    paths: dict[int, tuple[str, ...]] = {}
    todo: list[tuple[TimerNode, tuple[str, ...]]] = [(old_root, ())]
    while todo:
        node, path = todo.pop()
        for name, child in list(node.children.items()):
            paths[id(child)] = (*path, name)
            todo.append((child, (*path, name)))
    for pending in pairs:
        where = paths.get(id(pending.node))
        fork_path = stack.fork_path  # a forked child's retired tree is lifted (`recorder.lift`)
        if where is not None and fork_path and where[:len(fork_path)] == fork_path:
            where = where[len(fork_path):]
        if where is not None:
            target = stack.retired
            for name in where:
                target = target.get_child(name)
            pending.node = target



# --- spans: held back until their GPU time is known ---------------------------------------------

def ready(records: list[Record]) -> list[Record]:
    """`records` that may be exported now, with their GPU attributes; the pipeline calls this
    on every drain. Records of GPU-timed blocks still pending are kept for a later call."""
    if not spans and not _held:
        return records
    pending_records = _held + records if _held else records
    kept: list[Record] = []
    _assign(_held=kept)
    out: list[Record] = []
    now = time.monotonic()
    for record in pending_records:
        pending = spans.get(record[SPAN_ID])
        if pending is None:
            out.append(record)
            continue
        if pending.state == PENDING and not _closing and (
                not pending.t_end or now - pending.t_end < timeout):
            kept.append(record)
            continue
        spans.pop(record[SPAN_ID], None)
        attrs: dict[str, Any]
        if pending.state == RESOLVED:
            attrs = {semconv.GPU_SECONDS: pending.seconds, semconv.GPU_DEVICE: pending.device}
        else:
            attrs = {semconv.GPU_TIMED_OUT: True, semconv.GPU_DEVICE: pending.device}
        out.append(with_attrs(record, attrs))
    if _closing:
        spans.clear()  # the last drain: what is left belongs to spans that were not kept
    return out


def held() -> int:
    """How many span records wait for their GPU time."""
    return len(_held)


def outstanding() -> int:
    """How many ended pairs are not yet resolved or given up (0 only once their GPU time is
    on their nodes)."""
    return len(_queue) + _active


def finish(deadline: float) -> None:
    """At shutdown: wait (until `deadline`, at most `timeout`) for pending pairs, then let
    every held span go, marking those still without GPU time as timed out."""
    limit = min(deadline, time.monotonic() + timeout)
    while outstanding() > 0 and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)
    _assign(_closing=True)
    for pending in spans.values():
        if pending.state == PENDING:
            pending.state = GIVEN_UP
    recorder.use_gpu_blocks(False)


def reset() -> None:
    """Forget every pool, pending pair and held span (after a fork; tests)."""
    _assign(_generation=_generation + 1, _held=[], _active=0, _closing=False, _disabled=False)
    _pools.clear()
    _queue.clear()
    spans.clear()


def _after_fork_in_child() -> None:
    # Events, streams and the resolver thread belong to the parent; CUDA in a forked child
    # is the program's choice (it usually cannot), and is looked up afresh.
    _assign(_lock=threading.Lock(), _wake=threading.Event(), _thread=None, _idle=True,
            _initialized=False)  # CUDA does not survive a fork
    if not _api_given:
        _assign(_api=None)
    reset()


procstate.register("gpu", after_in_child=_after_fork_in_child, for_tests=reset)
