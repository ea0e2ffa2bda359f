"""A block that raises: its span's exception stack trace is exactly what `traceback` formats,
also when the same exception keeps coming from the same place (formatted once, then reused)."""

from __future__ import annotations

import json
import queue
import sys
import traceback
from pathlib import Path
from typing import Any

import otel_rl
from otel_rl._internal import recorder
from otel_rl.timers import hierarchical_timer


def _caught(fn: Any) -> tuple[type[BaseException], BaseException, Any]:
    try:
        fn()
    except BaseException as exc:
        return type(exc), exc, exc.__traceback__
    raise AssertionError("did not raise")


def _empty() -> None:
    queue.Queue().get(timeout=0.0)


def _other_line() -> None:
    raise ValueError("bad")


def _chained() -> None:
    try:
        _other_line()
    except ValueError as exc:
        raise KeyError("again") from exc


def test_repeated_exceptions_have_the_same_text_as_traceback_formats() -> None:
    for fn in (_empty, _other_line, _chained, _empty, _other_line, _chained):
        exc_type, exc, tb = _caught(fn)
        extra = recorder._error_extra(exc_type, exc, tb)
        type_name, message, stack = extra["error"]
        assert type_name.endswith(exc_type.__qualname__)
        assert stack == "".join(traceback.format_exception(exc_type, exc, tb))
        assert message == str(exc)
    # The chained one is formatted every time (its text holds the cause), so never cached.
    assert not any(key[0] is KeyError for key in recorder._formatted_stacks)


def test_a_different_message_or_place_is_not_mistaken_for_a_cached_one() -> None:
    def fail(message: str) -> None:
        raise RuntimeError(message)

    texts = set()
    for message in ("one", "two", "one"):
        exc_type, exc, tb = _caught(lambda m=message: fail(m))  # type: ignore[misc]
        texts.add(recorder._error_extra(exc_type, exc, tb)["error"][2])
    assert len(texts) == 2 and all("RuntimeError" in t for t in texts)


def test_spans_of_a_block_that_keeps_raising_carry_the_full_stack(tmp_path: Path) -> None:
    otel_rl.configure(output_dir=str(tmp_path), spans="all")
    for _ in range(5):
        try:
            with hierarchical_timer("wait"):
                _empty()
        except queue.Empty:
            pass
    otel_rl.shutdown()
    stacks = []
    with open(tmp_path / "spans.otlp.jsonl", encoding="utf-8") as f:
        for line in f:
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        if span["name"] != "wait":
                            continue
                        for event in span.get("events", []):
                            attrs = {a["key"]: a["value"] for a in event["attributes"]}
                            stacks.append(attrs["exception.stacktrace"]["stringValue"])
    assert len(stacks) == 5
    assert len(set(stacks)) == 1
    assert stacks[0].startswith("Traceback (most recent call last):")
    assert "in _empty" in stacks[0]
    assert stacks[0].rstrip().splitlines()[-1].endswith("Empty")


def test_two_raises_on_one_line_keep_their_own_carets() -> None:
    """Python 3.11+ marks the failing expression's columns: the same exception from two calls
    on one line is two different texts, each what `traceback` makes."""
    def boom(_: int) -> int:
        raise ValueError("same")

    def pick(which: int) -> int:
        return boom(1) + 0 if which == 0 else 0 + boom(2)

    texts = set()
    for which in (0, 1, 0, 1):
        exc_type, exc, tb = _caught(lambda w=which: pick(w))  # type: ignore[misc]
        stack = recorder._error_extra(exc_type, exc, tb)["error"][2]
        assert stack == "".join(traceback.format_exception(exc_type, exc, tb))
        texts.add(stack)
    assert len(texts) == (2 if sys.version_info >= (3, 11) else 1)
