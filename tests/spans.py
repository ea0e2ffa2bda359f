"""Spans made up for tests that only need well-formed ones."""

from __future__ import annotations

import os
import time

from otel_rl._internal.spandata import SpanData


def make_spans(n: int, service: str, pad: int = 0) -> tuple[str, list[SpanData]]:
    """One trace of `n` spans under a root (span 1 failed; `pad` bytes of attribute each)."""
    trace_id = os.urandom(16).hex()
    root = os.urandom(8).hex()
    now = time.time_ns()
    spans = [
        SpanData(
            trace_id,
            root if i == 0 else os.urandom(8).hex(),
            "" if i == 0 else root,
            f"op-{i}",
            now + i * 10_000,
            now + i * 10_000 + 5_000,
            {"i": i, "pad": "x" * pad} if pad else {"i": i},
            {"service.name": service},
            is_error=(i == 1),
        )
        for i in range(n)
    ]
    return trace_id, spans
