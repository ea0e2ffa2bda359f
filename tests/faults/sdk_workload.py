"""A main process under ``otel-rl run`` whose spans go to a standard `SpanExporter` (and the
spans file), for the killed-main test of an SDK exporter sink: its first export answers, its
second never returns (a request in flight when the process is killed).

    python -m tests.faults.sdk_workload OUT READY

Each call's span count is appended to ``READY.calls`` before the exporter answers (or hangs);
``READY`` (the main pid) is written once the second call is under way.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_rl
from otel_rl.timers import hierarchical_timer
from tests.faults.helpers import say_ready


class HangsOnSecond(SpanExporter):
    def __init__(self, ready: str) -> None:
        self.ready = ready
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        with open(f"{self.ready}.calls", "a") as f:
            f.write(f"{len(spans)}\n")
        if self.calls == 1:
            return SpanExportResult.SUCCESS
        say_ready(self.ready, str(os.getpid()))
        threading.Event().wait()  # (the answer never comes)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def main() -> None:
    out, ready = sys.argv[1], sys.argv[2]
    otel_rl.configure(output_dir=out, spans="all", flush_interval=0.2,
                      exporters=[HangsOnSecond(ready)])
    with hierarchical_timer("main"):
        for _ in range(200):
            with hierarchical_timer("step"):
                with hierarchical_timer("inner"):
                    pass
            time.sleep(0.002)
        while True:  # blocks keep coming until the test kills this process
            with hierarchical_timer("step"):
                pass
            time.sleep(0.01)


if __name__ == "__main__":
    main()
