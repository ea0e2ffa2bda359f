"""Block paths for the metrics: where in its thread's tree each drained record's block ran.

A record carries its parent's span id, not its path, and its parent ends after it, so when a
record is drained its parent is usually still open. `PathResolver` finds the parent, per batch
and vectorised (numpy), in this order: a record of the same batch (sorted span ids and
`searchsorted`), a block open now (`open_blocks`: this process's stacks, read after the drain,
and each relaying worker's last snapshot), a record of a recent batch; a parent that is one of
the run's roots (the run span, the span a process's or thread's top-level blocks hang under)
makes the record top-level. A record whose parent is none of these yet (a worker's block that
opened after its last snapshot) waits for the next observation (`pending`), at most `ROUNDS`
of them, then counts as top-level (said once; counted in `unplaced`).

The path is the block's path in the tree of its own thread — ML-Agents' per-thread timers
path, e.g. ``main_loop/update`` — so a parent in another thread or process (a worker's or a
thread task's starting block) ends it; the ``role`` label says which process. The same paths
come from the aggregate trees (`tree_totals`), which is how `spans=off` still has per-path
counts. Paths are interned (`PathTable`): at most `MAX_PATHS` distinct ones, then every new one
is counted under `OTHER` (one warning).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from otel_rl._internal import semconv
from otel_rl._internal.shapes import OpenBlockInfo

__all__ = ["MAX_PATHS", "OTHER", "OVERFLOW", "ROOT", "PathResolver", "PathTable",
           "exported_paths", "tree_totals"]

#: Distinct block paths kept as their own series (per exporting process); more go to `OTHER`.
MAX_PATHS = 2000
#: The path (and block) label of the runs past `MAX_PATHS`.
OTHER = "_other"
ROOT = 0  # code of the empty path: a top-level block's parent
OVERFLOW = 1  # code of `OTHER`
SEP = "/"
#: Observations a record waits for its parent before it counts as top-level.
ROUNDS = 5

_SID, _PSID, _NAME, _TID, _EXTRA = (operator.itemgetter(i) for i in (0, 1, 2, 5, 7))


class PathTable:
    """Interned block paths: code -> (path, leaf name); a child's code from its parent's."""

    __slots__ = ("cap", "children", "leaves", "on_overflow", "paths")

    def __init__(self, cap: int = MAX_PATHS,
                 on_overflow: Callable[[int], None] | None = None) -> None:
        self.cap = cap
        self.paths = ["", OTHER]
        self.leaves = ["", OTHER]
        self.children: dict[tuple[int, str], int] = {}
        self.on_overflow = on_overflow

    def child(self, parent: int, name: str) -> int:
        """The code of `name` nested in the path `parent` (made on first use)."""
        key = (parent, name)
        code = self.children.get(key)
        if code is not None:
            return code
        if parent == OVERFLOW or len(self.paths) - 2 >= self.cap:
            if len(self.children) < 4 * self.cap:  # remembered, up to a bound
                self.children[key] = OVERFLOW
            if self.on_overflow is not None:
                self.on_overflow(self.cap)
            return OVERFLOW
        code = len(self.paths)
        self.paths.append(name if parent == ROOT else self.paths[parent] + SEP + name)
        self.leaves.append(name)
        self.children[key] = code
        return code

    def find(self, names: Iterable[str]) -> int | None:
        """The code of the path of `names` (outermost first), None if it was never made."""
        code = ROOT
        for name in names:
            found = self.children.get((code, name))
            if found is None:
                return None
            code = found
        return code


def _is_kind(extra: Any) -> bool:
    """A run, process, window or aggregate span: never a block's parent in a thread's tree."""
    if not extra:
        return False
    attrs = extra.get("attrs")
    return bool(attrs) and semconv.KIND in attrs


class PathResolver:
    """Path codes for drained records (see the module docstring)."""

    def __init__(self, table: PathTable,
                 open_blocks: Callable[[], Iterable[OpenBlockInfo]] | None = None,
                 roots: Callable[[], Iterable[int]] | None = None) -> None:
        self.table = table
        self.open_blocks = open_blocks
        self.roots = roots
        self.unplaced = 0  # records counted as top-level because their parent never showed
        self._open: dict[int, tuple[int, int, int, str]] | None = None
        self._open_codes: dict[int, int] = {}
        self._roots: set[int] | None = None
        # Batches of this observation and the previous one: (pid, sorted sids, their codes,
        # their thread ids), for parents that ended in an earlier batch.
        self._recent: list[tuple[int, Any, Any, Any]] = []
        self._previous: list[tuple[int, Any, Any, Any]] = []

    def begin(self) -> None:
        """A new observation: open blocks and roots are read again when first needed."""
        self._open = None
        self._open_codes = {}
        self._roots = None
        self._previous, self._recent = self._recent, []

    # -- parents outside the batch -----------------------------------------------------------
    def _opened(self) -> dict[int, tuple[int, int, int, str]]:
        if self._open is None:
            self._open = {}
            if self.open_blocks is not None:
                for pid, sid, psid, name, _start, tid in self.open_blocks():
                    self._open[sid] = (pid, tid, psid, name)
        return self._open

    def _open_code(self, sid: int) -> int:
        """The path code of open block `sid` (its open ancestors in the same thread)."""
        code = self._open_codes.get(sid)
        if code is not None:
            return code
        opened = self._opened()
        chain: list[tuple[int, str]] = []
        at, base = sid, ROOT
        while len(chain) < 10_000:  # bounded: a corrupt snapshot must not spin
            pid, tid, psid, name = opened[at]
            chain.append((at, name))
            up = opened.get(psid)
            if up is None or up[0] != pid or up[1] != tid:
                break
            known = self._open_codes.get(psid)
            if known is not None:
                base = known
                break
            at = psid
        code = base
        for at, name in reversed(chain):
            code = self._open_codes[at] = self.table.child(code, name)
        return code

    def _root_ids(self) -> set[int]:
        if self._roots is None:
            self._roots = {0}
            if self.roots is not None:
                self._roots.update(self.roots())
        return self._roots

    def _outside(self, pid: int, psid: int) -> tuple[int, int | None]:
        """(code, thread id) of parent `psid` of a record of process `pid`: thread id None
        for a root; code -1 when not known yet."""
        opened = self._opened().get(psid)
        if opened is not None and opened[0] == pid:
            return self._open_code(psid), opened[1]
        for where in (self._recent, self._previous):
            for bpid, sids, codes, tids in where:
                if bpid != pid:
                    continue
                at = int(sids.searchsorted(psid))
                if at < len(sids) and int(sids[at]) == psid and codes[at] >= 0:
                    return int(codes[at]), int(tids[at])
        if psid in self._root_ids():
            return ROOT, None
        return -1, None

    # -- one batch -------------------------------------------------------------------------------
    def resolve(self, np: Any, pid: int, records: Any, name_col: list[str],
                last_chance: bool) -> Any:
        """Path codes of `records` (-1: parent not known yet; with `last_chance`, those count
        as top-level)."""
        n = len(records)
        sids = np.fromiter(map(_SID, records), np.uint64, n)
        psids = np.fromiter(map(_PSID, records), np.uint64, n)
        tids = np.fromiter(map(_TID, records), np.uint64, n)
        names = {name: k for k, name in enumerate(dict.fromkeys(name_col))}
        name_list = list(names)
        name_codes = np.fromiter(map(names.__getitem__, name_col), np.int64, n)
        width = len(name_list)
        order = np.argsort(sids, kind="stable")
        sorted_sids = sids[order]
        at = np.minimum(np.searchsorted(sorted_sids, psids), n - 1)
        inside = sorted_sids[at] == psids
        parent = np.where(inside, order[at], 0)
        same = inside & (tids[parent] == tids)
        codes = np.full(n, -1, np.int64)
        parent_codes = np.full(n, -1, np.int64)
        parent_codes[inside & ~same] = ROOT  # a parent in another thread: a top-level block
        if any(map(_EXTRA, records)):
            kinds = [i for i, r in enumerate(records) if _is_kind(r[7])]
            codes[kinds] = ROOT
        outside = np.flatnonzero(~inside)
        if len(outside):
            unique, back = np.unique(psids[outside], return_inverse=True)
            found = [self._outside(pid, p) for p in unique.tolist()]
            ucodes = np.array([c for c, _ in found], np.int64)
            utids = np.array([0 if t is None else t for _, t in found], np.uint64)
            rooted = np.array([t is None for _, t in found], bool)
            # A parent in another thread: a top-level block of this thread.
            other = ~rooted[back] & (utids[back] != tids[outside])
            parent_codes[outside] = np.where(other, ROOT, ucodes[back])

        def settle() -> None:
            """Codes for every record whose parent's code is known, outermost first."""
            child = self.table.child
            while True:
                known = parent_codes.copy()
                chained = same & (codes[parent] >= 0)
                known[chained] = codes[parent[chained]]
                ready = (codes < 0) & (known >= 0)
                if not ready.any():
                    return
                keys, back = np.unique(known[ready] * width + name_codes[ready],
                                       return_inverse=True)
                made = np.array([child(k // width, name_list[k % width])
                                 for k in keys.tolist()], np.int64)
                codes[ready] = made[back]

        settle()
        if last_chance:
            waiting = (codes < 0) & ~same  # their parent never showed: top-level
            if waiting.any():
                self.unplaced += int(waiting.sum())
                parent_codes[waiting] = ROOT
                settle()
        self._recent.append((pid, sorted_sids, codes[order], tids[order]))
        return codes


def exported_paths(batches: Iterable[Any]) -> dict[tuple[int, int], list[str]]:
    """Each exported record's path (names, outermost first), by (batch number, record index):
    the chain of its parents among the exported records themselves (the windows keep a kept
    window closed under parents, continuations included), in its own process and thread."""
    spans: dict[int, tuple[Any, Any]] = {}
    listed = []
    for b, batch in enumerate(batches):
        pid = batch.resource.get(semconv.PROCESS_PID)
        for i, record in enumerate(batch.records):
            spans[record[0]] = (pid, record)
            listed.append((b, i, pid, record))
    result: dict[tuple[int, int], list[str]] = {}
    for b, i, pid, record in listed:
        names = [record[2]]
        at = record
        while len(names) < 10_000:
            up = spans.get(at[1])
            if up is None or up[0] != pid or up[1][5] != at[5] or _is_kind(up[1][7]):
                break
            at = up[1]
            names.append(at[2])
        names.reverse()
        result[(b, i)] = names
    return result


def tree_totals(tree: Any, table: PathTable,
                into: dict[int, list[float]] | None = None) -> dict[int, list[float]]:
    """{path code: [runs, seconds]} of a stack's tree (a `TimerNode`, or a worker's node
    dict from its snapshot), added into `into`."""
    result: dict[int, list[float]] = {} if into is None else into
    todo = [(ROOT, tree)]
    while todo:
        code, node = todo.pop()
        children = node.get("children") if isinstance(node, Mapping) else node.children
        for name, child in (children or {}).items():
            at = table.child(code, str(name))
            if isinstance(child, Mapping):
                count, total = child.get("count") or 0, child.get("total") or 0.0
            else:
                count, total = child.count, child.total
            slot = result.setdefault(at, [0, 0.0])
            slot[0] += int(count)
            slot[1] += float(total)
            todo.append((at, child))
    return result
