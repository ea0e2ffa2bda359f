"""The optional compiled hot path (`_hotpath.c`); see `otel_rl._internal.accel`."""

from collections.abc import Callable
from typing import Any

def install(timer: type, stack: type, node: type, trace: type, namespace: dict[str, Any],
            init: Callable[..., None], enter: Callable[..., Any],
            tallied_enter: Callable[..., Any], exit: Callable[..., None], /,
            ) -> dict[Any, Any]:
    """The compiled `__init__`, `__enter__`, tallied `__enter__` and `__exit__` of `timer`, by
    the pure functions they stand for; they read the recorder's globals from `namespace`."""

def install_rllib(stats: type, enter: Callable[..., Any], exit: Callable[..., Any],
                  pure_exit: Callable[..., Any], timer: type, local: Any, ended: object,
                  end: Callable[..., None], fail: Callable[[str, BaseException], None], /,
                  ) -> tuple[Any, Any]:
    """The compiled `__enter__` and `__exit__` of RLlib's stats class `stats` (`rllib.py`'s
    glue around RLlib's own `enter` and `exit`), as a pair of its method descriptors; the
    class keeps what they work with as ``_otel_rl_glue``."""

def rllib_stats(base_globals: dict[str, Any], ema_globals: dict[str, Any],
                ema_push: Callable[..., Any], enter: Callable[..., Any],
                exit: Callable[..., Any], tf: object, safe_isnan: Callable[[Any], Any], /,
                ) -> tuple[Callable[[Any], Any], Callable[..., None]]:
    """RLlib 2.60's own `StatsBase.__enter__` and `__exit__` (`EmaStats.push` inlined for a
    float), compiled, as a pair of functions of the stats object; what they do not cover goes
    to RLlib's `enter` / `exit`, before anything changes (`rllib.compiled_own`)."""
def rllib_log_time(logger: type, own: Callable[..., Any], globals: dict[str, Any], tree: Any,
                   flatten: Callable[[Any], Any], force_tuple: Callable[[Any], Any],
                   maybe_create: Callable[..., Any], key_in_stats: Callable[..., Any],
                   get_key: Callable[..., Any], lock: type, lock_enter: Callable[..., Any],
                   lock_exit: Callable[..., Any], /) -> Any:
    """RLlib 2.60's `MetricsLogger.log_time` for a key the logger holds, compiled, as a method
    descriptor of the class `logger`; every other call (a key not held yet, keyword arguments,
    anything the copy does not cover) goes to RLlib's `own` (`rllib.compiled_log_time`)."""
