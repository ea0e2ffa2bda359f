"""Ray support pieces that need no Ray (the real thing runs in tests/frameworks/test_ray.py)."""

from __future__ import annotations

import ast
import contextlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal.ray_support import _shim, calls
from otel_rl._internal.ray_support.sink import RaySink
from otel_rl._internal.sinks.base import Stats

SHIM = Path(_shim.__file__)


def test_the_shim_imports_nothing_of_otel_rl_so_ray_can_ship_it_by_value() -> None:
    tree = ast.parse(SHIM.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {name for name in imported if name.split(".")[0] == "otel_rl"}
    assert imported <= {"__future__", "typing", "importlib", "ray._private.function_manager",
                        "ray._private.runtime_env.setup_hook", "ray._private.worker", "sys",
                        "ray._private.ray_constants", "ray._raylet"}


def test_the_shim_and_the_execute_side_agree_on_the_argument() -> None:
    assert _shim.KEY == calls.KEY
    assert _shim.MARK == calls.MARK


def test_a_call_carrier_parses_back_and_rejects_anything_else() -> None:
    value = calls._SEP.join(["1", f"{2**127 + 5:x}", f"{2**63 + 1:x}", "1f", "7f00", "1",
                             "iteration", "sample"]).encode()
    assert calls.parse(value) == (2**127 + 5, 2**63 + 1, 0x1F, 0x7F00, True,
                                  ("iteration", "sample"))
    for bad in (b"", b"2\x1fa\x1fb\x1f1\x1f1\x1f1", b"1\x1fzz\x1f1\x1f1\x1f1\x1f1",
                b"\xff\xfe", 42, None, "1"):
        assert calls.parse(bad) is None


def test_the_carrier_names_the_open_block_even_when_a_timer_object_is_entered_again() -> None:
    from otel_rl.testing import capture_spans
    from otel_rl.timers import hierarchical_timer

    with capture_spans(propagate=True):
        outside = calls.parse(calls.carrier_text())
        again = hierarchical_timer("again")
        seen = []
        for _ in range(2):  # the same timer object, entered twice: two spans
            with again:
                seen.append(calls.parse(calls.carrier_text()))
        with hierarchical_timer("other"):
            with hierarchical_timer("inner"):
                inner = calls.parse(calls.carrier_text())
    assert outside is not None and outside[5] == ()
    first, second = seen
    assert first and second and inner
    assert first[5] == second[5] == ("again",)
    assert first[1] != second[1]
    assert inner[5] == ("other", "inner")


def test_no_carrier_while_otel_rl_does_not_propagate() -> None:
    from otel_rl.testing import capture_spans

    assert calls.carrier_text() is None
    with capture_spans(propagate=False):
        assert calls.carrier_text() is None


def test_ray_client_calls_join_with_their_own_runtime_env_kept() -> None:
    """A Ray Client call's runtime_env: the run's setup-hook variable, merged into the call's
    own (never changing the call's or the run's dicts); none for a call with a hook of its
    own (its worker cannot run ours)."""
    from otel_rl._internal.ray_support import client

    class Stub:
        _options = {"runtime_env": {"env_vars": {"FROM_DECORATOR": "1"}}}

    class Bare:
        _options = None

    late = {"env_vars": {"RAY_HOOK": "ray_runtime_env_func::abc"}}
    alone = client._joining_env({}, Bare(), late)
    assert alone == late and alone is not late and alone["env_vars"] is not late["env_vars"]
    own = {"env_vars": {"PYTHONPATH": "/x"}, "pip": ["a"]}
    merged = client._joining_env({"runtime_env": own}, Bare(), late)
    assert merged == {"env_vars": {"PYTHONPATH": "/x", "RAY_HOOK": "ray_runtime_env_func::abc"},
                      "pip": ["a"]}
    assert own == {"env_vars": {"PYTHONPATH": "/x"}, "pip": ["a"]}  # the program's untouched
    assert client._joining_env({}, Stub(), late) == {
        "env_vars": {"FROM_DECORATOR": "1", "RAY_HOOK": "ray_runtime_env_func::abc"}}
    assert client._joining_env({"runtime_env": {"worker_process_setup_hook": "m.f"}},
                               Bare(), late) is None
    assert client._joining_env({"runtime_env": {"env_vars": {"RAY_HOOK": "theirs"}}},
                               Bare(), late) is None
    assert late == {"env_vars": {"RAY_HOOK": "ray_runtime_env_func::abc"}}


@contextlib.contextmanager
def _submit_over_stand_in(kind: str) -> Iterator[Any]:
    """Ray's submission of `kind` ("task" or "method") replaced by a stand-in that returns the
    task name it is given; yields otel_rl's submit wrapper around it."""

    def stand_in(self: Any, args: Any = None, kwargs: Any = None, *rest: Any,
                 **options: Any) -> Any:
        return options.get("name")

    saved = dict(calls._original)
    calls._original.update({kind: stand_in, "client_mode": lambda: False})
    try:
        yield calls._submit_wrapper(kind)
    finally:
        calls._original.clear()
        calls._original.update(saved)


def test_a_submitted_call_is_named_after_the_block_open_at_each_call() -> None:
    """The submit wrapper (Ray's ``_remote`` replaced by a stand-in that returns the name it
    is given): a call's task name is always the one made for the block open at that call,
    however the per-thread memo of the last call is reused."""
    import threading
    import types

    from otel_rl.testing import capture_spans
    from otel_rl.timers import hierarchical_timer

    class Function:
        def __init__(self, name: str) -> None:
            self._function = types.SimpleNamespace(__name__=name)

    with _submit_over_stand_in("task") as submit:
        f, g = Function("f"), Function("g")

        def carried(name: Any) -> tuple[str, tuple[str, ...], int]:
            plain, _, value = name.partition(calls.MARK)
            parsed = calls.parse(value)
            assert parsed is not None
            return plain, parsed[5], parsed[1]

        with capture_spans(propagate=True):
            with hierarchical_timer("a"):
                first = submit(f, (), {})
                assert submit(f, (), {}) is first  # the memo: the same string
                plain, path, span_a = carried(first)
                assert (plain, path) == ("f", ("a",))
                assert carried(submit(g, (), {}))[:2] == ("g", ("a",))
                assert carried(submit(f, (), {}, name="mine"))[:2] == ("mine", ("a",))
                assert carried(submit(f, (), {}))[:2] == ("f", ("a",))
                with hierarchical_timer("b"):
                    assert carried(submit(f, (), {}))[:2] == ("f", ("a", "b"))
                assert carried(submit(f, (), {})) == (plain, path, span_a)
                with calls.internal():
                    assert submit(f, (), {}) is None  # otel_rl's own calls carry nothing
                again = hierarchical_timer("again")
                spans = []
                for _ in range(2):  # one timer object entered twice: two blocks
                    with again:
                        spans.append(carried(submit(f, (), {}))[2])
                assert spans[0] != spans[1] and span_a not in spans
                other: list[Any] = []
                thread = threading.Thread(target=lambda: other.append(submit(f, (), {})))
                thread.start()
                thread.join()
                # A thread started in the block hangs under it, as its own thread.
                assert carried(other[0]) == carried(first) and other[0] != first
                assert calls.parse(other[0].partition(calls.MARK)[2])[3] == thread.ident
            assert carried(submit(f, (), {}))[1] == ()
        assert submit(f, (), {}) is None  # otel_rl shut down


def test_an_actor_method_call_leaves_the_actor_to_its_handles() -> None:
    """Ray ends an actor when the program's last handle to it goes; ``handle.method`` holds
    the handle, so the submit wrapper must not keep the method it was called on."""
    import gc
    import weakref

    from otel_rl.testing import capture_spans
    from otel_rl.timers import hierarchical_timer

    class Handle:  # what the wrapper reads of an actor handle
        _ray_actor_creation_function_descriptor = type("D", (), {"class_name": "m.Actor"})()

    class Method:  # an ActorMethod: a new one at each ``handle.method``
        def __init__(self, actor: Handle) -> None:
            self._actor = actor
            self._method_name = "step"

    with _submit_over_stand_in("method") as submit:
        with capture_spans(propagate=True), hierarchical_timer("a"):
            handle = Handle()
            name = submit(Method(handle), (), {})
            assert name.partition(calls.MARK)[0] == "Actor.step"
            gone = weakref.ref(handle)
            del handle
            gc.collect()
            assert gone() is None


class _Mailbox:
    """What a worker's pushes reach: each push's meta, in order (a stand-in for the GCS
    mailbox, `mailbox.Mailbox`)."""

    def __init__(self) -> None:
        self.metas: list[dict[str, Any]] = []
        self.numbers: list[int] = []

    def __call__(self, name: str) -> _Mailbox:  # the sink's `Mailbox(name)`
        return self

    def put(self, worker: str, n: int, meta: dict[str, Any], frames: list[bytes],
            timeout: float) -> None:
        self.metas.append(dict(meta, frames=len(frames)))
        self.numbers.append(n)

    drains = 0  # the driver's takes that found something (`mailbox.Mailbox.state`)

    def state(self, timeout: float) -> dict[str, Any]:
        return {"final": False, "drains": self.drains}  # no last delivery asked for


@pytest.fixture
def pushes(monkeypatch: pytest.MonkeyPatch) -> tuple[RaySink, _Mailbox, list[int]]:
    """A worker's RaySink over a stand-in of the few Ray calls it makes; [running, started]."""
    from otel_rl._internal.ray_support import sink as sink_module

    mailbox = _Mailbox()
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(
        is_initialized=lambda: True,
        get_runtime_context=lambda: types.SimpleNamespace(get_node_id=lambda: "ab" * 14)))
    monkeypatch.setattr(sink_module, "Mailbox", mailbox)
    sink = RaySink("ray:/run-mailbox", Stats())
    calls_now = [0, 0]
    sink.running = lambda: calls_now[0]
    sink.started = lambda: calls_now[1]
    return sink, mailbox, calls_now


