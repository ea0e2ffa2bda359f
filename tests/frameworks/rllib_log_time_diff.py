"""RLlib's ``MetricsLogger.log_time``, compiled (`_hotpath.rllib_log_time`), against RLlib's own.

Run in the Ray venv with otel_rl installed (tests/frameworks/test_rllib.py). A random program of
``log_time`` calls runs twice with the same seed on fresh real ``MetricsLogger`` objects: once
through RLlib's Python ``log_time``, once through the compiled copy otel_rl installs. After
every call the script records what a caller can see (which stats object came back, as its
path in the logger, its class and settings, or the exception) and the whole of every logger's
``stats`` tree, and compares the two records whole. The keys and calls cover what the copy
answers (a str or tuple of strs already held) and what it hands to RLlib's function: new keys,
nested tuples, lists, non-str parts, the empty tuple, keyword arguments (valid, invalid,
unknown), a key under a stats object, a logger whose lock is a real ``RLock``, whose
``_get_key`` is shadowed on the instance, or of a subclass with its own ``_key_in_stats``, and
another thread. On the compiled path, a call the copy should answer itself (RLlib's class and
lock, a held str or tuple-of-strs key, no keywords) must not run RLlib's Python
``_key_in_stats``, and every other call without keywords must: where that fails, the records
differ. Prints one
JSON line: the number of calls, how many the copy answered, and how many times RLlib's Python
``_key_in_stats`` ran on each path.

    python rllib_log_time_diff.py OUTPUT_DIR [SEED] [CALLS]
"""

from __future__ import annotations

import json
import random
import sys
import threading
from typing import Any

import otel_rl

otel_rl.configure(output_dir=sys.argv[1])

from difftools import Calls, compared  # noqa: E402
from ray.rllib.utils.metrics import metrics_logger  # noqa: E402
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger  # noqa: E402

from otel_rl._internal import rllib  # noqa: E402

SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
OWN, COMPILED = rllib._loggers.get(MetricsLogger, (None, None))
if COMPILED is None or MetricsLogger.__dict__["log_time"] is not COMPILED:
    print(json.dumps({"error": "no compiled log_time installed"}))
    sys.exit(2)

PARTS = ("timers", "a", "b", "env_to_module_connector", "connectors", "add_states")
KWARGS: list[dict[str, Any]] = [
    {"reduce": "mean", "window": 5}, {"ema_coeff": 0.3}, {"reduce": "sum"},
    {"reduce": "bogus"}, {"nope": 1}, {"reduce": "ema", "window": 3},
    {"reduce": "max", "clear_on_reduce": True},
]


class OwnKeyIn(MetricsLogger):
    def _key_in_stats(self, flat_key: Any, *, stats: Any = None) -> bool:
        return bool(super()._key_in_stats(flat_key, stats=stats))


def loggers() -> list[Any]:
    plain, second = MetricsLogger(), MetricsLogger(root=True)
    locked = MetricsLogger()
    locked._threading_lock = threading.RLock()  # not RLlib's _DummyRLock: RLlib's log_time
    shadowed = MetricsLogger()
    shadowed._get_key = lambda key, **kw: MetricsLogger._get_key(shadowed, key, **kw)
    return [plain, second, locked, shadowed, OwnKeyIn()]


def key(rng: random.Random) -> Any:
    kind = rng.choices(("str", "tuple", "nested", "list", "odd", "empty"),
                       (20, 40, 4, 3, 2, 1))[0]
    parts = tuple(rng.choice(PARTS) for _ in range(rng.randint(1, 3)))
    if kind == "str":
        return parts[0]
    if kind == "tuple":
        return parts
    if kind == "nested":
        return ((parts[0], "p"), *parts[1:])
    if kind == "list":
        return list(parts)
    if kind == "odd":
        return (*parts, rng.choice((0, None, 1.5)))
    return ()


def where(logger: Any, obj: Any) -> Any:
    """The path of `obj` (by identity) in `logger.stats`, or a description of what it is."""
    todo: list[tuple[tuple[Any, ...], Any]] = [((), logger.stats)]
    while todo:
        path, node = todo.pop()
        if node is obj:
            return ["at", [repr(p) for p in path]]
        if isinstance(node, dict):
            todo.extend(((*path, k), v) for k, v in node.items())
    return ["elsewhere", type(obj).__name__]


def tree_of(node: Any) -> Any:
    if isinstance(node, dict):
        return {repr(k): tree_of(v) for k, v in node.items()}
    return [type(node).__name__, repr(node), getattr(node, "_otel_rl_block", None)]


def held(logger: Any, k: Any) -> bool:
    """Whether the copy answers ``log_time(k)`` on `logger` itself: RLlib's own logger class
    and lock, the key a str or tuple of strs, already held there."""
    if type(logger) is not MetricsLogger or "_get_key" in vars(logger) or type(
            logger._threading_lock) is not metrics_logger._DummyRLock:
        return False
    parts = (k,) if type(k) is str else k if type(k) is tuple else ()
    if not parts or any(type(p) is not str for p in parts):
        return False
    node = logger.stats
    for p in parts:
        if type(node) is not dict or p not in node:
            return False
        node = node[p]
    return True


def program(log_time: Any, copy: bool) -> tuple[list[Any], int, list[bool]]:
    rng = random.Random(SEED)
    made = loggers()
    trace: list[Any] = []
    copy_answers: list[bool] = []  # per call without keywords: whether `held` says so

    def call(logger: Any, k: Any, kwargs: dict[str, Any]) -> Any:
        try:
            got = log_time(logger, k, **kwargs)
        except Exception as exc:
            return f"raises {type(exc).__name__}: {exc}"
        return [where(logger, got), type(got).__name__, repr(got)]

    with Calls(MetricsLogger._key_in_stats) as key_ins:
        for _ in range(CALLS):
            which = rng.choices(range(len(made)), (40, 30, 10, 10, 10))[0]
            logger, k = made[which], key(rng)
            kwargs = rng.choice(KWARGS) if rng.random() < 0.05 else {}
            answers = not kwargs and held(logger, k)
            before = key_ins.n
            if rng.random() < 0.02:
                done: list[Any] = []
                thread = threading.Thread(
                    target=lambda d=done, m=logger, k=k, kw=kwargs: d.append(call(m, k, kw)))
                thread.start()
                thread.join()
                result = done[0]
            else:
                result = call(logger, k, kwargs)
            trace.append([which, repr(k), repr(kwargs), result,
                          [tree_of(m.stats) for m in made]])
            copy_answers.append(answers and key_ins.n == before)
            if copy and not kwargs and answers != (key_ins.n == before):  # the copy answered what
                # it should not, or handed on what it should answer: the records differ there
                trace[-1].append("RLlib's _key_in_stats " + ("ran" if answers else "did not run"))
    return trace, key_ins.n, copy_answers


own_trace, own_key_ins, _ = program(lambda logger, k, **kw: OWN(logger, k, **kw), False)
compiled_trace, compiled_key_ins, answered = program(lambda logger, k, **kw: logger.log_time(k, **kw), True)
print(json.dumps({**compared(own_trace, compiled_trace),
                  "answered_by_the_copy": sum(answered),
                  "python_key_in_stats": {"rllib": own_key_ins, "compiled": compiled_key_ins},
                  "lock_is_dummy": type(MetricsLogger()._threading_lock)
                  is metrics_logger._DummyRLock}))
