"""The common ending of a benchmark script: print the tables, save the results, exit code."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def failures(results: dict[str, Any]) -> list[str]:
    """Every failed check of any variant, once each."""
    return sorted({c for row in results["summary"].values() for c in row["checks"]})


def failed_checks_lines(results: dict[str, Any]) -> list[str]:
    """Lines that mark a table whose checks failed as not a valid result (none if all passed)."""
    failed = failures(results)
    if not failed:
        return []
    return ["**CHECKS FAILED — these numbers are not a valid result:**", "",
            *(f"- {c}" for c in failed)]


def finish(results: dict[str, Any], json_path: str | None,
           render: Callable[[dict[str, Any]], str]) -> int:
    """Print `render(results)`, write them to `json_path` if given; 1 if any check failed."""
    print()
    print(render(results))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 1 if failures(results) else 0
