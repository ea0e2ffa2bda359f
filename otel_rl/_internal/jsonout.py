"""JSON text out: strict (no NaN/Infinity, which JSON does not have) and deep-safe.

`dumps` is ``json.dumps(..., allow_nan=False)``, byte for byte, for values nested at most
`MAX_INDENT_LEVEL` levels. Deeper, an explicit-stack encoder writes the same format, except
that indentation stops growing past `MAX_INDENT_LEVEL` (a tree 5,000 blocks deep would otherwise
be hundreds of megabytes of spaces, the size quadratic in the depth). The depth is measured,
not learnt from a `RecursionError`: how deep the standard encoder may recurse depends on the
interpreter (Python 3.13 indents 6,000 levels without complaint: 72 MB). A `RecursionError` of
the unindented encoder still falls back to the explicit stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MAX_INDENT_LEVEL", "dumps", "nested_deeper_than"]

MAX_INDENT_LEVEL = 64


def dumps(
    value: Any,
    *,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    ensure_ascii: bool = True,
    allow_nan: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """`value` as strict JSON text, formatted as `json.dumps` formats it.

    Raises `ValueError` for NaN or infinity, as ``json.dumps(allow_nan=False)`` does (unless
    `allow_nan`); `default` turns other objects into JSON values, as for `json.dumps`.
    Indented text of a value nested deeper than `MAX_INDENT_LEVEL` always comes from the
    explicit-stack encoder, so its size stays linear in the depth (even when a raised
    recursion limit would let `json.dumps` indent every level).
    """
    if indent is not None and nested_deeper_than(value, MAX_INDENT_LEVEL):
        return _dumps_deep(value, indent, separators, ensure_ascii, allow_nan, default)
    try:
        return json.dumps(value, indent=indent, separators=separators,
                          ensure_ascii=ensure_ascii, allow_nan=allow_nan, default=default)
    except RecursionError:
        return _dumps_deep(value, indent, separators, ensure_ascii, allow_nan, default)


def nested_deeper_than(value: Any, levels: int) -> bool:
    """Whether `value` holds containers (dicts, lists, tuples; empty ones too) nested more than
    `levels` deep, found with an explicit stack (no recursion, so any depth is fine)."""
    containers = (dict, list, tuple)
    if not isinstance(value, containers):
        return False
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > levels:
            return True
        children = item.values() if isinstance(item, dict) else item
        todo.extend((child, depth + 1) for child in children if isinstance(child, containers))
    return False


def _dumps_deep(
    value: Any, indent: int | None, separators: tuple[str, str] | None, ensure_ascii: bool,
    allow_nan: bool = False, default: Callable[[Any], Any] | None = None,
) -> str:
    if separators is None:
        separators = (",", ": ") if indent is not None else (", ", ": ")
    item_sep, key_sep = separators
    pad = " " * indent if indent is not None else None

    def scalar(item: Any) -> str:
        return json.dumps(item, ensure_ascii=ensure_ascii, allow_nan=allow_nan)

    parts: list[str] = []
    # (items of an open container, whether it is an object, its level, whether one was written)
    stack: list[tuple[Iterator[Any], bool, int, list[bool]]] = []

    def write(item: Any, level: int) -> None:
        if default is not None and not isinstance(item, _JSON_TYPES):
            item = default(item)
        if isinstance(item, dict):
            if not item:
                parts.append("{}")
                return
            parts.append("{")
            stack.append((iter(item.items()), True, level, [False]))
        elif isinstance(item, (list, tuple)):
            if not item:
                parts.append("[]")
                return
            parts.append("[")
            stack.append((iter(item), False, level, [False]))
        else:
            parts.append(scalar(item))

    write(value, 0)
    while stack:
        items, is_object, level, started = stack[-1]
        item: Any = next(items, _END)
        if item is _END:
            stack.pop()
            if pad is not None and level < MAX_INDENT_LEVEL:
                parts.append("\n" + pad * level)
            parts.append("}" if is_object else "]")
            continue
        if started[0]:
            parts.append(item_sep)
        started[0] = True
        if pad is not None and level < MAX_INDENT_LEVEL:
            parts.append("\n" + pad * (level + 1))
        if is_object:
            key, item = item
            parts.append(scalar(key if isinstance(key, str) else _key_text(key)) + key_sep)
        write(item, level + 1)
    return "".join(parts)


def _key_text(key: Any) -> str:
    # json.dumps turns non-string keys into strings this way.
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    return str(key) if isinstance(key, int) else repr(float(key))


_END = object()
_JSON_TYPES = (dict, list, tuple, str, int, float, bool, type(None))
