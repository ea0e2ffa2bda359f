"""The one fork hook and the one reset for tests (a leaf but for `log`).

Several modules keep process-wide state (the runtime, the program's merge points, Sample
Factory components, scalar metrics, GPU timing). Each registers here, under a name from
`ORDER`, what it does around a ``fork()`` and what it forgets between tests; this module holds
the only ``os.register_at_fork`` and runs them in the order below, so the order is written in
one place instead of following which module happened to be imported first.

- In a forked child (``after_in_child``): the modules' own state first, in `ORDER`, then the
  runtime (last: it may make the child a worker of the run, which uses the others, and it
  unblocks SIGTERM only once every part is reset).
- Before a fork, and in the parent after it: `ORDER` reversed, and `ORDER` (the runtime's
  ``before`` blocks SIGTERM and stops otel_rl's threads, its ``after_in_parent`` restarts them).
- `reset_for_tests`: the runtime first (it shuts the run down, which still reads the others),
  then the rest in `ORDER`.

A part's fork hook that raises is logged and the others still run (fail open); a reset for
tests that raises is raised once every part has run (a bug the tests must see).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from otel_rl._internal import log

__all__ = ["ORDER", "register", "register_fork_hook_now", "registered", "reset_for_tests"]

#: Every part, in the order their after-fork resets run in a child.
ORDER = ("placement", "components", "metrics", "gpu", "runtime")

Hook = Callable[[], object]
_KINDS = ("before", "after_in_parent", "after_in_child", "for_tests")
_hooks: dict[str, dict[str, Hook]] = {kind: {} for kind in _KINDS}


def register(name: str, *, before: Hook | None = None, after_in_parent: Hook | None = None,
             after_in_child: Hook | None = None, for_tests: Hook | None = None) -> None:
    """Register part `name`'s hooks (those given; a later call adds or replaces hooks)."""
    if name not in ORDER:
        raise ValueError(f"unknown process-state part {name!r}: add it to procstate.ORDER")
    for kind, hook in zip(_KINDS, (before, after_in_parent, after_in_child, for_tests),
                          strict=True):
        if hook is not None:
            _hooks[kind][name] = hook


def registered(kind: str) -> list[str]:
    """The parts with a `kind` hook, in the order they run."""
    names = [name for name in ORDER if name in _hooks[kind]]
    if kind == "before":
        names.reverse()
    elif kind == "for_tests" and "runtime" in names:
        names.remove("runtime")
        names.insert(0, "runtime")
    return names


def _run(kind: str) -> None:
    hooks = _hooks[kind]
    failed: Exception | None = None
    for name in registered(kind):
        try:
            hooks[name]()
        except Exception as exc:  # a reset that fails must not keep the others from running
            failed = failed or exc
            log.warning("otel_rl: %s's %s hook failed: %r", name, kind, exc)
    if failed is not None and kind == "for_tests":
        raise failed


def reset_for_tests() -> None:
    """Forget all process state: the run, every timer stack, every part's (tests only; never
    while blocks are open)."""
    _run("for_tests")


#: The registration whose hooks act; an earlier one is inert (the interpreter cannot remove one).
_live = 0


def register_fork_hook_now() -> None:
    """Register the one fork hook (again) at this point of the interpreter's list, the earlier
    registration going inert. The interpreter runs ``before`` hooks last-registered first and
    the ``after`` ones in order: the runtime calls this when the first run starts (as it always
    registered its hook then), so that otel_rl stops its threads before the hooks of libraries
    imported earlier run (logging's takes its lock, which a stopping thread may be waiting
    for), and its child hook runs after theirs."""
    global _live
    if not hasattr(os, "register_at_fork"):
        return
    _live += 1
    token = _live

    def run(kind: str) -> None:
        if token == _live:
            _run(kind)

    os.register_at_fork(before=lambda: run("before"),
                        after_in_parent=lambda: run("after_in_parent"),
                        after_in_child=lambda: run("after_in_child"))


register_fork_hook_now()  # a program that never starts a run forks with the parts reset too
