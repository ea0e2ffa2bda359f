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

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from otel_rl._internal import metrics_columns, semconv
from otel_rl._internal.metrics_columns import Reader
from otel_rl._internal.node import TreeNode
from otel_rl._internal.record import EXTRA, OpenSpan

__all__ = ["MAX_PATHS", "OTHER", "OVERFLOW", "ROOT", "PathResolver", "PathTable", "column_codes",
           "tree_totals", "unique_paths"]

#: Distinct block paths kept as their own series (per exporting process); more go to `OTHER`.
MAX_PATHS = 2000
#: The path (and block) label of the runs past `MAX_PATHS`.
OTHER = "_other"
ROOT = 0  # code of the empty path: a top-level block's parent
OVERFLOW = 1  # code of `OTHER`
SEP = "/"
#: Observations a record waits for its parent before it counts as top-level.
ROUNDS = 5


class _NameIds(dict[str, int]):
    """Block name -> a small int, made on first sight (at C speed when known: `dict`'s own
    lookup); past `limit` names, new ones share id 0, whose paths are `OTHER`."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.names = [OTHER]

    def __missing__(self, name: str) -> int:
        if len(self.names) > self.limit:
            return 0
        code = self[name] = len(self.names)
        self.names.append(name)
        return code


class PathTable:
    """Interned block paths: code -> (path, leaf name); a child's code from its parent's."""

    __slots__ = ("cap", "children", "leaves", "name_ids", "on_overflow", "paths")

    def __init__(self, cap: int = MAX_PATHS,
                 on_overflow: Callable[[int], None] | None = None) -> None:
        self.cap = cap
        self.paths = ["", OTHER]
        self.leaves = ["", OTHER]
        self.children: dict[tuple[int, str], int] = {}
        self.on_overflow = on_overflow
        self.name_ids = _NameIds(4 * cap)

    def child(self, parent: int, name: str) -> int:
        """The code of `name` nested in the path `parent` (made on first use)."""
        key = (parent, name)
        code = self.children.get(key)
        if code is not None:
            return code
        if parent == OVERFLOW or len(self.paths) - 2 >= self.cap or name is OTHER:
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


def _is_kind(extra: Any) -> bool:
    """A run, process, window or aggregate span: never a block's parent in a thread's tree."""
    if not extra:
        return False
    attrs = extra.get("attrs")
    return bool(attrs) and semconv.KIND in attrs


def column_codes(np: Any, columns: Any, codes: Mapping[str, int]) -> Any:
    """``codes[name]`` of each record of a batch laid out in `columns` (`Columns`: its names
    once each, then an index per record), as int64, without a step per record."""
    return np.array([codes[name] for name in columns.names] or [0],
                    np.int64)[np.frombuffer(columns.name_idx, np.uint32)]


class PathResolver:
    """Path codes for drained records (see the module docstring)."""

    def __init__(self, table: PathTable,
                 open_blocks: Callable[[], Iterable[OpenSpan]] | None = None,
                 roots: Callable[[], Iterable[int]] | None = None,
                 reader: Reader = metrics_columns.PURE) -> None:
        self.table = table
        self.reader = reader  # how record fields become columns (compiled or pure)
        self.open_blocks = open_blocks
        self.roots = roots
        self.unplaced = 0  # records counted as top-level because their parent never showed
        self._open: dict[int, OpenSpan] | None = None
        self._open_codes: dict[int, int] = {}
        self._roots: set[int] | None = None
        # Batches of this observation and the previous one: (pid, `_Index` of their span
        # ids, their codes, their thread ids), for parents that ended in an earlier batch.
        self._recent: list[tuple[int, Any, Any, Any]] = []
        self._previous: list[tuple[int, Any, Any, Any]] = []

    def begin(self) -> None:
        """A new observation: open blocks and roots are read again when first needed."""
        self._open = None
        self._open_codes = {}
        self._roots = None
        self._previous, self._recent = self._recent, []

    # -- parents outside the batch -----------------------------------------------------------
    def _opened(self) -> dict[int, OpenSpan]:
        if self._open is None:
            self._open = {}
            if self.open_blocks is not None:
                for block in self.open_blocks():
                    self._open[block.span_id] = block
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
            block = opened[at]
            pid, tid, psid, name = block.pid, block.thread_id, block.parent_id, block.name
            chain.append((at, name))
            up = opened.get(psid)
            if up is None or up.pid != pid or up.thread_id != tid:
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
        if opened is not None and opened.pid == pid:
            return self._open_code(psid), opened.thread_id
        for where in (self._recent, self._previous):
            for bpid, index, codes, tids in where:
                if bpid != pid:
                    continue
                at = index.find(psid)
                if at >= 0 and codes[at] >= 0:
                    return int(codes[at]), int(tids[at])
        if psid in self._root_ids():
            return ROOT, None
        return -1, None

    # -- one batch -------------------------------------------------------------------------------
    def resolve(self, np: Any, pid: int, records: Any, last_chance: bool,
                extras: Sequence[int] | None = None, threads: Mapping[int, str] | None = None,
                by_name: dict[str, int] | None = None, columns: Any = None,
                named: Any = None) -> Any:
        """Path codes of `records` (-1: parent not known yet; with `last_chance`, those count
        as top-level). `extras`: the positions of the records that have one (`Reader.extras`;
        None: look); `threads`: the batch's thread names (one thread: its records need no
        thread id column); `by_name`: the path of each block name that has one path only
        (`unique_paths`), -1 for others; `named`: that column already read (it is updated in
        place); `columns`: the records as `Columns` (a relayed batch: no step per record)."""
        n = len(records)
        reader = self.reader
        if extras is None:
            extras = reader.extras(records)
        kinds = [i for i in extras if _is_kind(records[i][EXTRA])]
        name_ids = self.table.name_ids
        sub: Any = None  # the positions to place by parent ids (None: all)
        if by_name is not None:
            # The common case, at one column's cost: every block's name has one path (the
            # run, window and aggregate spans of the batch are no block's parent here).
            codes = named if named is not None else reader.codes(np, records, by_name)
            codes[kinds] = ROOT
            sub = np.flatnonzero(codes < 0)
            if not len(sub):
                return codes
            if 4 * len(sub) > n:
                sub = None  # many names at several paths: place every record
        if sub is None:
            codes = np.full(n, -1, np.int64)
            codes[kinds] = ROOT
        if columns is not None:
            sids = np.frombuffer(columns.sids, np.uint64)
            psids = np.frombuffer(columns.psids, np.uint64)
            tids = np.frombuffer(columns.tids, np.uint64)
            name_codes = column_codes(np, columns, name_ids)
        else:
            single = next(iter(threads)) if threads is not None and len(threads) == 1 else None
            one_thread = isinstance(single, int) and single >= 0
            sids, tids = reader.ids(np, records, not one_thread)
            if one_thread:
                tids = np.full(n, single, np.uint64)
            # Parent ids and names only of the records to place (a few names at several
            # paths among names at one: the others have their code by name already).
            chosen = records if sub is None else [records[i] for i in sub.tolist()]
            psids, name_codes = reader.parents(np, chosen, name_ids)
        if sub is None:
            sub = np.arange(n)
        elif len(psids) == n:  # columns: take the records to place
            psids, name_codes = psids[sub], name_codes[sub]
        name_list = name_ids.names
        width = len(name_list)
        index = _Index(np, sids)
        # Below, per record to place (`sub`): its parent's position and placement.
        inside, parent = index.find_all(psids)
        mine = tids[sub]
        same = inside & (tids[parent] == mine)
        parent_codes = np.full(len(sub), -1, np.int64)
        parent_codes[inside & ~same] = ROOT  # a parent in another thread: a top-level block
        outside = np.flatnonzero(~inside)
        if len(outside):
            unique, back = np.unique(psids[outside], return_inverse=True)
            found = [self._outside(pid, p) for p in unique.tolist()]
            ucodes = np.array([c for c, _ in found], np.int64)
            utids = np.array([0 if t is None else t for _, t in found], np.uint64)
            rooted = np.array([t is None for _, t in found], bool)
            # A parent in another thread: a top-level block of this thread.
            other = ~rooted[back] & (utids[back] != mine[outside])
            parent_codes[outside] = np.where(other, ROOT, ucodes[back])

        def settle() -> None:
            """Codes for every record whose parent's code is known, outermost first (one
            pass per nesting level, over the records still without a code)."""
            child = self.table.child
            reader.settle(np, codes, sub, same, parent, parent_codes, name_codes, width,
                          lambda k: child(k // width, name_list[k % width]))

        settle()
        if last_chance:
            waiting = (codes[sub] < 0) & ~same  # their parent never showed: top-level
            if waiting.any():
                self.unplaced += int(waiting.sum())
                parent_codes[waiting] = ROOT
                settle()
        self._recent.append((pid, index, codes, tids))
        return codes


class _Index:
    """Positions of a batch's span ids. A process's ids come from one counter, so a batch's
    usually span a short range: then a dense table (no sort); else sorted ids."""

    __slots__ = ("lo", "np", "order", "sorted", "table")
    table: Any
    order: Any
    sorted: Any

    def __init__(self, np: Any, sids: Any) -> None:
        self.np = np
        n = len(sids)
        lo, hi = int(sids.min()), int(sids.max())
        self.lo = lo
        if hi - lo <= 4 * n + 1024:
            self.table = np.full(hi - lo + 1, -1, np.int64)
            self.table[(sids - np.uint64(lo)).astype(np.int64)] = np.arange(n)
            self.order = self.sorted = None
        else:
            self.table = None
            self.order = np.argsort(sids, kind="stable")
            self.sorted = sids[self.order]

    def find_all(self, ids: Any) -> tuple[Any, Any]:
        """(found, position or 0) of each of `ids`."""
        np = self.np
        if self.table is not None:
            offset = ids - np.uint64(self.lo)  # ids below lo wrap around: out of range
            ok = offset < np.uint64(len(self.table))
            at = np.where(ok, self.table[np.where(ok, offset, 0).astype(np.int64)], -1)
            inside = at >= 0
            return inside, np.where(inside, at, 0)
        at = np.minimum(np.searchsorted(self.sorted, ids), len(self.sorted) - 1)
        inside = self.sorted[at] == ids
        return inside, np.where(inside, self.order[at], 0)

    def find(self, sid: int) -> int:
        """The position of `sid`, -1 if absent."""
        if self.table is not None:
            offset = sid - self.lo
            return int(self.table[offset]) if 0 <= offset < len(self.table) else -1
        at = int(self.sorted.searchsorted(sid))
        if at < len(self.sorted) and int(self.sorted[at]) == sid:
            return int(self.order[at])
        return -1


class _ByName(dict[str, int]):
    __slots__ = ()

    def __missing__(self, name: str) -> int:
        return -1


def unique_paths(trees: Iterable[Any], table: PathTable) -> dict[str, int]:
    """{block name: path code} of the names that sit at one path only in `trees` (this
    process's stacks' trees, read after the drain: every drained record's block has its node
    there, so a name with one node has that path); others map to -1."""
    found: dict[str, int] = {}
    for tree in trees:
        todo = [(ROOT, tree)]
        while todo:
            code, node = todo.pop()
            for name, child in list(node.children.items()):
                at = table.child(code, name)
                found[name] = at if found.get(name, at) == at else -1
                todo.append((at, child))
    result = _ByName()
    result.update(found)
    return result


def tree_totals(tree: TreeNode, table: PathTable,
                into: dict[int, list[float]] | None = None) -> dict[int, list[float]]:
    """{path code: [runs, seconds]} of a stack's tree (its own, or a relaying worker's as
    its snapshot was read), added into `into`."""
    result: dict[int, list[float]] = {} if into is None else into
    todo = [(ROOT, tree)]
    while todo:
        code, node = todo.pop()
        for name, child in node.children.items():
            at = table.child(code, name)
            slot = result.setdefault(at, [0, 0.0])
            slot[0] += child.count
            slot[1] += child.total
            todo.append((at, child))
    return result