def _flush(sink: RaySink, recorded: int) -> None:
    sink.send_snapshot({"pid": 1, "recorded": recorded})  # type: ignore[typeddict-item]
    sink.after_flush()


def test_a_push_says_busy_when_its_snapshot_caught_a_call_that_ended_since(
        pushes: tuple[RaySink, _Mailbox, list[int]]) -> None:
    """A call running as the snapshot is taken and ending before the push: the snapshot
    lacks its last blocks, so the push must say busy (the driver waits for the next one).
    Said idle, a driver ending the run then would never wait for those blocks."""
    sink, mailbox, calls_now = pushes
    calls_now[:] = [1, 1]  # a call started and runs...
    sink.send_snapshot({"pid": 1, "recorded": 5})  # type: ignore[typeddict-item]
    calls_now[0] = 0  # ...and ends before the push
    sink.after_flush()
    assert mailbox.metas[-1]["busy"] is True
    _flush(sink, 6)  # the next flush: nothing ran since, the push says idle
    assert mailbox.metas[-1]["busy"] is False
    assert len(mailbox.metas) == 2


def test_a_last_delivery_is_said_once_then_only_new_work_is_pushed(
        pushes: tuple[RaySink, _Mailbox, list[int]]) -> None:
    """After a final push (a process Ray is ending), flushes push nothing more unless calls
    ran: no Ray call while Ray tears the process down."""
    sink, mailbox, calls_now = pushes
    calls_now[:] = [0, 1]
    _flush(sink, 3)
    sink.final = True
    _flush(sink, 3)
    assert [m["final"] for m in mailbox.metas] == [False, True]
    for _ in range(20):  # ticks past the every-8th snapshot too
        _flush(sink, 3)
    assert len(mailbox.metas) == 2
    calls_now[1] = 2  # a call ran after all: it is pushed
    _flush(sink, 4)
    assert len(mailbox.metas) == 3 and mailbox.metas[-1]["final"] is True


