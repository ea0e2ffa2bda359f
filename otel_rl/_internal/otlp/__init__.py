"""OTLP in one place: encoding, reading and sending trace export requests.

- `records`: the live pipeline's compact span records -> protobuf (`encode_batches`) and
  OTLP/JSON lines (`JsonEncoder`), without SDK or protobuf-library objects (the fast path).
- `spans`: backend-neutral `SpanData` -> protobuf (`encode_spans`), for the offline tools.
- `requests`: serialised requests: OTLP-JSON spans files read as requests
  (`read_request_lines`), split to a size, turned into a JSON line, counted.
- `transport`: sends serialised requests over gRPC or HTTP (`OtlpTransport`).
- `delivery`: the one retry-and-split policy the pipeline's OTLP sink and `otel-rl replay` /
  `import` share (`Delivery`).

Reading OTLP-JSON into `SpanData` (for trees and reports) is `readers.otlp_json`.
"""
