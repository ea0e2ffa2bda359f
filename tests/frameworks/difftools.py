"""What the differential scripts (rllib_stats_diff.py, rllib_log_time_diff.py) share: counting
the calls of one Python function, and comparing the two records of a program."""

from __future__ import annotations

import sys
import threading
from typing import Any


class Calls:
    """How many times the Python function `function` was called, on any thread, while this is
    entered (a compiled copy must not reach RLlib's Python function where it answers itself)."""

    def __init__(self, function: Any) -> None:
        self.code = function.__code__
        self.n = 0

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is self.code:
            self.n += 1

    def __enter__(self) -> Calls:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def compared(own: list[Any], copied: list[Any]) -> dict[str, Any]:
    """Whether RLlib's record `own` and the copy's `copied` are the same, and where they first
    differ."""
    first = next((i for i, (a, b) in enumerate(zip(own, copied, strict=True)) if a != b), None)
    return {"calls": len(own), "same": own == copied,
            "first_difference": None if first is None else
            {"rllib": own[first], "compiled": copied[first]}}
