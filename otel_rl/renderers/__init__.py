"""Renderers: pure functions from the tree model to text, one format per module.

Each renderer returns a string and does no I/O; the CLI picks one by name or by the output
file's extension and writes the result. Modules are imported only when their format is asked
for, so ``otel-rl report`` never pays for the HTML template when it prints text.

Example::

    from otel_rl.renderers import get_renderer, renderer_for_path
    text = get_renderer("text")(tree)
    page = get_renderer(renderer_for_path("out/report.html"))(tree, spans)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from otel_rl._internal.errors import UserError

__all__ = ["EXTENSIONS", "RENDERERS", "get_renderer", "renderer_for_path"]

#: name -> (module, function, one-line description).
RENDERERS: dict[str, tuple[str, str, str]] = {
    "text": ("otel_rl.renderers.treeview", "render", "tree view (total, self, count, % parent)"),
    "workers": (
        "otel_rl.renderers.crossworker",
        "render",
        "workers of a role merged: min/mean/max",
    ),
    "html": ("otel_rl.renderers.html", "render", "self-contained HTML: icicle, timeline, tables"),
    "json": ("otel_rl.renderers", "_render_json", "timers.json (ML-Agents' schema)"),
}

#: Output file extension -> renderer name.
EXTENSIONS: dict[str, str] = {
    ".txt": "text",
    ".text": "text",
    ".html": "html",
    ".htm": "html",
    ".json": "json",
}


def _render_json(tree: Any, *_args: Any, **_kwargs: Any) -> str:
    """The tree as ``timers.json`` text."""
    return str(tree.to_json()) + "\n"


def get_renderer(name: str) -> Callable[..., str]:
    """The render function registered as `name`; an unknown name is a `UserError`."""
    try:
        module_name, function, _ = RENDERERS[name]
    except KeyError:
        known = ", ".join(sorted(RENDERERS))
        raise UserError(f"unknown report format {name!r} (known: {known})") from None
    renderer: Callable[..., str] = getattr(importlib.import_module(module_name), function)
    return renderer


def renderer_for_path(path: str | PurePath) -> str:
    """The renderer name for an output file, by its extension (``report.html`` -> ``html``)."""
    suffix = PurePath(path).suffix.lower()
    try:
        return EXTENSIONS[suffix]
    except KeyError:
        known = ", ".join(sorted(EXTENSIONS))
        raise UserError(
            f"cannot tell the report format from {str(path)!r} (use one of {known})"
        ) from None
