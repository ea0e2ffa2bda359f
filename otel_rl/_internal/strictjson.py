"""Strict, deep-safe JSON for input (the JSON half of `readers.boundary`, which holds the
file half): no ``NaN``/``Infinity``, numbers of at most `Limits.max_number_chars` characters,
finite floats, at most `Limits.max_depth` levels whatever the interpreter's C parser allows
(deeper documents are parsed by an explicit-stack parser), lone surrogates replaced by U+FFFD.
Errors are one-line `UserError`s naming the source.

A leaf beside the tree model: `Tree.from_json` parses timers.json text with it, so the model
imports no reader.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

from otel_rl._internal.errors import UserError
from otel_rl._internal.jsonout import nested_deeper_than

__all__ = [
    "DEFAULT_LIMITS",
    "JSONInputError",
    "Limits",
    "clean_text",
    "decode_text",
    "describe_size",
    "parse_json",
    "parse_json_values",
]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What one command reads at most. The defaults fit any real run with a wide margin."""

    #: Bytes of input per file, after decompression.
    max_file_bytes: int = 4096 * _MIB
    #: Bytes of one JSON document (a whole saved answer, or one line of a spans file).
    max_document_bytes: int = 1024 * _MIB
    #: JSON nesting levels. A timers.json takes two per tree level: 20,064 levels keep a tree
    #: 10,000 blocks deep readable, with room for the levels around its root.
    max_depth: int = 20_064
    #: Characters of one JSON number (the 20 digits of a 64-bit integer, with room to spare).
    max_number_chars: int = 64
    #: Spans in one input.
    max_spans: int = 20_000_000
    #: Nesting of one attribute value (OTLP ``arrayValue``/``kvlistValue`` inside each other).
    max_value_depth: int = 64


DEFAULT_LIMITS = Limits()

