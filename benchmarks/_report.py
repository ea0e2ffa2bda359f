"""The common ending of a benchmark script: print the tables, save the results, exit code."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def finish(results: dict[str, Any], json_path: str | None,
           render: Callable[[dict[str, Any]], str],
           failures: Callable[[dict[str, Any]], list[str]]) -> int:
    """Print `render(results)`, write them to `json_path` if given; 1 if any check failed."""
    print()
    print(render(results))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 1 if failures(results) else 0