def test_a_worker_refuses_its_frames_past_the_cap_until_the_driver_takes(
        pushes: tuple[RaySink, _Mailbox, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that takes nothing must not fill the GCS: past `WORKER_CAP` bytes put since the
    driver's last take, a push carries only its meta, marked refused (the driver counts its
    records lost); once the worker sees the driver's count of takes move, frames go again."""
    from otel_rl._internal.ray_support import sink as sink_module

    sink, mailbox, calls_now = pushes
    calls_now[:] = [0, 1]
    monkeypatch.setattr(sink_module, "WORKER_CAP", 1)  # any frame is past it...
    monkeypatch.setattr(sink_module.relay, "encode_columns", lambda batch: b"x" * 10)
    batch = types.SimpleNamespace(records=[object()])

    def push(recorded: int) -> dict[str, Any]:
        sink.export([batch], 0.0)  # type: ignore[list-item]
        _flush(sink, recorded)
        return mailbox.metas[-1]

    first = push(1)  # ...but a push with nothing waiting before it goes whole
    assert "refused" not in first and first["frames"] == 2 and first["records"] == 1
    second = push(2)
    assert second["refused"] is True and second["frames"] == 0 and second["records"] == 1
    mailbox.drains = 1  # the driver took what waited
    assert push(3)["refused"] is True  # decided before this push's reply showed the take
    fourth = push(4)
    assert "refused" not in fourth and fourth["frames"] == 2
    assert mailbox.numbers == sorted(set(mailbox.numbers))  # each put its own, in order


@contextlib.contextmanager
def _caller_place() -> Iterator[Any]:
    """otel_rl recording into memory, and a caller's place (a `Base`, as a call's carrier
    gives one) that calls run at."""
    from otel_rl._internal import runtime
    from otel_rl._internal.recorder import Base
    from otel_rl.testing import capture_spans

    with capture_spans() as captured:
        rt = runtime.active()
        assert rt is not None
        yield Base(rt.trace, 0xCA11E2, ("caller",), rt.pid, 1), captured


def _at(base: Any) -> bool:
    from otel_rl._internal import recorder

    active = recorder.active_stack()
    return active is not None and active.base is base


def test_a_generator_call_steps_and_closes_on_its_callers_stack() -> None:
    """A generator call's body runs after the call returned, as Ray iterates it: each step,
    and its clean-up when closed early, run at the caller's place; between steps the
    thread's own stack is back; the call counts as running from its first step to its end."""
    from otel_rl._internal import recorder

    seen: list[object] = []

    def body(base: Any) -> Any:
        try:
            for i in range(3):
                seen.append(_at(base))
                yield i
        finally:
            seen.append(("closed", _at(base)))

    with _caller_place() as (base, _):
        own = recorder.active_stack()
        before = calls.running
        gen = calls._generated(body(base), base)
        assert calls.running == before  # not started: not running
        assert next(gen) == 0 and recorder.active_stack() is own
        assert calls.running == before + 1
        assert gen.send(None) == 1 and recorder.active_stack() is own
        gen.close()
        assert seen == [True, True, ("closed", True)] and recorder.active_stack() is own
        assert calls.running == before


def test_an_async_generator_call_steps_on_its_callers_stack_across_awaits() -> None:
    import asyncio

    seen: list[bool] = []

    async def body(base: Any) -> Any:
        for i in range(2):
            seen.append(_at(base))
            await asyncio.sleep(0)  # another task of the loop runs here, on its own stack
            seen.append(_at(base))
            yield i

    async def other(base: Any) -> None:
        for _ in range(4):
            seen.append(_at(base))
            await asyncio.sleep(0)

    async def main(base: Any) -> list[int]:
        items: list[int] = []

        async def consume() -> None:
            async for item in calls._agenerated(body(base), base):
                items.append(item)

        await asyncio.gather(consume(), other(base))
        return items

    with _caller_place() as (base, _):
        before = calls.running
        assert asyncio.run(main(base)) == [0, 1]
        # The body's four looks saw the caller's place; the other task's four never did.
        assert sorted(seen) == [False] * 4 + [True] * 4
        assert calls.running == before


def test_interleaved_async_calls_from_one_block_each_nest_on_their_own() -> None:
    """Calls of an async actor made from one block run interleaved on one event loop; each
    awaits before its first block (so none has a block open when the next starts): their
    blocks all hang under the caller's block, none under another call's (Ray 2.60, before
    each call had a stack of its own: ``handed/handed/...``)."""
    import asyncio

    from tests.test_asyncio_handoff import work  # awaits, then `handed` with `inner` in it

    async def main(base: Any) -> list[int]:
        for _ in range(4):
            calls._started()  # as `wrap_executor` counts a call before it is stepped
        return list(await asyncio.gather(*(calls._stepped(work(i), base) for i in range(4))))

    with _caller_place() as (base, captured):
        before = calls.running
        assert asyncio.run(main(base)) == [0, 1, 2, 3]
        assert calls.running == before
    spans = {s.span_id: s for s in captured.spans}
    outer = {s.span_id for s in spans.values() if s.name == "handed"}
    assert len(outer) == 4
    assert {spans[i].parent_span_id for i in outer} == {f"{0xCA11E2:016x}"}
    inner = [s.parent_span_id for s in spans.values() if s.name == "inner"]
    assert sorted(inner) == sorted(outer)  # each under its own call's block


class _FakeGcs:
    """The few calls of Ray's GCS client the mailbox makes, over a dict; `failing` keys
    cannot be removed (an RPC that times out)."""

    def __init__(self) -> None:
        self.store: dict[bytes, bytes] = {}
        self.failing: set[bytes] = set()

    def internal_kv_put(self, key: bytes, value: bytes, overwrite: bool, namespace: bytes,
                        timeout: int) -> int:
        self.store[namespace + b"\0" + key] = value
        return 1

    def internal_kv_get(self, key: bytes, namespace: bytes, timeout: int) -> bytes | None:
        return self.store.get(namespace + b"\0" + key)

    def internal_kv_keys(self, prefix: bytes, namespace: bytes, timeout: int) -> list[bytes]:
        head = namespace + b"\0"
        keys = [k[len(head):] for k in self.store if k.startswith(head + prefix)]
        return keys[::-1]  # in no particular order

    def internal_kv_multi_get(self, keys: list[bytes], namespace: bytes,
                              timeout: int) -> dict[bytes, bytes]:
        return {k: self.store[namespace + b"\0" + k] for k in keys}

    def internal_kv_del(self, key: bytes, by_prefix: bool, namespace: bytes,
                        timeout: int) -> int:
        if key in self.failing:
            raise TimeoutError("GCS did not answer")
        full = namespace + b"\0" + key
        gone = [k for k in self.store if (k.startswith(full) if by_prefix else k == full)]
        for k in gone:
            del self.store[k]
        return len(gone)


def test_the_mailbox_takes_each_push_once_in_its_workers_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushes come back per worker in the order made (numbers sort past 9, 99...), each once:
    a removal that fails leaves it and what follows for the next take, never read twice; the
    run's end removes every entry, the driver's word included."""
    from otel_rl._internal.ray_support import mailbox

    gcs = _FakeGcs()
    monkeypatch.setattr(mailbox, "_client", lambda: gcs)
    box = mailbox.Mailbox("run-1")
    box.say(1.0, final=False, drains=0)
    for n in range(12):
        for worker in ("node:7", "node:8"):
            box.put(worker, n, {"seq": n}, [b"\x00\x00\x00\x01\x03" + bytes([n])], 1.0)
    gcs.failing = {b"run-1/p/node:8/%012d" % 10}
    first = box.take(1.0)
    taken = [(w, mailbox.decode(v)[0]["seq"]) for w, v in first]
    assert taken == [("node:7", n) for n in range(12)] + [("node:8", n) for n in range(10)]
    assert mailbox.decode(first[0][1]) == ({"seq": 0}, b"\x00\x00\x00\x01\x03\x00")
    gcs.failing = set()
    assert [(w, mailbox.decode(v)[0]["seq"]) for w, v in box.take(1.0)] == [("node:8", 10),
                                                                              ("node:8", 11)]
    assert box.take(1.0) == [] and box.state(1.0) == {"final": False, "drains": 0}
    box.put("node:7", 12, {"seq": 12}, [], 1.0)
    box.clear(1.0)
    assert gcs.store == {} and box.state(1.0) == {}


def _fake_ray_private(monkeypatch: pytest.MonkeyPatch, local: set[object],
                      job: str = "01000000") -> None:
    """Ray's few pieces `patches._raylet_can_hook` and the shim's job check read: an address
    in `local` starts a local instance; this worker's job is `job` ("" for none)."""
    services = types.SimpleNamespace(
        canonicalize_bootstrap_address=lambda address, temp_dir: (
            None if address in local else "127.0.0.1:6379"))
    constants = types.SimpleNamespace(
        WORKER_PROCESS_SETUP_HOOK_ENV_VAR="__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR")
    job_id = types.SimpleNamespace(is_nil=lambda: not job, hex=lambda: job)
    worker = types.SimpleNamespace(global_worker=types.SimpleNamespace(current_job_id=job_id))
    private = types.SimpleNamespace(services=services, ray_constants=constants, worker=worker)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(_private=private))
    monkeypatch.setitem(sys.modules, "ray._private", private)
    monkeypatch.setitem(sys.modules, "ray._private.services", services)
    monkeypatch.setitem(sys.modules, "ray._private.ray_constants", constants)
    monkeypatch.setitem(sys.modules, "ray._private.worker", worker)


