"""The input boundary's pieces (readers/boundary.py, strictjson.py, jsonout.py): limits, strict JSON, deep
documents, special files. The CLI-level contract is in test_fuzz_cli.py."""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import aggregates, strictjson
from otel_rl._internal.errors import UserError
from otel_rl._internal.jsonout import dumps
from otel_rl._internal.readers import boundary
from otel_rl._internal.readers.boundary import Limits, parse_json, parse_json_values, read_input


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 5 or roll < 0.3:
        return rng.choice([0, -7, 2.5, 1e-300, 12345678901234567890, "", "a\u2028b\"\\", "é😀",
                           True, False, None])  # fmt: skip
    if roll < 0.65:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}\n": _random_json(rng, depth + 1) for i in range(rng.randrange(4))}


def test_the_explicit_stack_parser_reads_exactly_what_json_loads_reads() -> None:
    rng = random.Random(5)
    for _ in range(1000):
        value = _random_json(rng)
        for indent in (None, 2):
            text = json.dumps(value, indent=indent, ensure_ascii=bool(indent))
            assert strictjson._parse_deep(text, strictjson.DEFAULT_LIMITS) == json.loads(text)


def test_deep_documents_parse_up_to_the_limit_and_no_further() -> None:
    deep = '{"a":' * 15_000 + "1" + "}" * 15_000
    value = parse_json(deep, "deep.json")
    for _ in range(15_000):
        value = value["a"]
    assert value == 1
    with pytest.raises(UserError, match=r"^x\.json: nested deeper than 100 levels$"):
        parse_json("[" * 2000 + "]" * 2000, "x.json", Limits(max_depth=100))


def test_the_depth_limit_is_the_same_on_every_interpreter_for_answers_too() -> None:
    """Servers' answers (concatenated values) parse as deep as documents and no deeper: 3,000
    levels are past the C parser of Python 3.10-3.12 and within 3.13's."""
    deep = "[" * 3000 + "]" * 3000
    values = parse_json_values(deep + "\n" + deep + ' {"a": 1}', "answer")
    assert len(values) == 3 and values[2] == {"a": 1}
    with pytest.raises(UserError, match=r"^answer: nested deeper than 100 levels$"):
        parse_json_values('{"a": 1} ' + deep, "answer", Limits(max_depth=100))
    with pytest.raises(UserError, match=r"^answer: nested deeper than 2,000 levels$"):
        parse_json_values(deep, "answer", Limits(max_depth=2000))
    with pytest.raises(UserError, match=r"^x: nested deeper than 2,000 levels$"):
        parse_json(deep, "x", Limits(max_depth=2000))
    assert parse_json("[" * 100 + "]" * 100, "x", Limits(max_depth=100))  # exactly the limit


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[NaN]", "NaN is not valid JSON"),
        ('{"a": -Infinity}', "-Infinity is not valid JSON"),
        ("[1e999]", "the number 1e999 is out of range"),
        ("9" * 5000, "a number with 5000 digits"),
        ("[1.5, " + "1" * 100 + ".0]", "a number written with 102 characters"),
        ('{"a" 1}', "invalid JSON (Expecting ':' delimiter at column 6)"),
    ],
)
def test_strict_json_refuses_what_is_not_json_or_not_a_sane_number(text: str, message: str) -> None:
    with pytest.raises(UserError) as info:
        parse_json(text, "f.json")
    assert message in str(info.value) and len(str(info.value)) < 200


def test_lone_surrogates_become_replacement_characters_everywhere() -> None:
    value = parse_json('{"\\udc00k": ["\\ud800", "\\ud83d\\ude00", {"x": "a\\udfffb"}]}', "f")
    assert value == {"\ufffdk": ["\ufffd", "😀", {"x": "a\ufffdb"}]}
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # encodable now


def test_special_files_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    started = time.monotonic()
    with pytest.raises(UserError, match="is a FIFO"):
        read_input(fifo, "a spans file")
    with pytest.raises(UserError, match="is a directory, not a spans file"):
        read_input(tmp_path, "a spans file")
    with pytest.raises(UserError, match="is a device"):
        read_input("/dev/zero", "a spans file")  # would never end
    assert time.monotonic() - started < 5


def test_size_limits_hold_for_plain_and_gzip_files_and_lines(tmp_path: Path) -> None:
    limits = Limits(max_file_bytes=20_000, max_document_bytes=100)
    plain = tmp_path / "plain"
    plain.write_bytes(b"x" * 20_001)
    with pytest.raises(UserError, match=r"more than the 19\.5 KiB"):
        read_input(plain, "a file", limits)
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 10_000_000))  # 10 KB that inflate to 10 MB
    assert bomb.stat().st_size < 20_000
    with pytest.raises(UserError, match="decompresses to more than"):
        read_input(bomb, "a file", limits)
    lines = tmp_path / "lines"
    lines.write_bytes(b"short\n" + b"y" * 500 + b"\n")
    with boundary.open_input(lines, "a file") as handle:
        with pytest.raises(UserError, match="line 2: longer than the 100 bytes"):
            list(boundary.iter_lines(handle, "lines", limits))


def test_an_aggregate_payload_is_decompressed_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregates, "MAX_PAYLOAD_BYTES", 1000)
    bomb = base64.b64encode(zlib.compress(b"[" + b" " * 10_000_000 + b"]")).decode()
    with pytest.raises(ValueError, match="larger than the limit"):
        aggregates.decode([bomb])


def test_strict_json_out_is_json_dumps_and_survives_depth() -> None:
    rng = random.Random(9)
    for _ in range(300):
        value = _random_json(rng)
        assert dumps(value, indent=2) == json.dumps(value, indent=2)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(6000):
        node["c"] = {}
        node = node["c"]
    text = dumps(deep, indent=2)
    assert len(text) < 200_000  # indentation stops growing past 64 levels
    assert dumps(parse_json(text, "deep"), indent=2) == text  # (== on dicts would recurse)
    with pytest.raises(ValueError):
        dumps({"total": float("nan")})


def test_a_gauge_too_large_for_the_reports_is_refused_with_the_true_reason() -> None:
    """1e308 is finite: the message says what the limit is, not that the value is not finite."""
    from otel_rl._internal.readers.semantics import check_tree
    from otel_rl._internal.tree import Tree

    doc = {"name": "root", "total": 1.0, "count": 1,
           "gauges": {"loss": {"value": 1e308, "min": 0.0, "max": 1e308, "count": 2}}}  # fmt: skip
    with pytest.raises(UserError, match="between ±1e\\+300") as caught:
        check_tree(Tree.from_dict(doc))
    assert "finite" not in str(caught.value)
    doc["gauges"]["loss"].update(value=1e299, max=1e299)  # type: ignore[index]
    check_tree(Tree.from_dict(doc))


def test_iter_lines_drops_blank_lines_and_keeps_the_numbers() -> None:
    import io

    data = b"\n \n" + b'{"a": 1}\n' + b"\t\r\n" * 3 + b'{"b": 2}'
    lines = list(boundary.iter_lines(io.BytesIO(data), "f"))
    assert lines == [(3, b'{"a": 1}\n'), (7, b'{"b": 2}')]
    assert list(boundary.iter_lines(io.BytesIO(b"\n" * 100_000), "f")) == []
