"""Comparing a tree rebuilt from a run's spans with the run's timers.json."""

from __future__ import annotations

import json
from typing import Any


def ledger_apart(tree: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(`tree` without its ledger metadata, that ledger parsed; None where it has none)."""
    copy = json.loads(json.dumps(tree))
    ledger = copy.get("metadata", {}).pop("otel_rl_ledger", None)
    return copy, (json.loads(ledger) if ledger else None)


def assert_tree_is_timers_json(rebuilt: dict[str, Any], written: dict[str, Any]) -> None:
    """The tree rebuilt from the spans equals timers.json, but for when their ledgers were
    taken.

    The spans carry the ledger as it stood when the run's last aggregate was exported; the
    timers.json is written again after the last flush, with the ledger as it ended. When the
    flush thread delivered little before shutdown (a loaded machine, a buffer that filled),
    that flush delivers the rest: the same losses, and in the end more delivered, never less.
    """
    tree, early = ledger_apart(rebuilt)
    exact, final = ledger_apart(written)
    assert tree == exact
    assert (early is None) == (final is None)
    if final is None or early is None:
        return
    assert early.keys() == final.keys() and early["sinks"].keys() == final["sinks"].keys()
    assert early.get("upstream") == final.get("upstream")
    for name, sink in final["sinks"].items():
        before = early["sinks"][name]
        assert before["lost"] == sink["lost"]
        assert before["delivered"] <= sink["delivered"]
        for ledger in (before, sink):
            assert ledger["recorded"] == (ledger["delivered"] + sum(ledger["lost"].values())
                                          + ledger["pending"])
