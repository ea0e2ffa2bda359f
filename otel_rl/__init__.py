"""otel_rl: OpenTelemetry-native profiling timers for RL training.

Keep ML-Agents' timer API (``otel_rl.timers``) or Sample Factory's ``Timing``
(``otel_rl.timing``); call `configure()` once and every timed block becomes a span, worker
processes and threads join the trace, and ``timers.json`` covers the whole run.

>>> import otel_rl
>>> from otel_rl.timers import hierarchical_timer
>>> otel_rl.configure(service_name="trainer", output_dir="results/run1/run_logs")  # doctest: +SKIP
>>> with hierarchical_timer("advance"):
...     pass

The read side, for scripts: `read_spans_file`, `fetch_jaeger`, `fetch_tempo` return
`SpanData`; `build_tree` turns spans into the `Tree` that ``timers.json`` holds
(`Tree.from_json` reads one); bad input raises `UserError` with a one-line reason.

>>> spans = otel_rl.read_spans_file("otel-rl-runs/<run id>/spans.otlp.jsonl")  # doctest: +SKIP
>>> otel_rl.build_tree(spans).find(["advance"]).count  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from otel_rl._internal.config import Compression, Histogram, Protocol, SpanPolicy, settings_doc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from otel_rl._internal.errors import UserError
    from otel_rl._internal.propagation import attach_context, get_context, inject_env
    from otel_rl._internal.readers import fetch_jaeger, fetch_tempo, read_spans_file
    from otel_rl._internal.runtime import VERSION as __version__
    from otel_rl._internal.runtime import context_from_env
    from otel_rl._internal.sdk_exporter import ThreadAttributesSpanProcessor, TimerTreeExporter
    from otel_rl._internal.spandata import SpanData
    from otel_rl._internal.tree import Tree, TreeNode
    from otel_rl._internal.treebuild import build_tree

__all__ = [
    "SpanData",
    "ThreadAttributesSpanProcessor",
    "TimerTreeExporter",
    "Tree",
    "TreeNode",
    "UserError",
    "__version__",
    "attach_context",
    "build_tree",
    "configure",
    "context_from_env",
    "fetch_jaeger",
    "fetch_tempo",
    "force_flush",
    "get_context",
    "inject_env",
    "read_spans_file",
    "shutdown",
]

#: Imported on first use: `import otel_rl` loads neither the runtime nor the read side, so a
#: command that only reads (``otel-rl tree``) never imports the hot path, and the recorder
#: is loaded with the timers (`otel_rl.timers`).
_LAZY = {
    "__version__": "otel_rl._internal.runtime",
    "attach_context": "otel_rl._internal.propagation",
    "context_from_env": "otel_rl._internal.runtime",
    "get_context": "otel_rl._internal.propagation",
    "inject_env": "otel_rl._internal.propagation",
    "SpanData": "otel_rl._internal.spandata",
    "ThreadAttributesSpanProcessor": "otel_rl._internal.sdk_exporter",
    "TimerTreeExporter": "otel_rl._internal.sdk_exporter",
    "Tree": "otel_rl._internal.tree",
    "TreeNode": "otel_rl._internal.tree",
    "UserError": "otel_rl._internal.errors",
    "build_tree": "otel_rl._internal.treebuild",
    "fetch_jaeger": "otel_rl._internal.readers",
    "fetch_tempo": "otel_rl._internal.readers",
    "read_spans_file": "otel_rl._internal.readers",
}


def configure(
    *,
    service_name: str | None = None,
    endpoint: str | None = None,
    protocol: Protocol | None = None,
    headers: Mapping[str, str] | str | None = None,
    compression: Compression | None = None,
    timeout: float | None = None,
    insecure: bool | None = None,
    certificate: str | None = None,
    client_key: str | None = None,
    client_certificate: str | None = None,
    disabled: bool | None = None,
    resource_attributes: Mapping[str, str] | str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    spans: SpanPolicy | None = None,
    span_budget: int | None = None,
    sample_every: int | None = None,
    window: float | None = None,
    max_buffer: int | None = None,
    flush_interval: float | None = None,
    batch_size: int | None = None,
    shutdown_timeout: float | None = None,
    timers_interval: float | None = None,
    handle_sigterm: bool | None = None,
    count_if_killed: bool | None = None,
    propagate: bool | None = None,
    inherit_context: bool | None = None,
    gpu_blocks: str | Sequence[str] | None = None,
    gpu_timeout: float | None = None,
    metrics: bool | None = None,
    metrics_endpoint: str | None = None,
    metrics_protocol: Protocol | None = None,
    metrics_headers: Mapping[str, str] | str | None = None,
    metrics_compression: Compression | None = None,
    metrics_timeout: float | None = None,
    metrics_histogram: Histogram | None = None,
    metrics_interval: float | None = None,
    thread_nice: int | None = None,
    accelerator: bool | None = None,
    worker_role: str | None = None,
    worker_index: int | None = None,
    exporters: Sequence[SpanExporter] | None = None,
) -> None:
    # The docstring is completed from the settings table below (one source for both).
    arguments = {name: value for name, value in locals().items() if value is not None}
    from otel_rl._internal import propagation, runtime

    rt = runtime.configure(arguments)
    if rt.settings.propagate and not rt.settings.disabled:
        propagation.install()


configure.__doc__ = """Turn spans on for this process (and, automatically, its threads and worker
    processes).

    Every setting (``None``: not given) can also come from the environment; precedence is
    argument > ``OTEL_RL_*`` > standard ``OTEL_*`` > default. An invalid argument raises
    ``ValueError``; a malformed environment value is ignored with a warning. Calling it again
    reconfigures (the previous configuration is shut down first).

    >>> otel_rl.configure(service_name="trainer", endpoint="http://localhost:4318")  # doctest: +SKIP

    Settings (environment variables in precedence order):

""" + settings_doc("    ") + """
    - ``exporters``: extra standard OTel ``SpanExporter`` objects that also get every span.
    """


def shutdown(timeout: float | None = None) -> None:
    """Flush spans, write ``timers.json``, stop. Idempotent; returns within `timeout` seconds
    (default: the ``shutdown_timeout`` setting). Also runs at interpreter exit."""
    from otel_rl._internal import runtime

    runtime.shutdown(timeout)


def force_flush(timeout: float = 10.0) -> None:
    """Export what is buffered now, waiting at most `timeout` seconds."""
    import time

    from otel_rl._internal import runtime

    rt = runtime.active()
    if rt is not None:
        rt.pipeline.flush(time.monotonic() + timeout)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_rl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), "VERSION" if name == "__version__" else name)
