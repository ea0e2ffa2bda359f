"""RLlib's own timer methods, compiled (`_hotpath.rllib_stats`), against RLlib's Python ones.

Run in the Ray venv with otel_rl installed (tests/frameworks/test_rllib.py). Random programs
of ``__enter__`` / ``__exit__`` calls on real RLlib stats objects run twice with the same seed
and the same clock readings (base.py's ``time`` replaced by one reading a list): once through
RLlib's own ``StatsBase.__enter__`` / ``__exit__``, once through the compiled copy the glue
calls. After every call the script records what a caller can see (the return value or the
exception, every stats object's ``_value`` bit for bit, its starts per thread, ``peek()``) and
compares the two records whole. It covers the calls the compiled copy hands back to RLlib's
functions too: an exit never entered, a start of None, keyword arguments, an ``EmaStats`` whose
``_value`` or ``_ema_coeff`` is not a float, a ``push`` replaced on the object or overridden in
a subclass, other stats classes, NaN readings, another thread. Prints one JSON line: the
number of calls, and how many times RLlib's Python ``EmaStats.push`` ran on each path (the
compiled copy must not call it for a plain float EMA).

    python rllib_stats_diff.py OUTPUT_DIR [SEED] [CALLS]
"""

from __future__ import annotations

import json
import random
import sys
import threading
from typing import Any

import numpy as np

import otel_rl

otel_rl.configure(output_dir=sys.argv[1])

from difftools import Calls, compared  # noqa: E402
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger  # noqa: E402
from ray.rllib.utils.metrics.stats import base  # noqa: E402
from ray.rllib.utils.metrics.stats.ema import EmaStats  # noqa: E402
from ray.rllib.utils.metrics.stats.max import MaxStats  # noqa: E402
from ray.rllib.utils.metrics.stats.mean import MeanStats  # noqa: E402
from ray.rllib.utils.metrics.stats.sum import SumStats  # noqa: E402

from otel_rl._internal import rllib  # noqa: E402

SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
OWN_ENTER, OWN_EXIT = rllib.own_methods(base.StatsBase)[:2]
FUSED = rllib._compiled_own.get(base.StatsBase)
if FUSED is None:
    print(json.dumps({"error": "no compiled copy of RLlib's own methods installed"}))
    sys.exit(2)


class Clock:
    """base.py's ``time``: ``perf_counter`` reads the next of a fixed list of readings."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = readings
        self.at = 0

    def perf_counter(self) -> float:
        self.at += 1
        return self.readings[(self.at - 1) % len(self.readings)]


class OwnPush(EmaStats):
    def push(self, value: Any) -> None:
        self._value = ("own", value)


def readings(rng: random.Random) -> list[float]:
    out, now = [], 1000.0 * rng.random()
    for _ in range(4096):
        now += rng.choice((1e-7, 3e-6, rng.random() * 1e-3, rng.random()))
        out.append(float("nan") if rng.random() < 0.01 else now)
    return out


def make_stats() -> list[Any]:
    logger = MetricsLogger()
    made = [logger.log_time(("timers", f"t{i}")) for i in range(4)]  # EmaStats, coeff 0.01
    made.append(logger.log_time("coeff", ema_coeff=0.3))
    made.append(EmaStats(ema_coeff=1))  # an int coefficient: RLlib's push
    odd = EmaStats()
    odd._value = np.float64(0.5)  # not a float: RLlib's push
    made.append(odd)
    replaced = EmaStats()
    replaced.push = lambda value: setattr(replaced, "_value", ("replaced", value))
    made.append(replaced)
    made += [OwnPush(), MeanStats(window=5), SumStats(), MaxStats()]
    return made


def seen(value: Any) -> Any:
    if isinstance(value, float):
        return ["float", value.hex()]
    if isinstance(value, np.floating):
        return [type(value).__name__, float(value).hex()]
    if isinstance(value, tuple):
        return [seen(v) for v in value]
    return repr(value)


def state(stats: list[Any], threads: dict[int, str]) -> list[Any]:
    out = []
    for s in stats:
        starts = {threads.get(k, "?"): seen(v) for k, v in s._start_times.items()}
        try:
            peek = seen(s.peek())
        except Exception as exc:
            peek = f"raises {type(exc).__name__}"
        out.append([type(s).__name__, seen(getattr(s, "_value", None)), starts, peek])
    return out


def in_thread(s: Any, enter: Any, exit_: Any) -> tuple[int, Any]:
    """`s` entered and exited on a new thread: its id, and what the two calls gave."""
    done: list[Any] = []

    def run() -> None:
        entered = enter(s) is s
        done.extend((threading.get_ident(), [entered, seen(exit_(s, None, None, None))]))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if not done:
        raise RuntimeError("the thread's calls raised")
    return done[0], done[1]


def program(enter: Any, exit_: Any) -> tuple[list[Any], int]:
    rng = random.Random(SEED)
    base.time = Clock(readings(rng))  # type: ignore[attr-defined]
    stats = make_stats()
    which = [id(s) for s in stats]  # stats objects compare by value (`StatsBase.__eq__`)
    threads = {threading.get_ident(): "main"}
    trace: list[Any] = []

    def call(op: str, s: Any) -> Any:
        if op == "enter":
            return enter(s)
        if op == "exit_kw":
            return exit_(s, None, exc_value=None, tb=None)
        if op == "exit_raising":
            return exit_(s, ValueError, ValueError("in the block"), None)
        return exit_(s, None, None, None)

    with Calls(EmaStats.push) as pushes:
        for _ in range(CALLS):
            s = rng.choice(stats)
            op = rng.choices(("enter", "exit", "exit_kw", "exit_raising", "none_start", "thread"),
                             (10, 8, 1, 2, 1, 2))[0]
            if op == "none_start":
                s._start_times[threading.get_ident()] = None
                op = "exit"
            try:
                if op == "thread":
                    ident, result = in_thread(s, enter, exit_)
                    threads[ident] = f"thread{len(threads)}"
                else:
                    returned = call(op, s)
                    result = "self" if op == "enter" and returned is s else seen(returned)
            except Exception as exc:
                result = f"raises {type(exc).__name__}: {exc}"
            trace.append([op, which.index(id(s)), result, state(stats, threads)])
    return trace, pushes.n


own_trace, own_pushes = program(OWN_ENTER, OWN_EXIT)
fused_trace, fused_pushes = program(*FUSED)
print(json.dumps({**compared(own_trace, fused_trace),
                  "python_pushes": {"rllib": own_pushes, "compiled": fused_pushes}}))
