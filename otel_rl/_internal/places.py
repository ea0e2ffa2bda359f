"""The wire form of the program's own merge points (`placement`): ``[pid, thread id, path]``
lists, as the run span's `semconv.PLACEMENTS` attribute (a JSON string) or a snapshot's
``placements``. Pure, so the read side (`treebuild`, `wholerun`) decodes them without the
recorder that `placement` watches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["decode", "encode"]


def encode(items: list[list[Any]]) -> str:
    return json.dumps(items, separators=(",", ":"))


def decode(values: Iterable[Any]) -> dict[tuple[int, int], tuple[str, ...]]:
    """Places from `encode`d strings or ``places()`` lists; malformed entries are skipped."""
    result: dict[tuple[int, int], tuple[str, ...]] = {}
    for value in values:
        items = value
        if isinstance(value, str):
            try:
                items = json.loads(value)
            except ValueError:
                continue
        if not isinstance(items, list):
            continue
        for item in items:
            try:
                pid, tid, path = item
                key = (int(pid), int(tid))
                names = tuple(str(name) for name in path)
            except (TypeError, ValueError):
                continue
            result.setdefault(key, names)
    return result
