"""The run, and the one module that owns otel_rl's process-wide state.

A process is either the run's *main* process (it owns the run span, the exporters and the
whole-run timers.json) or a *worker* (it continues a context handed down by a parent and, when
the parent's relay is reachable, ships its records and tree snapshots there).

Process state lives here only: the current `Runtime` and its lock, the recorder's switches
(through `recorder.arm` / `recorder.disarm`, called from nowhere else), its part of the one
fork hook (`procstate`; registered once a run starts: a forked child never keeps the parent's
run), the SIGTERM and atexit handlers, and its part of `procstate.reset_for_tests`. `propagation` patches the standard library on top of
this module and asks it for carriers and workers; it writes none of this state.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from otel_rl._internal import (
    aggregates,
    atomic,
    carrier,
    contribute,
    jsonout,
    ledger_hooks,
    log,
    placement,
    places,
    procstate,
    recorder,
    relay_columns,
    runreport,
    semconv,
    threads,
    wholerun,
)
from otel_rl._internal.carrier import Carrier, Context
from otel_rl._internal.config import CARRIED, Settings, resolve, run_folder
from otel_rl._internal.ledger_hooks import ledger_metadata
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.pipeline import PACK_RECORDS, Pipeline
from otel_rl._internal.record import OpenSpan, Record, make
from otel_rl._internal.recorder import Base, OpenRoot, TimerStack, Trace
from otel_rl._internal.shapes import TimersDict
from otel_rl._internal.sinks import Sink, Stats
from otel_rl._internal.sinks.file import FileSink
from otel_rl._internal.threads import start_daemon
from otel_rl._internal.wholerun import MainWorker, Snapshot, TreeInputs
from otel_rl._internal.zerocode import MAIN_ENV

if TYPE_CHECKING:
    from otel_rl._internal.otlp.transport import OtlpTransport
    from otel_rl._internal.relay import RelayClient, RelayServer
    from otel_rl._internal.windows import Windower

TIMERS_FILE = "timers.json"
SPANS_FILE = "spans.otlp.jsonl"
VERSION = "0.1.0"


class Runtime:
    def __init__(self, settings: Settings, ctx: Context | None, *, auto: bool) -> None:
        # A traceparent without otel_rl's context comes from outside (a traced CI job): this
        # process is the run's main process, continuing that trace; its run span hangs under
        # the outside span. Only a carrier from otel_rl makes a worker.
        self.external_parent = 0
        external_trace = 0
        if ctx is not None and ctx.external:
            self.external_parent, external_trace, ctx = ctx.span_id, ctx.trace_id, None
        self.settings = settings
        self.auto = auto
        self.closed = False
        self.pid = os.getpid()
        self.ctx = ctx
        self.is_worker = ctx is not None
        self.spans_on = not settings.disabled and settings.spans != "off"
        self.offset_ns = (ctx.offset_ns if ctx and ctx.offset_ns is not None
                          else time.time_ns() - recorder.now_ns())
        self.run_id = (ctx.run_id if ctx and ctx.run_id else settings.run_id)
        self.role = settings.worker_role or (ctx.role if ctx else None)
        self.index = settings.worker_index if settings.worker_index is not None else (
            ctx.index if ctx else None)
        self.stats = Stats()
        self.ledger_state = ledger_hooks.LedgerState()  # the ledger's view of workers and parent
        self.thread_names: dict[int, str] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.snapshots_lock = threading.Lock()
        self.relay_server: RelayServer | None = None
        self.relay_client: RelayClient | None = None
        self.remote_traces: dict[int, Trace] = {}
        self.role_counters: dict[str, int] = {}
        # Engine hooks (`ray_support`): feeds run at every flush before the drain (records
        # and snapshots arriving by other channels than the relay socket); finishers once at
        # shutdown, before the last tree; notes say what the whole-run tree lacks.
        self.feeds: list[Callable[[float], None]] = []
        self.finishers: list[Callable[[float], None]] = []
        self.notes: list[str] = []
        self.output_dir = self._output_dir()
        self.resource = self._resource()
        self.start_ns = recorder.now_ns()
        self.budget = sys.maxsize if settings.spans == "all" else settings.span_budget
        sinks = self._sinks()
        if self.relay_client is None and not settings.disabled:
            # What shutdown will need, imported now: importing modules such as `logging` or the
            # tree model from an atexit handler after an uncaught KeyboardInterrupt makes
            # CPython exit with status 1 instead of dying of SIGINT (130). Relaying workers
            # leave through os._exit and keep their start-up light.
            import logging  # noqa: F401

            from otel_rl._internal import tree  # noqa: F401
        self.pipeline = Pipeline(resource=self.resource, offset_ns=self.offset_ns,
                                 thread_names=self.thread_names, sinks=sinks, stats=self.stats,
                                 flush_interval=settings.flush_interval,
                                 max_relayed=max(64, settings.max_buffer // 64),
                                 on_flush=self._on_flush, after_flush=self._after_flush)
        self.last_timers_write = time.monotonic()
        self.finished = False
        self.aggregate_seq = 0
        self.aggregate_source = f"{socket.gethostname()}:{self.pid}:{recorder.new_span_id():x}"
        self.pending_timers: TimersDict | None = None
        self.t0_ns = (ctx.t0_ns if ctx is not None and ctx.t0_ns is not None
                      else self.offset_ns + self.start_ns)
        #: The stack of the thread that started the run (set by `attach`).
        self.run_stack: TimerStack | None = None
        buffer = self.pipeline.buffer
        if ctx is not None:
            self.trace = self.remote_trace(ctx)
            self.trace.n = 1  # reserved for this worker's process marker span
            self.run_span_id = ctx.span_id
            self.base: Base | None = Base(self.trace, ctx.span_id, ctx.path, ctx.pid, ctx.tid)
            # The main process's run span: worker marker spans hang there, since a worker
            # (a pool's, say) may outlive the block that started it.
            self.root_run = (ctx.run_trace or ctx.trace_id, ctx.run_span or ctx.span_id)
        else:
            # Derived from the run id, so any process of the run (another machine too) and
            # `otel-rl tree --run-id` find it without being told; inside a trace from outside
            # (a traced CI job), that trace.
            self.trace = Trace(external_trace or aggregates.run_trace_id(self.run_id),
                               self.budget, buffer)
            self.trace.n = 1  # reserved for the run span
            # Derived from a run id given from outside, so that a process sharing only that id
            # (another torchrun node) can hang under it; drawn otherwise (deterministic under
            # otel_rl.testing).
            self.run_span_id = (aggregates.run_span_id(self.run_id) if settings.run_id_given
                                else recorder.new_span_id())
            self.base = None  # set in attach(), from the run stack's thread
            self.root_run = (self.trace.trace_id, self.run_span_id)
        self.windower: Any = None
        if self.spans_on and settings.spans == "auto" and self.relay_client is None:
            self.windower = self.make_windower()
            self.pipeline.transform = self._windowed
        if self.spans_on and (self.relay_client is not None or self.windower is not None):
            # A relaying worker (the parent's socket, or Ray's mailbox: both send the relay's
            # frames) lays its records out in the relay's columns between flushes
            # (`relay_columns.Packs`: a record's tuple lives ~1,000 records, not a flush
            # interval, and never ages in the GC's generations); a process whose windows take
            # its records does so in the thread whose block fills the buffer, other than the
            # main thread (`attach`: no wakes of its flusher; the main thread's records wait
            # for such a block or the flush), and the windows place a packed batch by its
            # columns, as a relayed one.
            from otel_rl._internal.relay_columns import Packs

            self.pipeline.packs = Packs()
            self.pipeline.pack_between = self.relay_client is not None
        self.metrics: Any = None
        if (not settings.disabled and self.relay_client is None and settings.metrics is not False
                and (settings.endpoint or settings.metrics_endpoint)):
            from otel_rl._internal import metrics_export  # OTLP metrics (see `metrics`)

            self.metrics = metrics_export.attach(self)

    def _windowed(self, batches: list[Batch], final: bool) -> list[Batch]:
        """The windows' verdict on drained batches; if the windower fails (a bug), the
        records go out unwindowed (into the run trace) rather than being lost."""
        try:
            out: list[Batch] = self.windower.process_now(batches, final)
        except Exception as exc:
            self.stats.warn_once(f"windows-{type(exc).__name__}",
                                 f"time windows failed ({exc!r}); exporting unwindowed")
            return batches
        ledger_hooks.windowed(self, batches, out)  # (a survivor's count under `auto`)
        return out

    def make_windower(self) -> Windower:
        from otel_rl._internal.windows import Windower

        s = self.settings
        main = self.ctx is None
        budget = s.span_budget if main else self.trace.budget
        return Windower(
            run_id=self.run_id, t0_ns=self.t0_ns or 0, window_s=s.window, every=s.sample_every,
            budget=lambda: budget, main=main, run_span=self.root_run,
            lag_s=2 * s.flush_interval + 0.5,
            own=Batch(self.resource, self.offset_ns, [], self.thread_names),
            open_blocks=self.open_blocks, window_attributes=self.gauge_attributes,
            # A process exporting on its own cannot know whether the block that started it
            # (in another process) is still open: only the main process re-parents.
            bases=self.bases if main else None)

    def _own_open(self) -> list[OpenSpan]:
        return [block for st in recorder.all_stacks() if st.trace is not None
                for block in st.open_blocks()]

    def relayed_snapshots(self) -> list[Snapshot]:
        """The latest snapshot of every relaying worker (children's children included)."""
        with self.snapshots_lock:
            todo = list(self.snapshots.values())
        result = []
        while todo:
            snap = todo.pop()
            result.append(snap)
            todo.extend(snap.get("children") or ())
        return result

    def open_blocks(self) -> list[OpenSpan]:
        """Blocks open now, in this process's stacks and (as of their last snapshot) in its
        relaying workers', for continuation spans."""
        result = self._own_open()
        for snap in self.relayed_snapshots():
            pid = int(snap.get("pid") or 0)
            result.extend(OpenSpan.all_from_wire(pid, snap.get("open")))
        return result

    def bases(self) -> dict[Any, set[int]]:
        """Per process: the span ids its threads' top-level blocks hang under."""
        result: dict[Any, set[int]] = {
            self.pid: {st.base.span_id for st in recorder.all_stacks() if st.base is not None}}
        for snap in self.relayed_snapshots():
            result.setdefault(snap.get("pid"), set()).update(
                int(x) for x in snap.get("bases") or () if isinstance(x, int))
        return result

    def gauge_attributes(self) -> dict[str, Any]:
        """The run's gauges now (this process's, and its relaying workers' last snapshots)."""
        gauges = contribute.stack_gauges(recorder.all_stacks())
        with self.snapshots_lock:
            snapshots = list(self.snapshots.values())
        for top in snapshots:
            for name, gauge in (top.get("gauges") or {}).items():
                wholerun.merge_gauge(gauges, name, gauge)
        return aggregates.gauge_attributes(gauges)

    # -- set-up ------------------------------------------------------------------------------
    def _output_dir(self) -> str | None:
        s = self.settings
        if s.disabled:
            return None
        if s.output_dir:
            return ledger_hooks.output_dir(self, s.output_dir)
        if s.endpoint is None and not s.exporters:
            return run_folder(self.run_id)
        return None

    def _resource(self) -> dict[str, Any]:
        s = self.settings
        resource: dict[str, Any] = dict(s.resource_attributes)
        resource[semconv.SERVICE_NAME] = s.service_name
        resource[semconv.PROCESS_PID] = self.pid
        resource[semconv.HOST_NAME] = socket.gethostname()
        resource[semconv.RUN_ID] = self.run_id
        resource["telemetry.sdk.name"] = "otel_rl"
        resource["telemetry.sdk.language"] = "python"
        resource["telemetry.sdk.version"] = VERSION
        if self.is_worker or self.role:
            resource[semconv.WORKER_ROLE] = self.role or "worker"
            resource[semconv.WORKER_INDEX] = self.index if self.index is not None else 0
        return resource

    def _sinks(self) -> list[Sink]:
        s = self.settings
        if s.disabled:
            return []
        ctx = self.ctx
        if ctx is not None and ctx.relay and ctx.relay.startswith("ray:"):
            # A Ray worker: records go to the driver through Ray itself (any node).
            from otel_rl._internal.ray_support.sink import RaySink

            self.relay_client = RaySink(ctx.relay, self.stats)
            return [self.relay_client]
        if ctx is not None and ctx.relay:
            from otel_rl._internal.relay import RelayClient

            try:
                self.relay_client = RelayClient(ctx.relay, self.stats)
                ledger_hooks.watch_parent(self)
                return [self.relay_client]
            except OSError:
                log.info("otel_rl: parent relay unreachable; this process exports on its own")
        return self.own_sinks()

    def own_sinks(self) -> list[Sink]:
        """The sinks of a process that exports on its own (the main process; a worker with
        no parent relay, or whose parent is gone)."""
        s = self.settings
        sinks: list[Sink] = []
        if s.endpoint:
            # Imported only with an endpoint: the transport pulls in ssl, http and gzip.
            from otel_rl._internal.sinks.otlp import OtlpSink

            sinks.append(OtlpSink(self._transport_factory, s.batch_size, self.stats, s.endpoint))
        if self.output_dir:
            name = SPANS_FILE if not self.is_worker else f"spans.{self.pid}.otlp.jsonl"
            sinks.append(FileSink(os.path.join(self.output_dir, name), self.stats,
                                  timeline=not self.is_worker))
        if s.exporters:
            from otel_rl._internal.sinks.sdk import SpanExporterSink

            sinks.extend(SpanExporterSink(e, self.stats) for e in s.exporters)
        return sinks

    def _transport_factory(self) -> OtlpTransport:
        from otel_rl._internal.otlp.transport import OtlpTransport

        s = self.settings
        assert s.endpoint is not None
        return OtlpTransport(
            endpoint=s.endpoint, protocol=s.protocol,
            headers=s.headers,
            compression=None if s.compression == "none" else "gzip",
            timeout_s=s.timeout, insecure=s.insecure,
            certificate_file=s.certificate, client_key_file=s.client_key,
            client_certificate_file=s.client_certificate,
            traces_endpoint_is_full=s.traces_endpoint_is_full,
        )

    def attach(self, run_stack: TimerStack) -> None:
        """Turn spans on for every existing stack and for stacks made from now on."""
        self.run_stack = run_stack
        if self.base is None:
            self.base = Base(self.trace, self.run_span_id, (), self.pid, run_stack.tid)
        for st in recorder.all_stacks():
            self.adopt(st, initial=True)
        pipeline = self.pipeline
        inline = pipeline.packs is not None and not pipeline.pack_between
        recorder.arm(self.settings.max_buffer if self.spans_on else 0, self.adopt,
                     placement.on_merge, pipeline.pack_full if inline else None, PACK_RECORDS)
        if pipeline.sinks:
            pipeline.start()

    def set_epoch_offset(self, offset_ns: int) -> None:
        """What turns record times (the recorder's clock) into Unix epoch ns, for this run and
        its exports (`otel_rl.testing`'s deterministic clock starts at a fixed epoch)."""
        self.offset_ns = self.pipeline.offset_ns = offset_ns

    def adopt(self, st: TimerStack, initial: bool = False, base: Base | None = None) -> None:
        """Give a stack its place in the run: `base` when given (a task's or component's
        stack, placed by who made it), else the block that started its thread, if known."""
        if base is not None:
            st.base = base
        elif initial:
            st.base = self.base
        elif st.base is None:
            # Set by the patched Thread.start on a thread started inside a block.
            started_in = getattr(threading.current_thread(), "_otel_rl_base", None)
            in_process = started_in is not None and started_in.pid == self.pid
            st.base = started_in if in_process else self.base
        base = st.base
        st.trace = base.trace if (self.spans_on and base is not None) else None
        st.top = OpenRoot(base.span_id if base is not None else 0)
        self.thread_names[st.tid] = st.tname

    def remote_trace(self, ctx: Context) -> Trace:
        """The local bookkeeping for a trace a carrier hands this process (budget shares add)."""
        trace = self.remote_traces.get(ctx.trace_id)
        share = self.budget if ctx.budget is None else int(ctx.budget)
        if trace is None:
            trace = self.remote_traces[ctx.trace_id] = Trace(
                ctx.trace_id, share, self.pipeline.buffer if ctx.sampled else recorder.DISCARD)
        else:
            trace.budget += share
        return trace

    def next_index(self, role: str) -> int:
        """The next worker index for `role` (0, 1, ...), counted in this process."""
        index = self.role_counters.get(role, 0)
        self.role_counters[role] = index + 1
        return index

    # -- workers -----------------------------------------------------------------------------
    def _on_relayed(self, batch: Batch) -> None:
        ledger_hooks.relayed(self, batch)
        self.pipeline.add_relayed(batch)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        with self.snapshots_lock:
            self.snapshots[f"{snapshot.get('pid')}"] = snapshot
        ledger_hooks.snapshot_seen(self, snapshot)

    def ensure_relay(self) -> str | None:
        """The address children relay to, starting the server on first need."""
        if self.closed or self.settings.disabled or not self.settings.propagate:
            return None
        if self.relay_server is None:
            from otel_rl._internal.relay import RelayServer

            try:
                self.relay_server = RelayServer(self._on_relayed, self.on_snapshot,
                                                lambda pid: ledger_hooks.worker_lost(self, pid))
            except OSError as exc:
                self.stats.warn_once("relay-server", f"cannot open the worker relay: {exc}")
                return None
        return str(self.relay_server.address)

    def snapshot(self) -> Snapshot:
        stacks = recorder.all_stacks()
        with self.snapshots_lock:
            children = list(self.snapshots.values())
        return {"pid": self.pid, "role": self.role or "worker",
                "index": self.index if self.index is not None else 0,
                "contributions": contribute.contributions(stacks, self.base),
                "gauges": contribute.stack_gauges(stacks),
                "dropped": sum(st.dropped for st in stacks),
                "placements": placement.places(),
                # For the parent's windows (`auto`): blocks open now, and where this process's
                # threads hang.
                "open": [block.wire() for block in self._own_open()],
                "bases": sorted({st.base.span_id for st in stacks if st.base is not None}),
                "scalars": _scalars(),
                "children": children,
                **ledger_hooks.snapshot_extras(self)}

    def _on_flush(self, deadline: float) -> None:
        for feed in list(self.feeds):
            feed(deadline)
        if self.relay_client is not None and ledger_hooks.parent_gone(self):
            ledger_hooks.orphaned(self)
        if self.relay_client is not None:
            self.relay_client.send_snapshot(self.snapshot())
        elif (not self.closed and not self.settings.disabled and time.monotonic()
              - self.last_timers_write >= self.settings.timers_interval):
            # A run killed without warning (SIGKILL, OOM) still leaves a recent timers.json,
            # and the backend the same tree (the aggregate sent in this flush).
            self.checkpoint(recorder.now_ns(), final=False)

    def _after_flush(self) -> None:
        if self.relay_client is not None:
            self.relay_client.after_flush()
        tree, self.pending_timers = self.pending_timers, None
        if tree is not None:
            self._write_timers_dict(tree)

    def checkpoint(self, end_ns: int, final: bool) -> None:
        """Snapshot the whole-run tree once: queue its aggregate spans for export and keep
        the timers.json made from the same snapshot, written once they have been exported."""
        self.last_timers_write = time.monotonic()
        payload: TreeInputs | Snapshot
        if self.is_worker:
            payload, kind = self.snapshot(), "worker"
            tree = self.whole_run_tree(end_ns)
        else:
            inputs = self.tree_inputs(end_ns)
            payload, kind = inputs, "main"
            tree = wholerun.build(**ledger_hooks.checkpoint_inputs(inputs, final)).to_dict()
        self.emit_aggregate(payload, kind, final, end_ns)
        self.pending_timers = tree if self.output_dir else None

    def emit_aggregate(self, payload: TreeInputs | Snapshot, kind: str, final: bool,
                       end_ns: int) -> None:
        """The aggregate spans of `payload` (see `aggregates`), into the run trace."""
        if not self.pipeline.sinks:
            return
        self.aggregate_seq += 1
        parts = aggregates.encode(payload)
        run_trace, run_span = self.root_run
        gauges = payload.get("gauges") or {}
        tid = threading.get_ident()
        for i, data in enumerate(parts):
            attrs = aggregates.span_attributes(self.aggregate_source, self.aggregate_seq, i,
                                               len(parts), final, data, kind)
            if i == 0:
                attrs.update(aggregates.gauge_attributes(gauges))
                attrs[semconv.RUN_ID] = self.run_id
                if self.windower is not None and self.windower.main:
                    attrs[semconv.WINDOWS] = sorted(self.windower.kept)
            self.pipeline.buffer.append(make(recorder.new_span_id(), run_span, aggregates.NAME,
                                             end_ns, end_ns, tid, run_trace, {"attrs": attrs}))
            recorder.tally_add(1)

    # -- shutdown ----------------------------------------------------------------------------
    def _final_span(self, end_ns: int) -> None:
        stacks = recorder.all_stacks()
        attrs: dict[str, Any] = aggregates.gauge_attributes(contribute.stack_gauges(stacks))
        run_stack = self.run_stack
        if run_stack is not None and not self.is_worker:
            for key, value in self.run_metadata(run_stack).items():
                attrs[f"{semconv.METADATA_PREFIX}{key}"] = str(value)
        placed = placement.places()
        if placed:
            attrs[semconv.PLACEMENTS] = places.encode(placed)
        tid = run_stack.tid if run_stack is not None else threading.get_ident()
        if self.is_worker:
            attrs[semconv.KIND] = semconv.KIND_PROCESS
            run_trace, run_span = self.root_run
            parent = run_span if run_trace == self.trace.trace_id else self.run_span_id
            record: Record = make(recorder.new_span_id(), parent,
                                  f"process {self.role or 'worker'}", self.start_ns, end_ns, tid,
                                  self.trace.trace_id, {"attrs": attrs})
        else:
            attrs[semconv.KIND] = semconv.KIND_RUN
            attrs[semconv.RUN_ID] = self.run_id
            main = _main_role(self)
            if main is not None:
                attrs[semconv.COMPONENT], attrs[semconv.COMPONENT_ROLE], \
                    attrs[semconv.COMPONENT_INDEX] = main
            start = run_stack.run_start if run_stack is not None else self.start_ns
            record = make(self.run_span_id, self.external_parent, "run", start, end_ns, tid,
                          self.trace.trace_id, {"attrs": attrs})
        self.pipeline.buffer.append(record)
        recorder.tally_add(1)

    def run_metadata(self, run_stack: TimerStack) -> dict[str, str]:
        """The run's metadata: the main thread's (ML-Agents' defaults and add_metadata) plus
        otel_rl's own keys; the same on the run span and in timers.json."""
        recorder.fix_argv(run_stack.metadata)
        metadata = dict(run_stack.metadata)
        metadata["otel_rl_run_id"] = self.run_id
        metadata["otel_rl_version"] = VERSION
        metadata["otel_rl_spans"] = self.settings.spans
        metadata["end_time_seconds"] = str(int(time.time()))
        return metadata

    def tree_inputs(self, end_ns: int) -> TreeInputs:
        """What `wholerun.build` makes the whole-run timers.json from, at `end_ns`."""
        stacks = recorder.all_stacks()
        run_stack = self.run_stack or recorder.thread_stack()
        with self.snapshots_lock:
            snapshots = list(self.snapshots.values())
        metadata = self.run_metadata(run_stack)
        ledger_metadata(metadata, self.stats)
        return {"local": contribute.contributions(stacks, self.base), "snapshots": snapshots,
                "root_total": (end_ns - run_stack.run_start) / 1e9,
                "gauges": contribute.stack_gauges(stacks), "metadata": metadata,
                "places": placement.places(), "main": self._main_worker(run_stack),
                "notes": list(self.notes)}

    def whole_run_tree(self, end_ns: int) -> TimersDict:
        """This process's whole-run timers.json (a worker's own file)."""
        return wholerun.build(**self.tree_inputs(end_ns)).to_dict()

    def _main_worker(self, run_stack: TimerStack) -> MainWorker | None:
        """The run's own thread as a `workers` entry, when a named Timing gave it a role."""
        main = _main_role(self)
        if main is None or self.is_worker:
            return None
        return {"role": main[1], "index": main[2], "pid": self.pid, "tid": run_stack.tid}

    def dropped_total(self) -> int:
        """Spans lost so far by the sink that lost most; buffer-full drops join the ledger
        when shutdown starts."""
        return self.stats.ledger.lost_most()

    def shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for finish in list(self.finishers):
            try:
                finish(deadline)
            except Exception as exc:
                self.stats.warn_once("finisher", f"a shutdown step failed: {exc!r}")
        end_ns = recorder.now_ns()
        components = sys.modules.get("otel_rl._internal.components")
        if components is not None:  # Sample Factory components end with the run
            components.close_all(end_ns, self.pipeline.buffer, self.spans_on)
        if not self.settings.disabled:
            self._final_span(end_ns)
        if self.spans_on:
            self._cut_short(end_ns)
        # Counted before disarming: a block that ends after that (another thread, while the
        # run shuts down) was not dropped for a full buffer, it ended after the run.
        buffer_drops = sum(st.dropped for st in recorder.all_stacks())
        # Stop recording spans; the trees keep aggregating as plain ML-Agents timers.
        recorder.disarm()
        for st in recorder.all_stacks():
            st.trace = None
        if self.relay_server is not None:
            self.relay_server.stop(deadline)
        gpu = sys.modules.get("otel_rl._internal.gpu")  # loaded only if a block asked for it
        if gpu is not None:
            gpu.finish(deadline)  # bounded: GPU time pending now lands in spans and timers.json
        self.stats.add_dropped("buffer full", buffer_drops, None,
                               f"the span buffer (max_buffer={self.settings.max_buffer}) was full")
        ledger_hooks.before_final_flush(self)  # what relaying workers dropped (full buffers)
        tree = None
        if not self.settings.disabled and self.relay_client is None:
            # One snapshot for both: the aggregate exported now and the timers.json after it.
            self.checkpoint(end_ns, final=True)
            tree, self.pending_timers = self.pending_timers, None
            if tree is not None:
                # Written before the last spans: on a nearly full disk the small file that
                # holds the whole tree goes first.
                self._write_timers_dict(tree)
        self.pipeline.shutdown(deadline, timeout)
        if self.relay_client is not None:
            self.relay_client.shutdown(deadline)
        if tree is not None and "metadata" in tree:
            # Again with the ledger as it ended (what the last flush delivered or lost).
            before = dict(tree["metadata"])
            ledger_metadata(tree["metadata"], self.stats)
            if tree["metadata"] != before:
                self._write_timers_dict(tree, quiet=True)
        ledger_hooks.shut_down(self)
        if tree is not None and time.monotonic() < deadline:
            self._write_report()
        self._report()
        self.finished = True

    def _write_report(self) -> None:
        """report.html, where ``otel-rl run`` asked the program's main process for it
        (`runreport`): from the tree just written and the spans its file sink kept."""
        folder = os.environ.get(runreport.REPORT_ENV)
        if (not folder or self.is_worker or not self.output_dir
                or os.path.abspath(self.output_dir) != folder
                or os.environ.get(MAIN_ENV) != f"pid:{self.pid}"):
            return
        if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
            # The program ends on Ctrl-C: Python then exits by SIGINT, unless code run from
            # a string (`exec`: dataclasses, as the page's modules load) clears its mark of
            # that, and the program would exit 1 instead of 130. The launcher writes it.
            return
        try:
            sink = next((s for s in self.pipeline.sinks
                         if isinstance(s, FileSink) and s.path == os.path.join(
                             self.output_dir, SPANS_FILE)), None)
            runreport.write(folder, sink.timeline_spans() if sink is not None else None)
        except Exception as exc:  # the launcher writes it from the files instead
            log.info("otel_rl: report.html left to otel-rl run: %r", exc)

    def _cut_short(self, end_ns: int) -> None:
        """Blocks still open now become spans ending here, marked cut short, so their
        children keep their parent (timers.json counts only finished blocks; so does the
        tree rebuilt from spans)."""
        attrs = {semconv.CUT_SHORT: True}
        for st in recorder.all_stacks():
            trace = st.trace
            if trace is None:
                continue
            for block in st.open_blocks():
                trace.sink.append(block.record(end_ns, trace.trace_id, {"attrs": attrs}))

    def _write_timers_dict(self, tree: TimersDict, quiet: bool = False) -> None:
        if not self.output_dir:
            return
        name = TIMERS_FILE if not self.is_worker else f"timers.{self.pid}.json"
        path = os.path.join(self.output_dir, name)
        try:
            os.makedirs(self.output_dir, exist_ok=True)
            text = jsonout.dumps(tree, indent=2, allow_nan=True)
            atomic.write_text(path, text)
            ledger_hooks.timers_written(self, len(text))
        except Exception as exc:
            if not quiet:  # quiet: rewriting a timers.json already written (the ledger)
                self.stats.warn_once("timers-json", f"cannot write {path}: {exc}")

    def _report(self) -> None:
        line = self.stats.ledger.line()
        if line:
            log.warning("otel_rl: %s", line)


def _scalars() -> list[list[Any]]:
    """Training scalars the zero-code hooks recorded here, for the parent's metrics."""
    metrics = sys.modules.get("otel_rl._internal.metrics")
    return [] if metrics is None else metrics.scalar_state()  # type: ignore[no-any-return]


def _main_role(rt: Runtime) -> tuple[str, str, int] | None:
    components = sys.modules.get("otel_rl._internal.components")
    return None if components is None else components.main_role_of(rt)  # type: ignore[no-any-return]


# --- process state ---------------------------------------------------------------------------
_rt: Runtime | None = None
_lock = threading.RLock()
_atexit_registered = False
_fork_hook_registered = False
_sigterm_installed = False
#: Per thread: a `multiprocessing` Process start in progress (its bootstrap makes the child a
#: worker with its own carrier), and the carrier prepared for a bare os.fork().
_fork = threading.local()


def current() -> Runtime | None:
    """The runtime, if any (it may be closed, or a forked parent's)."""
    return _rt


def active() -> Runtime | None:
    """The runtime of this process while it records (not closed, not inherited by fork)."""
    rt = _rt
    if rt is None or rt.closed or rt.pid != os.getpid():
        return None
    return rt


def context_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The carrier a parent put into this process's environment ({} if none)."""
    return carrier.from_env(environ)


def start(settings: Settings, ctx: Context | None, *, auto: bool = False) -> Runtime:
    """Start the runtime (the caller holds no runtime)."""
    global _rt, _atexit_registered, _fork_hook_registered
    # Imported whole before the runtime's flush thread starts: that thread finds the module in
    # sys.modules, and must never see it half-initialised.
    from otel_rl._internal import gpu  # light: torch is looked up only when a block asks

    with _lock:
        # Before any of its threads starts: they run nicer than the program's (`threads`).
        threads.set_niceness(0 if settings.disabled else settings.thread_nice)
        rt = Runtime(settings, ctx, auto=auto)
        rt.attach(recorder.thread_stack())
        ledger_hooks.main_started(rt)  # under `otel-rl run`: counted if it is killed
        gpu.configure(settings.gpu_blocks, settings.gpu_timeout)
        _rt = rt
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
        if not _fork_hook_registered:
            # Always, whatever `propagate` says: a forked child must never go on appending to
            # the parent's buffer, which nothing in the child drains.
            procstate.register("runtime", before=_before_fork,
                               after_in_parent=_after_fork_in_parent,
                               after_in_child=_after_fork_in_child)
            procstate.register_fork_hook_now()
            threads.wrap_os_fork()
            _fork_hook_registered = True
        if settings.handle_sigterm and not settings.disabled:
            install_sigterm_flush()
        return rt


def configure(settings: Mapping[str, object]) -> Runtime:
    """Turn otel_rl on with `settings` (see `otel_rl.configure`); returns the new runtime."""
    resolved = resolve(settings)
    recorder.use_accelerator(resolved.accelerator)
    relay_columns.use(resolved.accelerator)  # the relay's column writer, likewise
    with _lock:
        rt = _rt
        inherited = None
        if rt is not None and not rt.closed:
            if rt.auto and not settings:
                return rt  # a worker started by otel_rl already runs with its parent's settings
            if rt.auto and rt.is_worker:
                inherited = rt.ctx  # stay in the parent's run, with the program's settings
            shutdown(rt.settings.shutdown_timeout)
        if not resolved.inherit_context:
            ctx = None
        else:
            handed_down = carrier.from_env()
            ctx = inherited or carrier.parse(handed_down)
            if ctx is None and handed_down:
                log.warning("otel_rl: ignoring %s=%r: not a W3C traceparent "
                            "(00-<32 hex>-<16 hex>-<2 hex>)", carrier.ENV_TRACEPARENT,
                            handed_down["traceparent"][:80])
        return start(resolved, ctx, auto=inherited is not None)


def shutdown(timeout: float | None = None) -> None:
    """Flush, write timers.json and stop; idempotent, bounded by `timeout` seconds."""
    with _lock:
        rt = _rt
        if rt is None or rt.closed or rt.pid != os.getpid():
            return
        rt.closed = True
    try:
        rt.shutdown(rt.settings.shutdown_timeout if timeout is None else max(0.0, timeout))
    except Exception as exc:  # shutdown runs at exit; it must never raise into the program
        log.warning("otel_rl: shutdown failed: %r", exc)


def _at_exit() -> None:
    shutdown()


# --- carriers and workers ------------------------------------------------------------------------

def current_base(rt: Runtime) -> tuple[TimerStack, Base, tuple[str, ...]]:
    """This thread's active stack, the place its top-level blocks hang, and the open block's
    tree path."""
    st = recorder.thread_stack()
    base = st.base or rt.base
    assert base is not None
    path = tuple(base.path) + tuple(node.name for node in st.stack[1:])
    return st, base, path


def make_carrier(*, for_process: bool, role: str | None = None,
                 index: int | None = None) -> Carrier:
    """The current block's context as a carrier (empty when otel_rl is not configured)."""
    rt = active()
    if rt is None:
        return {}
    st, base, path = current_base(rt)
    trace = st.trace or base.trace or rt.trace
    span_id = st.span or base.span_id or rt.run_span_id
    sampled = trace.sink is rt.pipeline.buffer and rt.spans_on
    share = None
    if for_process:
        # Hand the child part of what is left of this trace's budget, so that all processes
        # together never put more than the budget into one trace.
        share = min(rt.budget // 8, max(0, (trace.budget - trace.n) // 4))
        trace.budget -= share
    data: dict[str, Any] = {
        "path": list(path), "pid": rt.pid, "tid": st.tid, "offset": rt.offset_ns,
        "run_id": rt.run_id, "budget": share, "role": role, "index": index,
        "run": [f"{rt.root_run[0]:032x}", f"{rt.root_run[1]:016x}"], "t0": rt.t0_ns,
    }
    if for_process:
        data["relay"] = rt.ensure_relay()
        data["settings"] = {name: getattr(rt.settings, name) for name in CARRIED}
    return carrier.make(trace.trace_id, span_id, sampled, data)


def start_worker(handed_down: Mapping[str, str]) -> None:
    """Make this process a worker continuing `handed_down` (replacing an inherited runtime)."""
    global _rt
    ctx = carrier.parse(handed_down)
    if ctx is None:
        return
    arguments = {k: v for k, v in ctx.settings.items() if k in CARRIED}
    try:
        settings = resolve(arguments)
    except ValueError:
        settings = resolve({})
    with _lock:
        _rt = None  # an inherited (forked) runtime belongs to the parent: drop it
        start(settings, ctx, auto=True)
    _watch_sigterm()


def join_or_say(handed_down: Mapping[str, str], what: str) -> None:
    """`start_worker` in a child that must run whatever happens: if joining fails, the child
    runs unrecorded and says so in one line (`what` it is: "forked process", ...)."""
    try:
        start_worker(handed_down)
    except Exception as exc:
        log.warning("otel_rl: this %s could not join the run; its blocks are not recorded: %r",
                    what, exc)


@contextmanager
def no_context_for_programs() -> Iterator[None]:
    """Programs this thread starts in the ``with`` body get no context (an engine's own
    daemons, such as Ray's raylet, whose workers join the run by the engine's own means)."""
    _fork.quiet = getattr(_fork, "quiet", 0) + 1
    try:
        yield
    finally:
        _fork.quiet -= 1


def programs_quiet() -> bool:
    return bool(getattr(_fork, "quiet", 0))


@contextmanager
def starting_process() -> Iterator[None]:
    """Around `multiprocessing`'s Process.start: a fork in there is that Process's, whose
    bootstrap starts the worker with its own carrier (the fork hook makes none)."""
    _fork.starting_process = True
    try:
        yield
    finally:
        _fork.starting_process = False


def _before_fork() -> None:
    # SIGTERM stays blocked in the forking thread until both sides have run their fork hooks.
    # A Python-level SIGTERM handler (ours, `_on_sigterm`) is inherited by the child, and
    # CPython's after-fork code clears signals that tripped before it ran (bpo-9535): a
    # `Pool.terminate()` reaching a worker that the scheduler had not run yet was lost, the
    # worker stayed blocked on the task queue and `terminate()` waited on it forever. Blocked,
    # the SIGTERM stays pending in the kernel and is handled once the child unblocks it.
    _fork.mask = _block_sigterm()
    _fork.carrier = None
    rt = active()
    if rt is not None and rt.settings.propagate and not getattr(_fork, "starting_process", False):
        try:
            _fork.carrier = make_carrier(for_process=True, role="fork",
                                         index=rt.next_index("fork"))
        except Exception:
            _fork.carrier = None
    # Last (making the carrier may start the relay): no thread of otel_rl's is alive at the
    # fork, so a program that was single-threaded before `configure()` forks single-threaded.
    _stop_threads()


def _stop_threads() -> None:
    started = time.perf_counter()
    alive = threads.pause_for_fork()
    if alive:
        rt = active()
        names = ", ".join(d.name for d in alive)
        message = (f"{names} still running {time.perf_counter() - started:.1f} s after fork() "
                   "asked it to stop (an export in progress); forking with it alive")
        if rt is not None:
            rt.stats.warn_once("fork-threads", message)
        else:
            log.warning("otel_rl: %s", message)


def _block_sigterm() -> set[int | signal.Signals] | None:
    """Block SIGTERM in this thread; the previous mask (None if it cannot be changed)."""
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
        return None


def _restore_sigmask() -> None:
    previous = getattr(_fork, "mask", None)
    _fork.mask = None
    if previous is not None:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        except (OSError, ValueError):
            pass


def _after_fork_in_parent() -> None:
    try:
        threads.resume_after_fork()
    finally:
        _restore_sigmask()


def _after_fork_in_child() -> None:
    try:
        _reset_in_child()
    finally:
        # Last: a SIGTERM sent meanwhile is handled now, by a child that no longer holds the
        # parent's runtime (or by the worker it just became, which flushes first).
        _restore_sigmask()


def _reset_in_child() -> None:
    global _rt, _lock, _sigterm_watch
    threads.forget_all()  # the parent's, stopped for the fork; a worker starts its own
    if _sigterm_watch is not None:
        # The wakeup socket and its watcher are the parent's: this child's signals must not
        # reach them (the parent's watcher would take them for its own SIGTERM).
        watch, _sigterm_watch = _sigterm_watch, None
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
        for end in watch:
            end.close()
    rt = _rt
    if rt is None or rt.closed:
        return
    # Nothing made before the fork is reused: the parent's records, threads, sockets and
    # locks stay the parent's. The child starts clean: a worker of the parent when the parent
    # propagates, else not recording spans at all (like a spawned child nobody configured).
    _close_inherited(rt)
    recorder.reset_after_fork()
    recorder.disarm()
    _lock = threading.RLock()
    _rt = None
    handed_down = getattr(_fork, "carrier", None)
    if getattr(_fork, "starting_process", False) or not handed_down:
        return
    join_or_say(handed_down, "forked process")


def _close_inherited(rt: Runtime) -> None:
    """In a forked child: close its copies of the parent's sockets, quietly (closing a copy
    sends nothing), rather than leave them to the garbage collector, whose ResourceWarnings
    (``-W default``) would be otel_rl's."""
    owners: list[Any] = [rt.relay_server, *rt.pipeline.sinks]
    for owner in owners:
        forget = getattr(owner, "forget_after_fork", None)
        if forget is not None:
            try:
                forget()
            except Exception:
                pass


# --- SIGTERM ---------------------------------------------------------------------------------------

def install_sigterm_flush() -> None:
    """On SIGTERM (what schedulers and `Pool.terminate()` send), flush and write timers.json,
    then die of SIGTERM as the sender expects. Only when the program has no SIGTERM handler of
    its own; a handler it installs later replaces this one."""
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _sigterm_started
    _sigterm_started = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # repeats wait for the (bounded) flush
    rt = _rt
    if rt is not None and rt.closed and not rt.finished and rt.pid == os.getpid():
        return  # this process is already exiting and flushing: let that finish
    try:
        shutdown(timeout=min(2.0, rt.settings.shutdown_timeout) if rt is not None else 0.0)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


#: Set when `_on_sigterm` starts; the wakeup socket pair `_watch_sigterm` reads, if any.
_sigterm_started = False
_sigterm_watch: tuple[socket.socket, socket.socket] | None = None


def _watch_sigterm() -> None:
    """In a worker whose SIGTERM handler is `_on_sigterm`: make sure the handler runs.

    Python runs a signal's handler in the main thread at its next bytecode; the C handler only
    marks it. When the signal lands on the main thread just before it blocks in a call that no
    signal wakes (a pool worker going back to ``SemLock.acquire`` on its task queue), the mark
    is never acted on and `Pool.terminate()` waits for that worker forever (seen with gdb:
    SIGTERM marked, main thread in sem_wait). A watcher thread reads the signal numbers
    CPython writes to the wakeup fd; if the handler has not started half a second after a
    SIGTERM, it sends the main thread another one, which interrupts the blocking call. Not
    done when the program already uses the wakeup fd (asyncio) or handles SIGTERM itself.
    """
    global _sigterm_watch
    if (_sigterm_watch is not None or signal.getsignal(signal.SIGTERM) is not _on_sigterm
            or threading.current_thread() is not threading.main_thread()):
        return
    try:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (OSError, ValueError):
        return
    if previous != -1:  # the program's: leave it
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return
    _sigterm_watch = (reader, writer)
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data or _sigterm_watch is None or threads.stopping():
                return
            if signal.SIGTERM not in data:
                continue
            for _ in range(20):
                if threads.sleep(0.5):
                    # A fork meanwhile: the restarted watcher takes over, with the mark kept.
                    _resend_wakeup(writer, signal.SIGTERM)
                    return
                if _sigterm_started or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
                    break  # handled, or the program has put its own handler in since
                try:
                    signal.pthread_kill(main, signal.SIGTERM)
                except (OSError, ValueError):
                    return

    start_daemon("otel_rl-sigterm", watch, wake=lambda: _resend_wakeup(writer, 0), yields=False)


def _resend_wakeup(writer: socket.socket, signum: int) -> None:
    """Put a byte into the wakeup socket: the watcher's `recv` returns (0 is no signal)."""
    try:
        writer.send(bytes([signum]))
    except OSError:
        pass


def _reset_for_tests() -> None:
    """The runtime's part of `procstate.reset_for_tests`: shut down and forget the run and
    every timer stack."""
    global _rt
    shutdown(5.0)
    with _lock:
        _rt = None
    recorder.disarm()
    recorder.reset_for_tests()
    _fork.__dict__.clear()


procstate.register("runtime", for_tests=_reset_for_tests)


def reset_for_tests() -> None:
    """`procstate.reset_for_tests`, the one reset for tests (kept here for tests written
    against the runtime): every part's state, the runtime's first."""
    procstate.reset_for_tests()
