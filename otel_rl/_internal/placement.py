"""Where a thread's or worker process's blocks belong in the whole run: the program's own
merge point, when it has one.

ML-Agents gathers other timer trees itself: `SubprocessEnvManager` merges each env worker's
root under ``workers`` every step, `TrainerController` merges each trainer thread's root under
``trainer_threads`` when it joins them. Users look for those blocks there, and the block that
*started* the thread (``TrainerController._reset_env``, seconds long) is the wrong place for 30 s
of ``trainer_advance``. So when the program merges a stack's root (`TimerNode.origin` says
whose), the block it merges into becomes that stack's place: the whole-run tree and the tree
rebuilt from spans (the run span carries the places, `semconv.PLACEMENTS`, in the form
`places` reads and writes) put its blocks under it instead of under the starting block.
"""

from __future__ import annotations

from typing import Any

from otel_rl._internal import procstate, recorder
from otel_rl._internal.recorder import TimerNode

__all__ = ["on_merge", "places"]

#: (pid, thread id) -> the merge point's path from the root, first merge wins.
_places: dict[tuple[int, int], tuple[str, ...]] = {}


def on_merge(target: TimerNode, origin: tuple[int, int]) -> None:
    """`recorder.on_merge`: the program merges the tree of `origin` into `target`."""
    if origin in _places:
        return
    st = recorder.thread_stack()
    if st.stack[-1] is not target or (st.pid, st.tid) == origin:
        return  # merged outside a `with hierarchical_timer(...) as node` block: no place known
    base = st.base
    prefix = tuple(base.path) if base is not None else ()
    _places[origin] = prefix + tuple(node.name for node in st.stack[1:])


def places() -> list[list[Any]]:
    """This process's known places as ``[pid, thread id, path]`` lists (JSON-able)."""
    return [[pid, tid, list(path)] for (pid, tid), path in list(_places.items())]


def reset_after_fork() -> None:
    """In a forked child the parent's merge points are the parent's."""
    _places.clear()


procstate.register("placement", after_in_child=reset_after_fork, for_tests=reset_after_fork)
