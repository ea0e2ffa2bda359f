"""Attribute and setting names otel_rl writes and reads, as documented constants.

Every producer (the recorder, `otel-rl import`) and every consumer (the tree builder, the
reports) uses these names, so spans from any otel_rl version or tool rebuild the same tree.
"""

from __future__ import annotations

# Span attributes ---------------------------------------------------------------------------
THREAD_ID = "thread.id"
THREAD_NAME = "thread.name"
#: What a span is: absent for an ordinary timed block; "run" for the span that is the tree's
#: root (one per run, emitted at shutdown); "process" for a worker process's marker span (not a
#: tree node: its gauges/metadata are merged into the root); "synthetic" is not a kind, see below.
KIND = "otel_rl.kind"
KIND_RUN = "run"
KIND_PROCESS = "process"
#: On the root span of a per-iteration trace that the `auto` policy sampled: "schedule" or "outlier".
SAMPLED = "otel_rl.sampled"
#: True on spans made by `otel-rl import` from a timers.json (not measured as spans).
SYNTHETIC = "otel_rl.synthetic"
#: On synthetic spans: how many times the block ran (the span's duration is the node's total).
COUNT = "otel_rl.count"
#: On synthetic spans: the node's self time in seconds, and ML-Agents' is_parallel flag.
SELF_SECONDS = "otel_rl.self_seconds"
IS_PARALLEL = "otel_rl.is_parallel"
#: Prefixes on run/process spans: gauges as `<prefix><name>.value|min|max|count`, metadata as
#: `<prefix><key>` (string values).
GAUGE_PREFIX = "otel_rl.gauge."
METADATA_PREFIX = "otel_rl.metadata."
#: GPU time of a block opted in to GPU timing (CUDA events): seconds, and the device index;
#: `GPU_TIMED_OUT` (true) instead of seconds when the events did not complete in time. On
#: synthetic spans, `GPU_SECONDS` is the node's GPU total and `GPU_COUNT` its measured runs.
GPU_SECONDS = "otel_rl.gpu.seconds"
GPU_DEVICE = "otel_rl.gpu.device"
GPU_TIMED_OUT = "otel_rl.gpu.timed_out"
GPU_COUNT = "otel_rl.gpu.count"
#: On run/process spans: where the program merged another thread's or process's timer tree
#: into its own (ML-Agents' `workers`, `trainer_threads`), as JSON
#: ``[[pid, thread id, [block names from the root]], ...]``: that thread's blocks belong there.
PLACEMENTS = "otel_rl.placements"
#: On a component span (a Sample Factory `Timing` used in a worker process or thread): the
#: Timing's name ("RolloutWorker_w0 profile"), its role ("RolloutWorker") and index (0).
COMPONENT = "otel_rl.component"
COMPONENT_ROLE = "otel_rl.component.role"
COMPONENT_INDEX = "otel_rl.component.index"

# Instrumentation scope of every span otel_rl writes ----------------------------------------
SCOPE_NAME = "otel_rl"
SCOPE_VERSION = "0.1.0"

# Resource attributes -----------------------------------------------------------------------
SERVICE_NAME = "service.name"
PROCESS_PID = "process.pid"
HOST_NAME = "host.name"
RUN_ID = "otel_rl.run.id"
WORKER_ROLE = "otel_rl.worker.role"
WORKER_INDEX = "otel_rl.worker.index"

# Long runs (docs/DESIGN.md, "Long runs") -----------------------------------------------------
#: The root span of a window trace (`auto`): one time window of the whole run.
KIND_WINDOW = "window"
#: A process's cumulative whole-run tree inputs (see `aggregates`), in the run trace.
KIND_AGGREGATE = "aggregate"
WINDOW_INDEX = "otel_rl.window.index"
#: Why a window was kept: "schedule" or "outlier".
WINDOW_KEPT = "otel_rl.window.kept"
#: Set when a kept window was over the span budget: spans starting at/after it (Unix ns) left out.
WINDOW_CUT_NS = "otel_rl.window.cut_ns"
#: A block that started before this window, shown clipped to it (not a tree count).
CONTINUATION = "otel_rl.continuation"
#: A block still open at shutdown or SIGTERM, ended there (not a tree count).
CUT_SHORT = "otel_rl.cut_short"
#: On a block cut short because its process died: how (exported by the parent).
DIED = "otel_rl.died"
AGGREGATE_SOURCE = "otel_rl.aggregate.source"
AGGREGATE_SEQ = "otel_rl.aggregate.seq"
AGGREGATE_PART = "otel_rl.aggregate.part"
AGGREGATE_PARTS = "otel_rl.aggregate.parts"
AGGREGATE_FINAL = "otel_rl.aggregate.final"
AGGREGATE_PAYLOAD_KIND = "otel_rl.aggregate.kind"
AGGREGATE_DATA = "otel_rl.aggregate.data"
#: Kept windows so far (list of indices), on aggregate spans of the main process.
WINDOWS = "otel_rl.windows"
#: On an outlier window: its spans start at/after this (Unix ns), the outlier's start (plus
#: the blocks that contain it).
WINDOW_SINCE_NS = "otel_rl.window.since_ns"
#: On a window's span whose parent (the block that started its thread or process) had ended
#: before the window: it hangs under the window span instead.
STARTER_ENDED = "otel_rl.starter_ended"
