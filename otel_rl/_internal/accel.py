"""Which hot path times blocks: the optional compiled one or pure Python.

``otel_rl/_internal/_hotpath.c`` implements `hierarchical_timer.__init__/__enter__/__exit__`
(and the tallied `__enter__`) statement for statement as `recorder` does in Python. It is built
by ``pip install`` when a C compiler is there (setup.py, an optional extension) or in place by
``scripts/build_accel.py``; where it is not built, or the ``accelerator`` setting is false
(``OTEL_RL_ACCELERATOR=false``), blocks run the pure-Python code. `recorder.use_accelerator`
switches; `describe` says which path is in use and why (``otel-rl --version``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from otel_rl._internal import config


def compiled(name: str = "_hotpath") -> ModuleType | None:
    """The compiled module `name` (the hot path's by default; ``_metricsacc``,
    ``_relaycols``, ``_timingacc``), or None where it was not built (or does not load)."""
    try:
        return importlib.import_module(f"otel_rl._internal.{name}")
    except ImportError:
        return None


def wanted() -> bool:
    """The ``accelerator`` setting as the environment gives it (default true)."""
    value = config.from_environment("accelerator", os.environ)
    return True if value is None else bool(value)


def chosen() -> bool:
    """Whether a process started now runs the compiled hot path (what `recorder` picks at
    import, before any `configure(accelerator=...)`)."""
    return wanted() and compiled() is not None


def describe(active: bool, name: str = "_hotpath", what: str = "hot path") -> str:
    """One line: the path in use and why (the hot path's; `name` and `what`: another compiled
    module's, e.g. ``_timingacc``, "Timing")."""
    if active:
        return f"compiled (otel_rl._internal.{name})"
    if compiled(name) is None:
        return f"pure Python (the compiled {what} is not built)"
    return "pure Python (the accelerator setting is off)"
