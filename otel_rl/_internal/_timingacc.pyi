"""The optional compiled Sample Factory `Timing` (`_timingacc.c`); see `otel_rl.timing`."""

from typing import Any

def install(attrdict: type, timing: type, context: type, namespace: dict[str, Any],
            getattribute: Any, timeit: Any, add_time: Any, time_avg: Any, init: Any,
            enter: Any, exit: Any, /) -> dict[Any, Any]:
    """The compiled `AttrDict.__getattribute__`, `Timing.timeit/add_time/time_avg` and
    `TimingContext.__init__/__enter__/__exit__`, by the pure functions they stand for; they
    read timing.py's globals from `namespace`."""
