"""Where finished spans go: every destination of the export pipeline is a `Sink`.

- `otlp.OtlpSink`: OTLP protobuf over gRPC or HTTP
- `file.FileSink`: an OTLP-JSON spans file (the Collector's file-exporter format)
- `sdk.SpanExporterSink`: any standard OTel `SpanExporter`
- `relay.RelayClient` (a worker's): the parent process's relay

The OTLP and SDK sinks import their dependencies (protobuf, the SDK) only when used; import
them from their modules.
"""

from otel_rl._internal.sinks.base import Sink, Stats, span_count

__all__ = ["Sink", "Stats", "span_count"]
