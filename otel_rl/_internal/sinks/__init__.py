"""Where finished spans go: OTLP transports and the other sinks of the export pipeline."""
