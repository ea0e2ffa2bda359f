"""A real run whose windows are checked against a shadow: ``python -m tests.windows_shadow
REPORT KIND OUT [key=value ...]`` runs `tests.long_workloads` KIND OUT with every `Windower`
the main process makes paired with a second one taking the same batches record by record
(``bulk = False``: relayed batches without their columns). Each flush, both must return the
same batches (same records, in the same order: ids, parents, times, extras); at the end both
must have kept the same windows and counted the same. REPORT gets a JSON summary.

The callbacks a windower reads while deciding a window (open blocks, gauges, the blocks that
started threads and processes) are live: the shadow gets the answers the first one got."""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.windows import Windower

REPORT: dict[str, Any] = {"windowers": 0, "flushes": 0, "mismatches": [], "bulk_batches": 0,
                          "bulk_records": 0, "stats": [], "kept": []}


def _replayed(fn: Callable[[], Any] | None, answers: deque[Any],
              record: bool) -> Callable[[], Any] | None:
    if fn is None:
        return None
    if record:
        def first() -> Any:
            answer = fn()
            answers.append(answer)
            return answer
        return first
    return answers.popleft


def _shape(batches: list[Batch]) -> list[tuple[Any, list[Any]]]:
    return [(dict(b.resource), list(b.records)) for b in batches]


def install() -> None:
    original_init = Windower.__init__
    original_process = Windower.process
    original_take = Windower.take_columns

    def init(self: Windower, **kwargs: Any) -> None:
        queues = {name: deque() for name in ("open_blocks", "window_attributes", "bases")}
        mine = dict(kwargs)
        theirs = dict(kwargs)
        for name, answers in queues.items():
            mine[name] = _replayed(kwargs.get(name), answers, True)
            theirs[name] = _replayed(kwargs.get(name), answers, False)
        original_init(self, **mine)
        shadow = Windower.__new__(Windower)
        original_init(shadow, **theirs)
        shadow.bulk = False
        self._shadow = shadow  # type: ignore[attr-defined]
        REPORT["windowers"] += 1

    def process(self: Windower, batches: Any, now_ns: int, final: bool = False) -> list[Batch]:
        shadow = getattr(self, "_shadow", None)
        if shadow is None:
            return original_process(self, batches, now_ns, final)
        out = original_process(self, batches, now_ns, final)  # (records not made yet)
        copies = [Batch(b.resource, b.offset_ns, list(b.records), b.thread_names)
                  for b in batches]
        expected = original_process(shadow, copies, now_ns, final)
        REPORT["flushes"] += 1
        held = {k: w.held() for k, w in self.windows.items()}
        if held != {k: w.held() for k, w in shadow.windows.items()}:
            REPORT["mismatches"].append({"flush": REPORT["flushes"], "held": held})
        if _shape(out) != _shape(expected):
            REPORT["mismatches"].append({"flush": REPORT["flushes"],
                                         "bulk": sum(len(b.records) for b in out),
                                         "reference": sum(len(b.records) for b in expected)})
        if final:
            REPORT["stats"].append([self.stats, shadow.stats])
            REPORT["kept"].append([self.kept, shadow.kept])
            if self.stats != shadow.stats or self.kept != shadow.kept:
                REPORT["mismatches"].append({"final": True})
        return out

    def take(w: Windower, key: Any, batch: Batch) -> None:
        REPORT["bulk_batches"] += 1
        REPORT["bulk_records"] += len(batch.records)
        original_take(w, key, batch)

    Windower.__init__ = init  # type: ignore[method-assign]
    Windower.process = process  # type: ignore[method-assign]
    Windower.take_columns = take  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    report, *rest = argv
    install()
    from tests import long_workloads

    try:
        long_workloads.main(rest)
    finally:
        with open(report, "w", encoding="utf-8") as f:
            json.dump(REPORT, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