def test_the_hook_goes_in_raylets_environment_only_where_nothing_else_asks_for_the_jobs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The raylet's environment only for a local instance the program gives no runtime_env
    (nor job_config runtime_env), no prestart setting and no setup-hook variable of its own;
    a running instance's raylet is not this process's; a failing check keeps the job's way."""
    from otel_rl._internal.ray_support import patches

    _fake_ray_private(monkeypatch, local={None, "local"})
    monkeypatch.delenv(patches.PRESTART_ENV, raising=False)
    monkeypatch.delenv("__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR", raising=False)
    assert patches._raylet_can_hook(None, {})
    assert patches._raylet_can_hook("local", {"runtime_env": {}})
    assert not patches._raylet_can_hook("auto", {})  # a running instance
    assert not patches._raylet_can_hook("10.0.0.1:6379", {})
    assert not patches._raylet_can_hook(None, {"runtime_env": {"env_vars": {"A": "1"}}})
    assert not patches._raylet_can_hook(None, {"runtime_env": {"worker_process_setup_hook": print}})
    assert not patches._raylet_can_hook(None, {"job_config": types.SimpleNamespace(
        runtime_env={"pip": ["x"]})})
    monkeypatch.setenv(patches.PRESTART_ENV, "1")
    assert not patches._raylet_can_hook(None, {})
    monkeypatch.delenv(patches.PRESTART_ENV)
    monkeypatch.setenv("__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR", "m.f")  # a job supervisor's
    assert not patches._raylet_can_hook(None, {})
    monkeypatch.delenv("__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR")

    def refuses(address: object, temp_dir: object) -> None:
        raise ValueError("Invalid address format")

    monkeypatch.setattr(sys.modules["ray._private.services"], "canonicalize_bootstrap_address",
                        refuses)
    assert not patches._raylet_can_hook("bad:address:x", {})


@pytest.mark.parametrize(("job", "joins"), [("01000000", True), ("02000000", False),
                                            ("", False)])
def test_a_hook_from_raylets_environment_joins_only_the_runs_job(
        monkeypatch: pytest.MonkeyPatch, job: str, joins: bool) -> None:
    """The hook in raylet's environment reaches every worker of the instance: only the run's
    job's join (another job's, or Ray's spill and restore workers with no job, do nothing)."""
    _fake_ray_private(monkeypatch, local=set(), job=job)
    joined: list[dict[str, str]] = []
    entry = types.SimpleNamespace(join=lambda carrier: joined.append(carrier) or True)
    monkeypatch.setattr(_shim, "_entry_point", lambda: entry)
    _shim.make_setup_hook({"run_id": "r"}, None, "01000000")()
    assert joined == ([{"run_id": "r"}] if joins else [])