def describe_size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", _MIB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def decode_text(raw: bytes, source: str) -> str:
    """`raw` as UTF-8 text (a leading BOM dropped); anything else is a one-line `UserError`."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{source}: not UTF-8 text (byte {exc.start})") from None


# -- JSON --------------------------------------------------------------------------------


class JSONInputError(UserError):
    """Text that is not JSON; `at_end` when it is only cut short (a file still being written)."""

    def __init__(self, message: str, at_end: bool = False) -> None:
        super().__init__(message)
        self.at_end = at_end


def _syntax_error(source: str, text: str, exc: json.JSONDecodeError) -> JSONInputError:
    where = f"{source} line {exc.lineno}" if "\n" in text.rstrip() else source
    return JSONInputError(
        f"{where}: invalid JSON ({exc.msg} at column {exc.colno})",
        at_end=exc.pos >= len(text.rstrip()),
    )


class _JSONValueError(ValueError):
    """A JSON value this boundary refuses (raised inside the parser's hooks)."""


def _refuse_constant(name: str) -> Any:
    raise _JSONValueError(f"{name} is not valid JSON (not a number)")


def _make_number_hooks(limits: Limits) -> tuple[Any, Any]:
    def parse_int(text: str) -> int:
        if len(text) > limits.max_number_chars:
            raise _JSONValueError(
                f"a number with {len(text.lstrip('-'))} digits "
                f"(at most {limits.max_number_chars} characters)"
            )
        return int(text)

    def parse_float(text: str) -> float:
        if len(text) > limits.max_number_chars:
            raise _JSONValueError(
                f"a number written with {len(text)} characters "
                f"(at most {limits.max_number_chars})"
            )
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise _JSONValueError(f"the number {text} is out of range")
        return value

    return parse_int, parse_float


_DECODERS: dict[Limits, json.JSONDecoder] = {}
#: The C-accelerated string scanner of the standard json module (typeshed omits it).
_scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009


def _decoder(limits: Limits) -> json.JSONDecoder:
    decoder = _DECODERS.get(limits)
    if decoder is None:
        parse_int, parse_float = _make_number_hooks(limits)
        decoder = _DECODERS[limits] = json.JSONDecoder(
            parse_int=parse_int, parse_float=parse_float, parse_constant=_refuse_constant
        )
    return decoder


#: An escaped UTF-16 surrogate: the only way a JSON text can produce one.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with lone surrogates (unencodable anywhere) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def parse_json(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """One JSON document, strictly (see the module docstring); errors name `source`."""
    if len(text) > limits.max_document_bytes:
        raise UserError(
            f"{source}: a JSON document longer than {describe_size(limits.max_document_bytes)}"
        )
    try:
        try:
            value = _decoder(limits).decode(text)
        except RecursionError:
            # Deeper than the C parser may recurse: parse it again, iteratively.
            value = _parse_deep(text, limits)
        else:
            _check_depth(value, text, limits)
    except json.JSONDecodeError as exc:
        raise _syntax_error(source, text, exc) from None
    except _JSONValueError as exc:
        raise UserError(f"{source}: {exc}") from None
    if _ESCAPED_SURROGATE.search(text):
        value = _clean_strings(value)
    return value


def _check_depth(value: Any, text: str, limits: Limits) -> None:
    """Refuse a document the C parser accepted but that is nested deeper than the limit.

    Measured only when it could be: more openers than the limit, on an interpreter whose C
    parser recurses deeper than the limit (none of 3.10-3.13 at the default 20,000)."""
    if (text.count("{") + text.count("[") > limits.max_depth
            and not _c_parser_stops_within(limits.max_depth, sys.getrecursionlimit())
            and nested_deeper_than(value, limits.max_depth)):
        raise _JSONValueError(f"nested deeper than {limits.max_depth:,} levels")


@functools.cache
def _c_parser_stops_within(depth: int, recursion_limit: int) -> bool:
    """Whether the C parser gives up (`RecursionError`) on `depth` + 1 levels even when called
    from a shallow stack; then it can never return a value nested deeper than `depth`.
    (`recursion_limit` is part of the key: up to 3.11 the parser's limit follows it.)"""
    try:
        json.loads("[" * (depth + 1) + "]" * (depth + 1))
    except RecursionError:
        return True
    return False


def _clean_strings(value: Any) -> Any:
    """`value` with every string (keys too) passed through `clean_text`, iteratively."""
    if isinstance(value, str):
        return clean_text(value)
    if not isinstance(value, (dict, list)):
        return value
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            for i, child in enumerate(item):
                if isinstance(child, str):
                    item[i] = clean_text(child)
                elif isinstance(child, (dict, list)):
                    todo.append(child)
        else:
            for key in list(item):
                child = item[key]
                if isinstance(child, str):
                    child = clean_text(child)
                elif isinstance(child, (dict, list)):
                    todo.append(child)
                clean_key = clean_text(key)
                if clean_key != key:
                    del item[key]
                item[clean_key] = child
    return value


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_CONSTANTS = ("NaN", "Infinity", "-Infinity")


def _error(message: str, text: str, pos: int) -> json.JSONDecodeError:
    return json.JSONDecodeError(message, text, pos)


def _parse_deep(text: str, limits: Limits, start: int = 0, *, raw: bool = False) -> Any:
    """A JSON document parsed with an explicit stack instead of recursion.

    Only used when the C parser runs out of recursion; strings go through the C-accelerated
    ``scanstring`` and numbers through the same hooks, so it accepts exactly what it does.
    `raw`: like ``raw_decode``, the value at `start` and where it ends (text may follow).
    """
    parse_int, parse_float = _make_number_hooks(limits)
    stack: list[Any] = []
    keys: list[Any] = []
    end = len(text)

    def key_at(pos: int) -> tuple[str, int]:
        if text[pos : pos + 1] != '"':
            raise _error("Expecting property name enclosed in double quotes", text, pos)
        key, pos = _scanstring(text, pos + 1, True)
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if text[pos : pos + 1] != ":":
            raise _error("Expecting ':' delimiter", text, pos)
        return key, _WS.match(text, pos + 1).end()  # type: ignore[union-attr]

    pos = _WS.match(text, start).end()  # type: ignore[union-attr]
    while True:
        char = text[pos : pos + 1]
        value: Any
        if char in ("{", "["):
            if len(stack) >= limits.max_depth:
                raise _JSONValueError(f"nested deeper than {limits.max_depth:,} levels")
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            closer = "}" if char == "{" else "]"
            if text[pos : pos + 1] == closer:
                value = {} if char == "{" else []
                pos += 1
            else:
                if char == "{":
                    stack.append({})
                    key, pos = key_at(pos)
                    keys.append(key)
                else:
                    stack.append([])
                    keys.append(None)
                continue
        elif char == '"':
            value, pos = _scanstring(text, pos + 1, True)
        else:
            match = _NUMBER.match(text, pos)
            if match is not None:
                number = match.group()
                value = (
                    parse_float(number) if match.group(1) or match.group(2) else parse_int(number)
                )
                pos = match.end()
            else:
                for word, literal in _LITERALS.items():
                    if text.startswith(word, pos):
                        value = literal
                        pos += len(word)
                        break
                else:
                    for word in _CONSTANTS:
                        if text.startswith(word, pos):
                            _refuse_constant(word)
                    raise _error("Expecting value", text, pos)
        # A value is complete: put it into its container, closing containers as they end.
        while True:
            if raw and not stack:
                return value, pos
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if not stack:
                if pos != end:
                    raise _error("Extra data", text, pos)
                return value
            top = stack[-1]
            if isinstance(top, list):
                top.append(value)
            else:
                top[keys[-1]] = value
            char = text[pos : pos + 1]
            if char == ",":
                pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                if isinstance(top, dict):
                    keys[-1], pos = key_at(pos)
                break
            closer = "]" if isinstance(top, list) else "}"
            if char != closer:
                raise _error(f"Expecting ',' delimiter or '{closer}'", text, pos)
            pos += 1
            value = stack.pop()
            keys.pop()


def parse_json_values(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """The JSON values in `text`, one after another (some servers concatenate answers)."""
    decoder = _decoder(limits)
    values = []
    pos = 0
    end = len(text)
    while True:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= end:
            break
        try:
            try:
                value, end_of_value = decoder.raw_decode(text, pos)
            except RecursionError:
                value, end_of_value = _parse_deep(text, limits, pos, raw=True)
            else:
                _check_depth(value, text[pos:end_of_value], limits)
            pos = end_of_value
        except json.JSONDecodeError as exc:
            raise _syntax_error(source, text, exc) from None
        except _JSONValueError as exc:
            raise UserError(f"{source}: {exc}") from None
        values.append(value)
    if _ESCAPED_SURROGATE.search(text):
        values = [_clean_strings(value) for value in values]
    return values
