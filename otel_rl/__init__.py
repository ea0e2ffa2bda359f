"""otel_rl: OpenTelemetry-native profiling timers for RL training.

Keep ML-Agents' timer API (``otel_rl.timers``) or Sample Factory's ``Timing``
(``otel_rl.timing``); call `configure()` once and every timed block becomes a span, worker
processes and threads join the trace, and ``timers.json`` covers the whole run.

>>> import otel_rl
>>> from otel_rl.timers import hierarchical_timer
>>> otel_rl.configure(service_name="trainer", output_dir="results/run1/run_logs")  # doctest: +SKIP
>>> with hierarchical_timer("advance"):
...     pass
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otel_rl._internal import propagation, runtime
from otel_rl._internal.propagation import attach_context, get_context, inject_env
from otel_rl._internal.runtime import VERSION as __version__
from otel_rl._internal.runtime import context_from_env

if TYPE_CHECKING:
    from otel_rl._internal.sdk_exporter import ThreadAttributesSpanProcessor, TimerTreeExporter

__all__ = [
    "ThreadAttributesSpanProcessor",
    "TimerTreeExporter",
    "__version__",
    "attach_context",
    "configure",
    "context_from_env",
    "force_flush",
    "get_context",
    "inject_env",
    "shutdown",
]


def configure(**settings: Any) -> None:
    """Turn spans on for this process (and, automatically, its threads and worker processes).

    Every setting can also come from the environment; precedence is argument >
    ``OTEL_RL_*`` > standard ``OTEL_*`` > default. The main ones:

    - ``service_name`` (``OTEL_SERVICE_NAME``)
    - ``endpoint`` (``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``), ``protocol`` (``grpc`` or
      ``http/protobuf``), ``headers``, ``compression``, ``timeout``, ``insecure``,
      ``certificate``, ``client_key``, ``client_certificate``
    - ``output_dir`` (``OTEL_RL_OUTPUT_DIR``): ``timers.json`` and ``spans.otlp.jsonl`` are
      written there; with no endpoint the default is ``./otel-rl-runs/<run id>``
    - ``spans`` (``OTEL_RL_SPANS``): ``all``, ``auto`` (default) or ``off``; ``span_budget``
    - ``disabled`` (``OTEL_SDK_DISABLED``), ``resource_attributes``
      (``OTEL_RESOURCE_ATTRIBUTES``), ``propagate``, ``inherit_context``, ``run_id``
    - ``gpu_blocks`` (``OTEL_RL_GPU_BLOCKS``): blocks also timed on the GPU with CUDA events
      (names or patterns, e.g. ``"forward,backward,update"``); ``gpu_timeout``
    - ``exporters``: extra standard OTel ``SpanExporter`` objects

    An invalid argument raises ``ValueError``; a malformed environment value is ignored with
    a warning. Calling it again reconfigures (the previous configuration is shut down first).
    """
    rt = runtime.configure(settings)
    if rt.settings.propagate and not rt.settings.disabled:
        propagation.install()


def shutdown(timeout: float | None = None) -> None:
    """Flush spans, write ``timers.json``, stop. Idempotent; returns within `timeout` seconds
    (default: the ``shutdown_timeout`` setting). Also runs at interpreter exit."""
    runtime.shutdown(timeout)


def force_flush(timeout: float = 10.0) -> None:
    """Export what is buffered now, waiting at most `timeout` seconds."""
    import time

    rt = runtime.active()
    if rt is not None:
        rt.pipeline.flush(time.monotonic() + timeout)


def __getattr__(name: str) -> Any:
    if name in ("TimerTreeExporter", "ThreadAttributesSpanProcessor"):
        from otel_rl._internal import sdk_exporter

        return getattr(sdk_exporter, name)
    raise AttributeError(f"module 'otel_rl' has no attribute {name!r}")
