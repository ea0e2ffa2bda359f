"""Hostile input through every command: the contract of issue 12, checked invocation by invocation.

A seeded generator builds well over 1,000 cases in the categories the issue's audit used
(truncated and random files, wrong shapes, wrong types in every field of timers.json and of
spans, NaN/Infinity, 400-5,000-digit numbers, 10,000-level nesting, names with lone
surrogates / control characters / HTML, bad ids, parent cycles, directories, FIFOs and devices,
missing paths, bad URLs and options, bad environment values, hostile Jaeger/Tempo answers from
a loopback server) and runs each through the commands
that read that kind of input (``report``, ``tree``, ``diff``, ``import``, ``replay``, ``demo``),
in-process through the CLI's `main`. For every invocation that must fail:

- a non-zero exit, never 1 (``diff``'s "regression") and never 70 (an unplanned error: a bug);
- exactly one line on stderr, at most 200 characters, starting ``otel-rl``; no traceback;
- nothing on stdout, no output file, no temporary file left (exit 3, a partial tree, writes
  its output whole, marked ``"complete": false``);
- done within 30 s.

Cases that are unusual but valid (odd names) must succeed, with strict JSON out. A few true
subprocess runs at the end prove that no traceback reaches a terminal either.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from otel_rl._internal import semconv as sc
from otel_rl._internal.cli import EXIT_INTERNAL, main
from otel_rl._internal.otlp.requests import request_to_json_line
from otel_rl._internal.otlp.spans import encode_spans as encode_request
from otel_rl._internal.readers.boundary import parse_json
from otel_rl._internal.spandata import SpanData, SpanEvent

REPO = Path(__file__).resolve().parent.parent
SEED = 12
MAX_SECONDS = 30.0
#: Placeholders in a case's command lines, replaced per case.
IN, GOOD, OUT_JSON, OUT_HTML, OUT_JSONL = "{in}", "{good}", "{out.json}", "{out.html}", "{out.jsonl}"
OUTPUTS = (OUT_JSON, OUT_HTML, OUT_JSONL)
#: Nothing listens on port 1: a replay that got past the file check would fail fast (exit 5).
NOWHERE = "http://127.0.0.1:1"

TIMERS_COMMANDS = (
    ["report", IN],
    ["report", IN, "--html", OUT_HTML],
    ["diff", GOOD, IN],
    ["diff", IN, GOOD],
    ["import", IN, "--output", OUT_JSONL],
)
SPANS_COMMANDS = (
    ["tree", IN, "-o", OUT_JSON],
    ["report", IN, "--html", OUT_HTML],
    ["replay", IN, "--endpoint", NOWHERE, "--timeout", "0.5"],
    ["diff", GOOD, IN],
)


@dataclass
class Case:
    category: str
    what: str
    commands: list[list[str]]
    content: bytes | None = None
    special: str | None = None  # "dir", "fifo", "device", "missing", "socket", "dangling"
    env: dict[str, str] = field(default_factory=dict)
    answer: tuple[int, bytes] | None = None  # what the fake Jaeger/Tempo at {server} answers
    ok: bool = False  # unusual but valid: must succeed


# -- valid documents to start from -----------------------------------------------------------


def base_timers() -> dict[str, Any]:
    return {
        "name": "root",
        "gauges": {"reward": {"value": 1.5, "min": 0.5, "max": 2.0, "count": 3}},
        "metadata": {"timer_format_version": "0.1.0", "run_id": "fuzz"},
        "total": 10.0,
        "count": 1,
        "self": 1.0,
        "children": {
            "env_step": {
                "total": 6.0,
                "count": 100,
                "self": 2.0,
                "children": {"worker": {"total": 12.0, "count": 400, "is_parallel": True}},
            },
            "update": {"total": 3.0, "count": 10, "self": 3.0},
        },
        "workers": [
            {"role": "rollout", "index": 0, "pid": 7, "path": ["env_step"],
             "tree": {"total": 0.0, "count": 0, "children": {"worker": {"total": 12.0, "count": 400}}}}
        ],
    }


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
T0 = 1_700_000_000_000_000_000


def base_spans() -> list[SpanData]:
    main_res = {sc.SERVICE_NAME: "fuzz", sc.PROCESS_PID: 100}
    worker_res = {**main_res, sc.PROCESS_PID: 201, sc.WORKER_ROLE: "rollout", sc.WORKER_INDEX: 0}
    ms = 1_000_000
    run = SpanData(TRACE, "00000000000000a1", "", "run", T0, T0 + 100 * ms,
                   {sc.KIND: sc.KIND_RUN, "otel_rl.gauge.reward.value": 1.5,
                    "otel_rl.gauge.reward.min": 1.0, "otel_rl.gauge.reward.max": 2.0,
                    "otel_rl.gauge.reward.count": 2}, main_res)  # fmt: skip
    env = SpanData(TRACE, "00000000000000a2", run.span_id, "env_step", T0 + ms, T0 + 50 * ms,
                   {sc.THREAD_ID: 1}, main_res,
                   events=[SpanEvent("note", T0 + 2 * ms, {"k": "v"})])  # fmt: skip
    policy = SpanData(TRACE, "00000000000000a3", env.span_id, "policy", T0 + 2 * ms,
                      T0 + 10 * ms, {sc.THREAD_ID: 1}, main_res,
                      links=[(TRACE, run.span_id)])  # fmt: skip
    worker = SpanData(TRACE, "00000000000000a4", env.span_id, "rollout", T0 + 3 * ms,
                      T0 + 40 * ms, {sc.THREAD_ID: 9}, worker_res)  # fmt: skip
    process = SpanData(TRACE, "00000000000000a5", run.span_id, "process rollout", T0 + ms,
                       T0 + 90 * ms, {sc.KIND: sc.KIND_PROCESS}, worker_res)  # fmt: skip
    return [run, env, policy, worker, process]


def spans_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(request_to_json_line(encode_request(base_spans())))
    return doc


def all_spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def dumps(doc: Any) -> bytes:
    return (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")


# -- generators, one per category ------------------------------------------------------------

#: Values of the wrong JSON type, by the type a field should have.
NOT_NUMBER = ["1.5s", "", None, [], {}, True, [1], {"v": 1}]
NOT_INT = [*NOT_NUMBER, 1.5, -0.5]
NOT_BOOL = ["true", 1, 0, None, [], {}, "yes"]
NOT_STR = [5, 1.5, None, [], {}, True, ["a"]]
NOT_OBJECT = [5, "x", None, [], True, [{}], 1.5]
NOT_LIST = [5, "x", {}, True, {"a": 1}, 1.5]


def _timers_field_mutations() -> Iterator[tuple[str, Callable[[dict[str, Any]], None]]]:
    def setter(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
        def apply(doc: dict[str, Any]) -> None:
            target = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return apply

    env = ["children", "env_step"]
    worker = ["workers", 0]
    fields: list[tuple[list[Any], list[Any]]] = [
        (["total"], [*NOT_NUMBER, -1.0]),
        (["count"], [*NOT_INT, -3]),
        (["name"], NOT_STR),
        (["children"], [x for x in NOT_OBJECT if x is not None]),
        ([*env, "total"], [*NOT_NUMBER, -0.001]),
        ([*env, "count"], [*NOT_INT, -1]),
        ([*env, "is_parallel"], [x for x in NOT_BOOL if x is not None]),
        ([*env, "children"], [x for x in NOT_OBJECT if x is not None]),
        ([*env, "children", "worker"], NOT_OBJECT),
        ([*env, "gpu_total"], [*NOT_NUMBER, -1.0]),
        ([*env, "gpu_count"], [*NOT_INT, -1]),
        (["gauges"], [x for x in NOT_OBJECT if x is not None]),
        (["gauges", "reward"], NOT_OBJECT),
        (["gauges", "reward", "value"], NOT_NUMBER),
        (["gauges", "reward", "min"], [x for x in NOT_NUMBER if x is not None]),
        (["gauges", "reward", "max"], [x for x in NOT_NUMBER if x is not None]),
        (["gauges", "reward", "count"], [x for x in NOT_INT if x is not None]),
        (["metadata"], [x for x in NOT_OBJECT if x is not None]),
        (["metadata", "run_id"], [[], {}, ["a"], {"a": 1}]),
        (["workers"], [x for x in NOT_LIST if x is not None]),
        (worker, NOT_OBJECT),
        ([*worker, "role"], [x for x in NOT_STR if x is not None]),
        ([*worker, "index"], [x for x in NOT_INT if x is not None]),
        ([*worker, "pid"], [x for x in NOT_INT if x is not None]),
        ([*worker, "path"], [5, "env_step", {}, [1], [None]]),
        ([*worker, "tree"], NOT_OBJECT),
        (["complete"], [x for x in NOT_BOOL if x is not None]),
        (["notes"], [5, "x", {}, [1], [None]]),
    ]
    for path, values in fields:
        for value in values:
            yield f"{'.'.join(map(str, path))} = {value!r}", setter(path, value)


def _ids(size: int) -> list[Any]:
    return [5, [], {}, True, "zz", "0" * 2 * size, "a" * (2 * size - 1), "a" * (2 * size + 1),
            "g" * 2 * size, "QUJD", "x" * 5000, 1.5]  # fmt: skip


def _attr(key: str, value: Any) -> list[dict[str, Any]]:
    return [{"key": key, "value": value}]


BAD_ATTRIBUTES: list[Any] = [
    5, "x", {}, [5], [{"key": 5, "value": {"stringValue": "a"}}], [{"value": {"intValue": 1}}],
    _attr("a", 5), _attr("a", "plain"), _attr("a", {"stringValue": 5}),
    _attr("a", {"boolValue": "true"}), _attr("a", {"intValue": "x"}), _attr("a", {"intValue": 1.5}),
    _attr("a", {"intValue": [1]}), _attr("a", {"doubleValue": "abc"}), _attr("a", {"doubleValue": []}),
    _attr("a", {"arrayValue": 5}), _attr("a", {"arrayValue": {"values": 5}}),
    _attr("a", {"arrayValue": {"values": [5]}}), _attr("a", {"kvlistValue": []}),
    _attr("a", {"kvlistValue": {"values": [{"key": 1}]}}), _attr("a", {"bytesValue": "!!"}),
    _attr("a", {"bytesValue": 5}), _attr("a", {"intValue": str(2**64)}),
]  # fmt: skip


def _spans_field_mutations() -> Iterator[tuple[str, Callable[[dict[str, Any]], None]]]:
    def on_span(index: int, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def apply(doc: dict[str, Any]) -> None:
            all_spans(doc)[index][key] = value

        return apply

    def semantic(index: int, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def apply(doc: dict[str, Any]) -> None:
            span = all_spans(doc)[index]
            span["attributes"] = [a for a in span.get("attributes", []) if a["key"] != key]
            span["attributes"].append({"key": key, "value": value})

        return apply

    def on_resource(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def apply(doc: dict[str, Any]) -> None:
            for rs in doc["resourceSpans"]:
                attrs = rs["resource"]["attributes"]
                if any(a["key"] == sc.WORKER_ROLE for a in attrs):
                    rs["resource"]["attributes"] = [a for a in attrs if a["key"] != key]
                    rs["resource"]["attributes"].append({"key": key, "value": value})

        return apply

    def structural(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
        def apply(doc: dict[str, Any]) -> None:
            target: Any = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return apply

    def ends_early(doc: dict[str, Any]) -> None:
        span = all_spans(doc)[2]
        span["endTimeUnixNano"] = str(int(span["startTimeUnixNano"]) - 1)

    span_fields: list[tuple[str, list[Any]]] = [
        ("traceId", _ids(16)),
        ("spanId", _ids(8)),
        ("parentSpanId", [5, [], {}, "zz", "a" * 15, "g" * 16, "x" * 5000, True]),
        ("name", [5, 1.5, [], {}, True, None]),
        ("startTimeUnixNano", ["abc", "", 1.5, [], {}, True, -1, "-5", 2**64, str(2**64), None, "1e9"]),
        ("endTimeUnixNano", ["abc", "", 1.5, [], {}, True, -1, "-5", 2**64, str(2**64), None, "1e9"]),
        ("attributes", BAD_ATTRIBUTES),
        ("status", [5, "x", [], {"code": []}, {"code": 1.5}, {"code": True}, {"message": 5}]),
        ("events", [5, "x", [5], [{"name": 5}], [{"timeUnixNano": "abc"}], [{"attributes": 5}],
                    [{"timeUnixNano": -1}]]),
        ("links", [5, [5], [{"traceId": "zz", "spanId": "a" * 16}], [{"traceId": TRACE, "spanId": 5}],
                   [{"traceId": TRACE}], [{}]]),
        ("kind", [[], {}, True, 1.5]),
        ("flags", ["x", [], 1.5]),
        ("traceState", [5, []]),
        ("droppedAttributesCount", ["x", [], -0.5]),
    ]  # fmt: skip
    for key, values in span_fields:
        for value in values:
            index = 2 if key not in ("traceId", "spanId") else 1
            yield f"span.{key} = {value!r:.60}", on_span(index, key, value)
    yield "span ends before it starts", ends_early
    semantics: list[tuple[int, str, list[Any]]] = [
        (0, sc.KIND, [{"intValue": "5"}, {"boolValue": True}, {"arrayValue": {"values": []}}]),
        (0, "otel_rl.gauge.reward.value", [{"stringValue": "abc"}, {"doubleValue": "NaN"},
                                           {"doubleValue": "Infinity"}, {"boolValue": True}]),
        (0, "otel_rl.gauge.reward.count", [{"doubleValue": 1.5}, {"intValue": "-2"},
                                           {"stringValue": "3"}]),
        (4, "otel_rl.gauge.loss.min", [{"stringValue": "low"}, {"doubleValue": "-Infinity"}]),
        (1, sc.SYNTHETIC, [{"stringValue": "true"}, {"intValue": "1"}]),
        (1, sc.COUNT, [{"intValue": "-1"}, {"stringValue": "3"}, {"doubleValue": 2.5}]),
        (1, sc.IS_PARALLEL, [{"stringValue": "yes"}]),
        (2, sc.GPU_SECONDS, [{"stringValue": "fast"}, {"doubleValue": "NaN"}, {"doubleValue": -1.0}]),
        (2, sc.GPU_COUNT, [{"doubleValue": 1.5}, {"intValue": "-4"}]),
    ]  # fmt: skip
    for index, key, values in semantics:
        for value in values:
            yield f"attribute {key} = {value!r}", semantic(index, key, value)
    for key, value in ((sc.WORKER_INDEX, {"stringValue": "x"}), (sc.WORKER_INDEX, {"intValue": "-1"}),
                       (sc.WORKER_ROLE, {"intValue": "3"}), (sc.PROCESS_PID, {"stringValue": "p"})):
        yield f"resource {key} = {value!r}", on_resource(key, value)  # fmt: skip
    structure: list[tuple[list[Any], list[Any]]] = [
        (["resourceSpans"], [5, "x", {}, True, 1.5]),
        (["resourceSpans", 0], [5, "x", [], True]),
        (["resourceSpans", 0, "resource"], [5, "x", [], True]),
        (["resourceSpans", 0, "resource", "attributes"], BAD_ATTRIBUTES[:8]),
        (["resourceSpans", 0, "scopeSpans"], [5, "x", {}, True]),
        (["resourceSpans", 0, "scopeSpans", 0], [5, "x", [], True]),
        (["resourceSpans", 0, "scopeSpans", 0, "spans"], [5, "x", {}, True]),
        (["resourceSpans", 0, "scopeSpans", 0, "spans", 0], [5, "x", [], True, None]),
        (["resourceSpans", 0, "scopeSpans", 0, "scope"], [5, "x", [], {"name": 5}, {"version": []}]),
    ]  # fmt: skip
    for path, values in structure:
        for value in values:
            yield f"{'.'.join(map(str, path))} = {value!r:.40}", structural(path, value)


def gen_wrong_types(rng: random.Random) -> Iterator[Case]:
    for what, mutate in _timers_field_mutations():
        doc = base_timers()
        mutate(doc)
        yield Case("wrong types: timers.json", what, list(TIMERS_COMMANDS), dumps(doc))
    for what, mutate in _spans_field_mutations():
        doc = spans_doc()
        mutate(doc)
        yield Case("wrong types: spans", what, list(SPANS_COMMANDS), dumps(doc))


def gen_truncated(rng: random.Random) -> Iterator[Case]:
    timers = json.dumps(base_timers()).encode()
    spans = json.dumps(spans_doc()).encode()
    for name, text, commands in (("timers.json", timers, TIMERS_COMMANDS), ("spans", spans, SPANS_COMMANDS)):
        for _ in range(40):
            cut = rng.randrange(1, len(text) - 1)
            yield Case("truncated", f"{name} cut at byte {cut}", list(commands), text[:cut])
        for _ in range(10):
            packed = gzip.compress(text + b"\n", mtime=0)  # the same bytes every run
            cut = rng.randrange(10, len(packed) - 1)
            yield Case("truncated", f"gzip {name} cut at byte {cut}", list(commands), packed[:cut])
        # A complete first line, then a record cut short (a file still being written).
        yield Case("truncated", f"{name} + half a line", list(commands), text + b"\n" + text[:50])  # fmt: skip


def gen_random(rng: random.Random) -> Iterator[Case]:
    for i in range(50):
        size = rng.choice([0, 1, 7, 100, 2000])
        data = rng.randbytes(size)
        yield Case("random", f"{size} random bytes #{i}", [*TIMERS_COMMANDS[:1], *SPANS_COMMANDS[:1], TIMERS_COMMANDS[4], SPANS_COMMANDS[2]], data)  # fmt: skip
    alphabet = "{}[]\":,0123456789.eE-+ truefalsnNaIity\n\\u"
    for i in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 300)))
        yield Case("random", f"random JSON-ish text #{i}", [*TIMERS_COMMANDS[:1], *SPANS_COMMANDS[:1], TIMERS_COMMANDS[4]], ("{" + text).encode())  # fmt: skip
    for label, data in (("UTF-16 timers.json", json.dumps(base_timers()).encode("utf-16")),
                        ("Latin-1 bytes", b'{"name": "r\xe9", "total": 1, "count": 1}'),
                        ("zstd magic", b"\x28\xb5\x2f\xfd" + rng.randbytes(50)),
                        ("only whitespace", b" \n\t\n"), ("a NUL byte", b"\x00"),
                        ("python source", b"import os\nos.system('x')\n")):  # fmt: skip
        yield Case("random", label, [*TIMERS_COMMANDS[:1], *SPANS_COMMANDS[:1], TIMERS_COMMANDS[4]], data)  # fmt: skip


def gen_shapes(rng: random.Random) -> Iterator[Case]:
    shapes: list[tuple[str, Any]] = [
        ("a list", [1, 2, 3]), ("a string", "timers"), ("a number", 42), ("null", None),
        ("true", True), ("an empty object", {}), ("an empty list", []),
        ("timers children as a list", {**base_timers(), "children": [1]}),
        ("spans as an object", {"resourceSpans": [{"scopeSpans": [{"spans": {"a": 1}}]}]}),
        ("Jaeger result without spans", {"result": {"x": 1}}),
        ("Jaeger result nested in itself", {"result": {"result": {"result": {}}}}),
        ("Tempo batches not a list", {"batches": {"a": 1}}),
        ("Tempo trace not an object", {"trace": [1, 2]}),
        ("metrics only", {"resourceMetrics": [{}]}), ("logs only", {"resourceLogs": []}),
        ("a server error", {"error": {"message": "x" * 5000}}),
        ("an empty export", {"resourceSpans": []}),
        ("spans without resourceSpans", {"spans": [{"name": "a"}]}),
        ("timers.json without total", {"name": "root", "count": 1}),
        ("timers.json without count", {"name": "root", "total": 1.0}),
    ]  # fmt: skip
    for label, doc in shapes:
        yield Case("wrong shapes", label, [*TIMERS_COMMANDS, *SPANS_COMMANDS], dumps(doc))
    # Several lines: a good request then a bad shape, and the reverse.
    good = json.dumps(spans_doc())
    for label, doc in shapes[:10]:
        yield Case("wrong shapes", f"good line, then {label}", list(SPANS_COMMANDS), f"{good}\n{json.dumps(doc)}\n".encode())  # fmt: skip
    yield Case("wrong shapes", "a timers.json given to tree", [["tree", IN, "-o", OUT_JSON], ["replay", IN, "--endpoint", NOWHERE]], dumps(base_timers()))  # fmt: skip


def gen_non_finite(rng: random.Random) -> Iterator[Case]:
    timers_text = json.dumps(base_timers())
    for literal in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999"):
        for target in ('"total": 10.0', '"count": 1', '"value": 1.5', '"min": 0.5', '"max": 2.0',
                       '"total": 6.0', '"total": 3.0', '"total": 12.0'):
            key = target.split(":")[0]
            text = timers_text.replace(target, f"{key}: {literal}", 1)
            yield Case("NaN/Infinity", f"timers {key} = {literal}", list(TIMERS_COMMANDS), text.encode())  # fmt: skip
    spans_text = json.dumps(spans_doc())
    start = all_spans(spans_doc())[2]["startTimeUnixNano"]
    for literal in ("NaN", "Infinity", "-Infinity", "1e999"):
        yield Case("NaN/Infinity", f"span start = {literal}", list(SPANS_COMMANDS), spans_text.replace(f'"{start}"', literal, 1).encode())  # fmt: skip
        yield Case("NaN/Infinity", f"doubleValue literal {literal}", list(SPANS_COMMANDS), spans_text.replace('{"doubleValue": 1.5}', f'{{"doubleValue": {literal}}}', 1).encode())  # fmt: skip
        yield Case("NaN/Infinity", f"intValue literal {literal}", list(SPANS_COMMANDS), spans_text.replace('{"intValue": "2"}', f'{{"intValue": {literal}}}', 1).encode())  # fmt: skip


def gen_huge_numbers(rng: random.Random) -> Iterator[Case]:
    timers_text = json.dumps(base_timers())
    spans = spans_doc()
    start = all_spans(spans)[2]["startTimeUnixNano"]
    spans_text = json.dumps(spans)
    for _i in range(40):
        digits = rng.randrange(400, 5001)
        number = str(rng.randrange(1, 10)) + "".join(rng.choice("0123456789") for _ in range(digits - 1))
        flavour = rng.choice(["int", "float", "negative", "exponent"])
        text = {"int": number, "float": number + ".5", "negative": "-" + number, "exponent": "1e" + number}[flavour]  # fmt: skip
        target = rng.choice(['"total": 10.0', '"count": 100', '"value": 1.5', '"pid": 7', '"total": 3.0'])  # fmt: skip
        key = target.split(":")[0]
        yield Case("huge numbers", f"timers {key} = {digits}-digit {flavour}", list(TIMERS_COMMANDS), timers_text.replace(target, f"{key}: {text}", 1).encode())  # fmt: skip
        where = rng.choice(["start string", "start number", "intValue", "doubleValue"])
        replaced = {
            "start string": spans_text.replace(f'"{start}"', f'"{number}"', 1),
            "start number": spans_text.replace(f'"{start}"', number, 1),
            "intValue": spans_text.replace('{"intValue": "2"}', f'{{"intValue": "{number}"}}', 1),
            "doubleValue": spans_text.replace('{"doubleValue": 1.5}', f'{{"doubleValue": {text}}}', 1),
        }[where]
        yield Case("huge numbers", f"span {where} = {digits} digits", list(SPANS_COMMANDS), replaced.encode())  # fmt: skip
    for total in (1e30, 1e20, 1e12, 1.7e308):
        doc = base_timers()
        doc["total"] = total
        doc["children"]["update"]["total"] = total
        yield Case("huge numbers", f"timers total {total:g} s", list(TIMERS_COMMANDS), dumps(doc))


def _nested(depth: int, opener: str, closer: str, middle: str = "1") -> str:
    return opener * depth + middle + closer * depth


def gen_deep(rng: random.Random) -> Iterator[Case]:
    for depth in (10_000, 25_000):
        yield Case("deep nesting", f"{depth} nested lists", [*TIMERS_COMMANDS, *SPANS_COMMANDS], _nested(depth, "[", "]").encode())  # fmt: skip
        yield Case("deep nesting", f"{depth} nested objects", [*TIMERS_COMMANDS, *SPANS_COMMANDS], _nested(depth, '{"a":', "}").encode())  # fmt: skip
    for depth in (9_000, 25_000):
        children = '{"total": 1, "count": 1, "children": {"x": ' * depth + '{"total": "bad"}' + "}}" * depth  # fmt: skip
        yield Case("deep nesting", f"timers.json {depth} levels, bad leaf", list(TIMERS_COMMANDS), children.encode())  # fmt: skip
    spans_text = json.dumps(spans_doc())
    for levels in (3_000, 10_000):  # 12,000 JSON levels (parsed, then refused) and 40,000
        deep_value = '{"kvlistValue": {"values": [{"key": "k", "value": ' * levels + '{"intValue": "1"}' + "}]}}" * levels  # fmt: skip
        yield Case("deep nesting", f"attribute value {levels:,} levels deep", list(SPANS_COMMANDS), spans_text.replace('{"intValue": "2"}', deep_value, 1).encode())  # fmt: skip
    for key in ('"name": "policy"', f'"traceId": "{TRACE}"'):
        field_name = key.split(":")[0]
        yield Case("deep nesting", f"{field_name} nested 10,000 lists", list(SPANS_COMMANDS), spans_text.replace(key, f"{field_name}: {_nested(10_000, '[', ']')}", 1).encode())  # fmt: skip
    yield Case("deep nesting", "a 10,000-deep document in the second line", list(SPANS_COMMANDS), (spans_text + "\n" + _nested(10_000, "[", "]") + "\n").encode())  # fmt: skip


WEIRD_NAMES = [
    "\ud800", "a\udfffb", "\udc80\udc80", "\x00", "\x1b[31mred\x1b[0m", "tab\there", "line\nbreak",
    "\u2028sep\u2029", "\x85next", "\x7f", "<script>alert(1)</script>", "</script><b>x</b>",
    "&amp;&lt;", "'\"quotes\"'", "\u202eevil", "😀 emoji", "", " ", "x" * 10_000, "é" * 300,
    "a/b\\c", "{\"json\": 1}", "%s%n", "root",
]  # fmt: skip


def gen_names(rng: random.Random) -> Iterator[Case]:
    for name in WEIRD_NAMES:
        label = repr(name)[:40]
        escaped = json.dumps(name)  # \\ud800 stays an escape, as a JSON writer would put it
        timers = json.dumps(base_timers()).replace('"update"', escaped, 1)
        yield Case("names", f"timers block {label}", [["report", IN], ["report", IN, "--html", OUT_HTML], ["diff", IN, IN], ["import", IN, "--output", OUT_JSONL]], timers.encode(), ok=True)  # fmt: skip
        doc = spans_doc()
        all_spans(doc)[2]["name"] = "@@NAME@@"
        spans = json.dumps(doc).replace('"@@NAME@@"', escaped)
        yield Case("names", f"span {label}", [["tree", IN, "-o", OUT_JSON], ["report", IN, "--html", OUT_HTML], ["report", IN]], (spans + "\n").encode(), ok=True)  # fmt: skip
        gauge = json.dumps(base_timers()).replace('"reward"', escaped, 1)
        yield Case("names", f"gauge {label}", [["report", IN], ["report", IN, "--html", OUT_HTML]], gauge.encode(), ok=True)  # fmt: skip
        meta = json.dumps(base_timers()).replace('"fuzz"', escaped, 1)
        yield Case("names", f"metadata value {label}", [["report", IN, "--html", OUT_HTML], ["import", IN, "--output", OUT_JSONL]], meta.encode(), ok=True)  # fmt: skip


def gen_ids(rng: random.Random) -> Iterator[Case]:
    for i in range(60):
        key = rng.choice(["traceId", "spanId", "parentSpanId"])
        size = 16 if key == "traceId" else 8
        value = rng.choice([
            "".join(rng.choice("0123456789abcdef") for _ in range(rng.choice([1, 2 * size - 1, 2 * size + 2, 40]))),
            "".join(rng.choice("ghijklmnopqrstuvwxyz") for _ in range(2 * size)),
            rng.randrange(1, 2**64), [rng.randrange(10)], "=" * 24, "AAAA" * 2, "-" + "1" * (2 * size - 1),
        ])  # fmt: skip
        if key != "parentSpanId" and value == "":
            continue
        doc = spans_doc()
        all_spans(doc)[rng.randrange(5)][key] = value
        yield Case("bad ids", f"#{i} {key} = {value!r:.50}", list(SPANS_COMMANDS), dumps(doc))
    for key in ("traceId", "spanId"):
        doc = spans_doc()
        all_spans(doc)[1][key] = "0" * (32 if key == "traceId" else 16)
        yield Case("bad ids", f"all-zero {key}", list(SPANS_COMMANDS), dumps(doc))


def gen_cycles(rng: random.Random) -> Iterator[Case]:
    for i in range(40):
        doc = spans_doc()
        spans = all_spans(doc)
        blocks = [s for s in spans if s["name"] not in ("run", "process rollout")]
        length = rng.randrange(1, len(blocks) + 1)
        ring = rng.sample(blocks, length)
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            a["parentSpanId"] = b["spanId"]  # a -> b -> ... -> a
        yield Case("parent cycles", f"#{i} a cycle of {length}", [["tree", IN, "-o", OUT_JSON], ["report", IN], ["diff", GOOD, IN]], dumps(doc))  # fmt: skip


def gen_special_paths(rng: random.Random) -> Iterator[Case]:
    commands = [
        ["report", IN], ["tree", IN], ["tree", IN, "-o", OUT_JSON], ["diff", IN, GOOD],
        ["diff", GOOD, IN], ["import", IN, "--output", OUT_JSONL],
        ["replay", IN, "--endpoint", NOWHERE], ["report", IN, "--html", OUT_HTML],
    ]  # fmt: skip
    for special in ("dir", "fifo", "device", "missing", "socket", "dangling", "fifo-link", "nul"):
        yield Case("special files", special, list(commands), special=special)
    # Outputs that are not files.
    for target in ("{dir}", "/dev/null", "{fifo}", "", "{dir}/new/"):
        for cmd in (["tree", GOOD.replace("good", "spans"), "-o", target], ["report", GOOD, "--html", target], ["import", GOOD, "--output", target]):  # fmt: skip
            yield Case("special files", f"output to {target}: {cmd[0]}", [cmd], special="outputs")


def gen_urls(rng: random.Random) -> Iterator[Case]:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    for url in ("not a url", "http://[::1", "ftp://example.com", "http://", "://x", "http://h:99999",
                "http://h:abc", "http://a b", "javascript:alert(1)", "http://h\x00", "localhost:16686",
                "http://h/\x01x", "file:///etc/passwd", "x" * 5000, "http://[::1]:0x50"):  # fmt: skip
        for option in ("--jaeger", "--tempo"):
            yield Case("bad URLs", f"{option} {url!r:.40}", [["tree", option, url, "--trace-id", trace]])  # fmt: skip
    for trace_id in ("xyz", "0" * 32, "a" * 33, "", " ", "-1", "0x", "g" * 32):
        yield Case("bad URLs", f"--trace-id {trace_id!r}", [["tree", "--jaeger", NOWHERE, "--trace-id", trace_id]])  # fmt: skip
    for timeout in ("nan", "inf", "-1", "0", "x", "1e400"):
        yield Case("bad URLs", f"--timeout {timeout}", [["tree", "--jaeger", NOWHERE, "--trace-id", trace, "--timeout", timeout]])  # fmt: skip
    yield Case("bad URLs", "unreachable Jaeger", [["tree", "--jaeger", NOWHERE, "--trace-id", trace, "--timeout", "2"]])  # fmt: skip
    for endpoint in ("not a url", "http://[::1", "ftp://x:1", "http://", "grpc://h:1", ""):
        yield Case("bad URLs", f"replay --endpoint {endpoint!r}", [["replay", GOOD, "--endpoint", endpoint]], special="outputs")  # fmt: skip
    for header in ("novalue", "=v", ""):
        yield Case("bad URLs", f"replay --header {header!r}", [["replay", GOOD, "--endpoint", NOWHERE, "--header", header]], special="outputs")  # fmt: skip


def gen_options(rng: random.Random) -> Iterator[Case]:
    argvs = [
        ["bogus"], ["--bogus"], ["report"], ["report", "--nope", GOOD], ["tree"], ["tree", GOOD, "--jaeger", NOWHERE],
        ["diff", GOOD], ["diff", GOOD, GOOD, "--threshold", "nan"], ["diff", GOOD, GOOD, "--threshold", "-1"],
        ["diff", GOOD, GOOD, "--min-seconds", "inf"], ["diff", GOOD, GOOD, "--limit", "0"],
        ["import", GOOD], ["import", GOOD, "--output", OUT_JSONL, "--service-name", " "],
        ["demo", "--workers", "0"], ["demo", "--workers", "1000"], ["demo", "--steps", "0"],
        ["demo", "--seed", "-1"], ["demo", "--run-id", ".."], ["demo", "--run-id", ""],
        ["demo", "--run-id", "a/b"], ["demo", "--checkpoint-interval", "0"], ["demo", "--workers", "x"],
        ["demo", "--spans", "some"], ["demo", "--run-id", "x" * 300], ["run"],
        ["run", "--", "no-such-command-xyz"], ["run", "--output", GOOD, "--", "true"],
        ["run", "--output", "/dev/null", "--", "true"],
    ]  # fmt: skip
    for argv in argvs:
        yield Case("bad options", " ".join(argv), [argv], special="outputs")


#: Malformed environment values; the demo must warn once naming each and carry on (exit 0).
BAD_ENV = {
    "TRACEPARENT": "garbage", "OTEL_RL_SPANS": "bogus", "OTEL_RL_SPAN_BUDGET": "-5",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "abc", "OTEL_SDK_DISABLED": "maybe",
    "OTEL_RESOURCE_ATTRIBUTES": "novalue", "OTEL_BSP_SCHEDULE_DELAY": "inf",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "pigeon", "OTEL_RL_WORKER_INDEX": "x",
    "OTEL_RL_FLUSH_INTERVAL": "nan", "OTEL_RL_MAX_BUFFER": "1e99", "OTEL_RL_CONTEXT": "{oops",
}  # fmt: skip


def gen_env(rng: random.Random) -> Iterator[Case]:
    # The offline commands read no telemetry settings: bad values change nothing there.
    for name, value in BAD_ENV.items():
        yield Case("bad env values", f"{name}={value} + report", [["report", GOOD], ["tree", GOOD.replace("good", "spans"), "-o", OUT_JSON]], env={name: value}, special="outputs", ok=True)  # fmt: skip


def gen_answers(rng: random.Random) -> Iterator[Case]:
    """Jaeger's and Tempo's answers, hostile: the HTTP readers go through the same boundary."""
    doc = spans_doc()
    good = json.dumps({"result": doc})
    bad_id = spans_doc()
    all_spans(bad_id)[1]["spanId"] = "zz"
    cycle = spans_doc()
    a, b = all_spans(cycle)[1:3]
    a["parentSpanId"], b["parentSpanId"] = b["spanId"], a["spanId"]
    answers: list[tuple[str, int, bytes]] = [
        ("truncated", 200, good[: len(good) // 2].encode()),
        ("NaN", 200, good.replace('{"doubleValue": 1.5}', '{"doubleValue": NaN}').encode()),
        ("10,000 nested lists", 200, _nested(10_000, "[", "]").encode()),
        ("25,000 nested objects", 200, _nested(25_000, '{"a":', "}").encode()),
        ("5,000-digit number", 200, good.replace('"2"}', "9" * 5000 + "}", 1).encode()),
        ("a list", 200, b"[1, 2]"), ("a number", 200, b"5"), ("null", 200, b"null"),
        ("result not an object", 200, b'{"result": 5}'), ("empty body", 200, b""),
        ("an HTML page", 200, b"<html><body>502 Bad Gateway</body></html>"),
        ("not UTF-8", 200, b'{"result": "\xff\xfe"}'),
        ("a bad span id", 200, json.dumps({"result": bad_id}).encode()),
        ("a parent cycle", 200, json.dumps({"result": cycle}).encode()),
        ("HTTP 500 with a huge message", 500, json.dumps({"error": {"message": "x" * 10_000}}).encode()),
        ("HTTP 503, no body", 503, b""), ("HTTP 404", 404, b'{"error": {"message": "not found"}}'),
        ("HTTP 400, HTML", 400, b"<h1>bad</h1>\n" * 100),
        ("an error object with 200", 200, b'{"error": {"message": "trace too large\n\nretry"}}'),
        ("metrics, no spans", 200, b'{"resourceMetrics": []}'),
    ]  # fmt: skip
    for label, status, body in answers:
        for option in ("--jaeger", "--tempo"):
            yield Case("server answers", f"{option}: {label}", [["tree", option, "{server}", "--trace-id", TRACE, "-o", OUT_JSON], ["tree", option, "{server}", "--run-id", "run-7", "-o", OUT_JSON]], answer=(status, body), special="outputs")  # fmt: skip


def aggregate_line(payload: Any = None, raw: str | None = None, **overrides: Any) -> str:
    """One export request holding an aggregate span (what `tree` builds the tree from)."""
    from otel_rl._internal import aggregates

    if raw is None:
        payload = payload if payload is not None else {
            "local": [], "snapshots": [], "root_total": 2.0, "gauges": {}, "metadata": {}, "places": []
        }  # fmt: skip
        parts = aggregates.encode(payload)
        raw = parts[0]
    attrs = aggregates.span_attributes("main", 0, 0, 1, True, raw, "main")
    attrs.update(overrides)
    span = SpanData(TRACE, "00000000000000b1", "", aggregates.NAME, T0, T0 + 5, attrs,
                    {sc.SERVICE_NAME: "fuzz", sc.PROCESS_PID: 100})  # fmt: skip
    return request_to_json_line(encode_request([span])) + "\n"


def gen_aggregates(rng: random.Random) -> Iterator[Case]:
    """Files with aggregate spans take the streamed path; it checks as much as the other."""
    import base64
    import zlib

    commands = [["tree", IN, "-o", OUT_JSON], ["report", IN, "--html", OUT_HTML], ["diff", GOOD, IN]]
    good = aggregate_line()
    yield Case("aggregate spans", "a valid aggregate", [["tree", IN, "-o", OUT_JSON], ["report", IN, "--html", OUT_HTML]], good.encode(), ok=True)  # fmt: skip
    spans_line = json.dumps(spans_doc()) + "\n"
    for label, tail in (("a bad span id", spans_line.replace('"00000000000000a2"', '"zz"', 1)),
                        ("a cut last line", spans_line[:80]), ("NaN", spans_line.replace('"2"}', "NaN}", 1)),
                        ("a list", "[1]\n"), ("10,000 nested lists", _nested(10_000, "[", "]") + "\n"),
                        ("a 5,000-digit number", spans_line.replace('"2"}', "9" * 5000 + "}", 1))):  # fmt: skip
        yield Case("aggregate spans", f"aggregate, then {label}", commands, (good + tail).encode())
        yield Case("aggregate spans", f"{label}, then aggregate", commands, (tail.rstrip("\n") + "\n" + good).encode())  # fmt: skip

    def packed(text: bytes) -> str:
        return base64.b64encode(zlib.compress(text)).decode()

    payloads: list[tuple[str, str]] = [
        ("not base64", "@@@"), ("not zlib", base64.b64encode(b"plain").decode()),
        ("not JSON", packed(b"{oops")), ("a list", packed(b"[1, 2]")),
        ("empty object", packed(b"{}")), ("NaN total", packed(b'{"local": [], "snapshots": [], "root_total": NaN, "gauges": {}, "metadata": {}}')),
        ("huge total", packed(b'{"local": [], "snapshots": [], "root_total": 1e30, "gauges": {}, "metadata": {}}')),
        ("string total", packed(b'{"local": [], "snapshots": [], "root_total": "x", "gauges": {}, "metadata": {}}')),
        ("local not a list", packed(b'{"local": 5, "snapshots": [], "root_total": 1.0, "gauges": {}, "metadata": {}}')),
        ("snapshot not an object", packed(b'{"local": [], "snapshots": [5], "root_total": 1.0, "gauges": {}, "metadata": {}}')),
        ("local entry wrong", packed(b'{"local": [{"path": 5}], "snapshots": [], "root_total": 1.0, "gauges": {}, "metadata": {}}')),
        ("gauge a string", packed(b'{"local": [], "snapshots": [], "root_total": 1.0, "gauges": {"g": {"value": "x", "min": 1, "max": 1, "count": 1}}, "metadata": {}}')),
        ("gauge NaN", packed(b'{"local": [], "snapshots": [], "root_total": 1.0, "gauges": {"g": {"value": NaN, "min": 1, "max": 1, "count": 1}}, "metadata": {}}')),
        ("metadata a number", packed(b'{"local": [], "snapshots": [], "root_total": 1.0, "gauges": {}, "metadata": 5}')),
        ("20,000-deep JSON", packed(b"[" * 20_000 + b"]" * 20_000)),
        ("a 5,000-digit number", packed(b'{"local": [], "snapshots": [], "root_total": ' + b"9" * 5000 + b', "gauges": {}, "metadata": {}}')),
    ]  # fmt: skip
    for label, data in payloads:
        yield Case("aggregate spans", f"payload: {label}", commands, aggregate_line(raw=data).encode())
    for label, overrides in (("seq a string", {"otel_rl.aggregate.seq": "0"}), ("parts huge", {"otel_rl.aggregate.parts": 10**15}),
                             ("data a number", {"otel_rl.aggregate.data": 5}), ("final a string", {"otel_rl.aggregate.final": "yes"}),
                             ("part negative", {"otel_rl.aggregate.part": -1}), ("two parts, one sent", {"otel_rl.aggregate.parts": 2})):  # fmt: skip
        yield Case("aggregate spans", f"attribute: {label}", commands, aggregate_line(**overrides).encode())


GENERATORS = (
    gen_truncated, gen_random, gen_shapes, gen_wrong_types, gen_non_finite, gen_huge_numbers,
    gen_deep, gen_names, gen_ids, gen_cycles, gen_special_paths, gen_urls, gen_options, gen_env,
    gen_answers, gen_aggregates,
)  # fmt: skip


def build_cases() -> list[Case]:
    rng = random.Random(SEED)
    return [case for generator in GENERATORS for case in generator(rng)]


CASES = build_cases()
CATEGORIES = sorted({case.category for case in CASES})


# -- running and checking --------------------------------------------------------------------


def _make_input(case: Case, folder: Path) -> str:
    target = folder / "input.json"
    if case.content is not None:
        target.write_bytes(case.content)
        return str(target)
    special = case.special
    if special == "dir":
        target.mkdir()
    elif special in ("fifo", "fifo-link"):
        fifo = folder / "pipe"
        os.mkfifo(fifo)
        if special == "fifo":
            return str(fifo)
        target.symlink_to(fifo)
    elif special == "device":
        return "/dev/null"
    elif special == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(folder / "sock"))
        sock.close()
        return str(folder / "sock")
    elif special == "dangling":
        target.symlink_to(folder / "nowhere")
    elif special == "nul":
        return str(target) + "\x00x"
    return str(target)


def _good_inputs(folder: Path) -> tuple[str, str]:
    good = folder / "good.json"
    good.write_text(json.dumps(base_timers()), encoding="utf-8")
    spans = folder / "spans.json"
    spans.write_text(request_to_json_line(encode_request(base_spans())) + "\n", encoding="utf-8")
    return str(good), str(spans)


@dataclass
class Result:
    argv: list[str]
    code: int
    out: str
    err: str
    seconds: float


def invoke(argv: list[str]) -> Result:
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return Result(argv, code, out.getvalue(), err.getvalue(), time.perf_counter() - started)


def check(case: Case, result: Result, outputs: dict[str, Path], folder: Path) -> str | None:
    """The broken part of the contract, or None."""
    if result.seconds > MAX_SECONDS:
        return f"took {result.seconds:.1f} s"
    if "Traceback" in result.err or result.code == EXIT_INTERNAL:
        return f"traceback or internal error: {result.err.strip()[-300:]}"
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    if leftovers:
        return f"temporary files left: {leftovers}"
    written = {name: path for name, path in outputs.items() if path.exists()}
    for name, path in written.items():
        if name in (OUT_JSON, OUT_JSONL):
            try:
                parse_json(path.read_text(encoding="utf-8"), name)  # strict: no NaN/Infinity
            except Exception as exc:
                return f"{name} is not strict JSON: {exc}"
    if case.ok:
        if result.code != 0:
            return f"valid input refused with {result.code}: {result.err.strip()}"
        return None
    if result.code == 0:
        return "bad input accepted (exit 0)"
    if result.code == 1:
        return "exit 1 (diff's regression code) for bad input"
    lines = result.err.splitlines()
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr: {result.err[:300]!r}"
    if len(lines[0]) > 200 or not lines[0].startswith("otel-rl"):
        return f"bad error line ({len(lines[0])} chars): {lines[0][:120]!r}"
    if result.code == 3:  # partial: written whole, and marked so
        for path in written.values():
            if path.suffix == ".json" and json.loads(path.read_text()).get("complete") is not False:
                return "a partial tree not marked complete: false"
        return None
    if written:
        return f"output written although the command failed: {sorted(written)}"
    if result.out:
        return f"stdout not empty: {result.out[:100]!r}"
    return None


class _Backend:
    """A loopback HTTP server that gives every GET the answer of the case being run."""

    def __init__(self) -> None:
        import http.server
        import threading

        backend = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = backend.answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.answer: tuple[int, bytes] = (404, b"")
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def backend() -> Iterator[_Backend]:
    server = _Backend()
    yield server
    server.close()


def run_case(
    case: Case, folder: Path, monkeypatch: pytest.MonkeyPatch, backend: _Backend
) -> list[tuple[Result, str]]:
    folder.mkdir()
    good, good_spans = _good_inputs(folder)
    path = _make_input(case, folder)
    outputs = {name: folder / name.strip("{}") for name in OUTPUTS}
    failures = []
    if case.answer is not None:
        backend.answer = case.answer
    with monkeypatch.context() as patch:
        for name, value in case.env.items():
            patch.setenv(name, value)
        for command in case.commands:
            argv = [
                str(outputs[a]) if a in outputs
                else a.replace(IN, path).replace("{good}", good).replace("{spans}", good_spans)
                .replace("{dir}", str(folder)).replace("{fifo}", str(folder / "out-pipe"))
                .replace("{server}", backend.url)
                for a in command
            ]  # fmt: skip
            if "{fifo}" in " ".join(command) and not (folder / "out-pipe").exists():
                os.mkfifo(folder / "out-pipe")
            result = invoke(argv)
            problem = check(case, result, outputs, folder)
            if problem is not None:
                failures.append((result, problem))
            for output in outputs.values():
                if output.is_file():
                    output.unlink()
    return failures


def test_the_fuzz_covers_every_category_with_over_a_thousand_cases() -> None:
    counts = Counter(case.category for case in CASES)
    assert sum(counts.values()) >= 1000, counts
    assert set(counts) == {
        "truncated", "random", "wrong shapes", "wrong types: timers.json", "wrong types: spans",
        "NaN/Infinity", "huge numbers", "deep nesting", "names", "bad ids", "parent cycles",
        "special files", "bad URLs", "bad options", "bad env values", "server answers",
        "aggregate spans",
    }  # fmt: skip
    assert all(n >= 10 for n in counts.values()), counts
    assert build_cases() == CASES  # seeded: the same cases every run


@pytest.mark.parametrize("category", CATEGORIES)
def test_hostile_input_gets_one_short_line_and_a_non_zero_exit(
    category: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: _Backend
) -> None:
    cases = [case for case in CASES if case.category == category]
    failures: list[str] = []
    invocations = 0
    for i, case in enumerate(cases):
        for result, problem in run_case(case, tmp_path / f"case{i}", monkeypatch, backend):
            failures.append(f"{case.what!r}: {' '.join(result.argv)[:150]!r}: {problem}")
        invocations += len(case.commands)
    assert not failures, f"{len(failures)} of {invocations} invocations broke the contract:\n" + "\n".join(failures[:15])  # fmt: skip


# -- the same, as a user sees it: real processes and a real terminal's streams ---------------


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "otel_rl", *args],
        capture_output=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_no_traceback_reaches_a_terminal(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text(_nested(10_000, "[", "]"))
    huge = tmp_path / "huge.json"
    huge.write_text('{"name": "root", "total": ' + "9" * 5000 + ', "count": 1}')
    surrogate = tmp_path / "names.json"
    surrogate.write_text(json.dumps(base_timers()).replace('"update"', '"\\ud800<b>\\u001b[31m"'))
    runs = [
        (["report", str(fifo)], 4),
        (["tree", str(deep)], 4),
        (["diff", str(huge), str(huge)], 4),
        (["tree", "--jaeger", "http://[::1", "--trace-id", "1" * 32], 2),
        (["import", str(tmp_path), "--output", str(tmp_path / "o.jsonl")], 4),
        (["frobnicate"], 2),
    ]
    for args, code in runs:
        started = time.monotonic()
        done = _run(args, tmp_path)
        assert time.monotonic() - started < MAX_SECONDS
        err = done.stderr.decode("utf-8", "replace")
        assert done.returncode == code, (args, err)
        assert "Traceback" not in err and len(err.splitlines()) == 1 and len(err) <= 201, (args, err)
        assert done.stdout == b""
    # A name with a lone surrogate and control characters prints (escaped) to a real pipe.
    done = _run(["report", str(surrogate), "--html", str(tmp_path / "r.html")], tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr and (tmp_path / "r.html").is_file()
    assert "\ufffd<b>\\x1b[31m" in done.stdout.decode("utf-8")


def test_malformed_environment_values_warn_once_each_through_the_demo(tmp_path: Path) -> None:
    done = _run(["demo", "--output", str(tmp_path), "--steps", "2000", "--workers", "1", "--quiet"],
                tmp_path, {**BAD_ENV, "TRACEPARENT": f"00-{TRACE}-00f067aa0ba902b7-01"})  # fmt: skip
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, err
    assert "Traceback" not in err
    for name in BAD_ENV:
        if name == "TRACEPARENT":
            continue  # here a valid one, so that the malformed OTEL_RL_CONTEXT is read
        assert sum(name in line for line in err.splitlines()) == 1, (name, err)
