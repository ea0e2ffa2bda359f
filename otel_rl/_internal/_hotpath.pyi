"""The optional compiled hot path (`_hotpath.c`); see `otel_rl._internal.accel`."""

from collections.abc import Callable
from typing import Any

def install(timer: type, stack: type, node: type, trace: type, namespace: dict[str, Any],
            init: Callable[..., None], enter: Callable[..., Any],
            tallied_enter: Callable[..., Any], exit: Callable[..., None], /,
            ) -> dict[Any, Any]:
    """The compiled `__init__`, `__enter__`, tallied `__enter__` and `__exit__` of `timer`, by
    the pure functions they stand for; they read the recorder's globals from `namespace`."""
