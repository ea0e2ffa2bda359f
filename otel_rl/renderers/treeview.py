"""The tree-view text report: Sample Factory's ``tree_str`` with ML-Agents' numbers.

Sample Factory prints one indented line per block; ML-Agents' ``timers.json`` carries total,
count, self and ``is_parallel``. This view does both: one line per node with its total, self
time, count, mean per run and share of its parent, a mark on parallel branches, then the gauges
and metadata. A parallel branch ran alongside its parent (other threads or processes, summed),
so its time is not a share of the parent's: its "% parent" column shows it as a multiple of the
parent's time instead, never as a percentage past 100. Trees deeper than
`MAX_DRAWN_DEPTH` levels are drawn with the indentation cut and the depth written out. When any
block was timed on the GPU too, a ``gpu`` column beside ``total`` shows its GPU time.

Example::

    print(render(Tree.from_json(Path("timers.json").read_text())))
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from otel_rl._internal.tree import Tree, TreeNode, WorkerInfo

__all__ = [
    "clean_text",
    "format_count",
    "format_seconds",
    "main_process_root",
    "render",
    "worker_label",
]

#: Levels of tree-drawing indentation before it is cut and the depth is written instead.
MAX_DRAWN_DEPTH = 20
#: Longest name column before names are shortened with an ellipsis.
_MAX_NAME_WIDTH = 72
_MAX_METADATA_VALUE = 160


@dataclass(frozen=True, slots=True)
class _Glyphs:
    branch: str
    last: str
    pipe: str
    blank: str
    parallel: str
    ellipsis: str


_UNICODE = _Glyphs("├─ ", "└─ ", "│  ", "   ", "∥ ", "…")
_ASCII = _Glyphs("|- ", "`- ", "|  ", "   ", "|| ", "~")


def format_seconds(seconds: float, *, ascii_only: bool = False) -> str:
    """A duration with a unit chosen for reading: ``12.346 s``, ``8.25 ms``, ``412.0 µs``."""
    if not math.isfinite(seconds):
        return str(seconds)
    magnitude = abs(seconds)
    if magnitude == 0:
        return "0 s"
    if magnitude >= 1:
        return f"{seconds:.3f} s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if magnitude >= 1e-6:
        return f"{seconds * 1e6:.1f} {'us' if ascii_only else 'µs'}"
    return f"{seconds * 1e9:.0f} ns"


def format_count(count: float) -> str:
    """A count with thousands separators; a non-integral mean keeps one decimal."""
    if float(count).is_integer():
        return f"{int(count):,}"
    return f"{count:,.1f}"


def clean_text(text: str) -> str:
    """`text` safe to print on a terminal: control characters (newlines, ANSI escapes) shown
    as escapes, since timer names and metadata come from user code."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def _shorten(text: str, width: int, ellipsis: str) -> str:
    return text if len(text) <= width else text[: max(0, width - len(ellipsis))] + ellipsis


def _percent(part: float, whole: float, parallel: bool = False, times: str = "×") -> str:
    if whole <= 0:
        return "-"
    if parallel:
        # Time beside the parent, not inside it: how many times the parent's time it adds up to.
        ratio = part / whole
        return f"<0.01{times}" if 0 < ratio < 0.005 else f"{ratio:,.2f}{times}"
    share = 100.0 * part / whole
    return "<0.1%" if 0 < share < 0.05 else f"{share:.1f}%"


def _prefix(segments: list[str], glyphs: _Glyphs) -> str:
    if len(segments) <= MAX_DRAWN_DEPTH:
        return "".join(segments)
    keep = MAX_DRAWN_DEPTH // 2
    return "".join(segments[:keep]) + f"{glyphs.ellipsis}[depth {len(segments) + 1}] "


def _rows(
    node: TreeNode, glyphs: _Glyphs, node_total: float | None = None
) -> Iterator[tuple[str, TreeNode, float, bool]]:
    """(tree-drawing prefix + name, node, parent's total, whether the parent is parallel) for
    every node below `node`, depth first (an explicit stack: trees can be thousands deep)."""
    # Per open level: its children, the next one's index, their parent's total and flag.
    stack: list[tuple[list[TreeNode], int, float, bool]] = [
        (
            list(node.children.values()),
            0,
            node.total if node_total is None else node_total,
            node.is_parallel,
        )
    ]
    segments: list[str] = []  # the drawing of each open level's vertical line
    while stack:
        children, i, parent_total, parent_parallel = stack[-1]
        if i == len(children):
            stack.pop()
            if segments:
                segments.pop()
            continue
        stack[-1] = (children, i + 1, parent_total, parent_parallel)
        child = children[i]
        last = i == len(children) - 1
        mark = glyphs.parallel if child.is_parallel else ""
        label = (
            _prefix(segments, glyphs)
            + (glyphs.last if last else glyphs.branch)
            + mark
            + clean_text(child.name)
        )
        yield label, child, parent_total, parent_parallel
        if child.children:
            segments.append(glyphs.blank if last else glyphs.pipe)
            stack.append((list(child.children.values()), 0, child.total, child.is_parallel))


def _node_table(
    root_label: str, root: TreeNode, glyphs: _Glyphs, root_total: float, gpu: bool = False
) -> list[str]:
    """The column-aligned table for `root` and everything below it (`gpu`: a GPU column)."""
    ascii_only = glyphs is _ASCII
    rows: list[tuple[str, TreeNode, float | None, bool]] = [(root_label, root, None, False)]
    rows.extend(_rows(root, glyphs, node_total=root_total))
    width = min(_MAX_NAME_WIDTH, max(len(row[0]) for row in rows))
    gpu_head = f"  {'gpu':>11}" if gpu else ""
    header = (f"{'block':<{width}}  {'total':>11}{gpu_head}  {'self':>11}  {'count':>9}"
              f"  {'mean':>11}  {'% parent':>8}")
    lines = [header.rstrip()]
    for label, node, parent_total, parent_parallel in rows:
        total = root_total if node is root else node.total
        mean = total / node.count if node.count else 0.0
        share = ""
        if parent_total is not None:
            # Time beside the parent (a branch into other threads/processes, or more than the
            # parent's own time) is a multiple; inside an already parallel branch, a share.
            beside = node.is_parallel and (not parent_parallel or node.total > parent_total)
            share = _percent(node.total, parent_total, beside, "x" if ascii_only else "×")
        gpu_cell = ""
        if gpu:
            shown = format_seconds(node.gpu_total, ascii_only=ascii_only) if node.gpu_count else "-"
            gpu_cell = f"  {shown:>11}"
        lines.append(
            f"{_shorten(label, width, glyphs.ellipsis):<{width}}"
            f"  {format_seconds(total, ascii_only=ascii_only):>11}{gpu_cell}"
            f"  {format_seconds(node.self_time, ascii_only=ascii_only):>11}"
            f"  {format_count(node.count):>9}"
            f"  {format_seconds(mean, ascii_only=ascii_only) if node.count else '-':>11}"
            f"  {share:>8}".rstrip()
        )
    return lines


def _gauge_lines(tree: Tree) -> list[str]:
    if not tree.gauges:
        return []
    width = min(_MAX_NAME_WIDTH, max(len(clean_text(name)) for name in tree.gauges))
    lines = [
        "gauges",
        f"  {'gauge':<{width}}  {'value':>12}  {'min':>12}  {'max':>12}  {'count':>9}".rstrip(),
    ]
    for name, gauge in tree.gauges.items():
        lines.append(
            f"  {_shorten(clean_text(name), width, '…'):<{width}}  {gauge.value:>12.6g}"
            f"  {gauge.min:>12.6g}  {gauge.max:>12.6g}  {format_count(gauge.count):>9}"
        )
    return lines


def _metadata_lines(tree: Tree, glyphs: _Glyphs) -> list[str]:
    if not tree.metadata:
        return []
    lines = ["metadata"]
    for key, value in tree.metadata.items():
        shown = _shorten(clean_text(value), _MAX_METADATA_VALUE, glyphs.ellipsis)
        lines.append(f"  {clean_text(key)}: {shown}")
    return lines


def _incomplete_lines(tree: Tree) -> list[str]:
    if tree.complete:
        return []
    lines = ["INCOMPLETE: this tree was built from a partial or sampled set of spans."]
    lines.extend(f"  - {clean_text(note)}" for note in tree.notes)
    return lines


def main_process_root(tree: Tree) -> TreeNode:
    """A copy of the root with every worker's blocks taken out: the main process's own tree."""
    root = tree.root.copy()
    for worker in tree.workers:
        node: TreeNode | None = root
        for name in worker.path:
            node = node.children.get(name) if node is not None else None
        if node is not None:
            node.subtract_children(worker.node)
    return root


def worker_label(worker: WorkerInfo) -> str:
    """``worker rollout #3 (pid 4242)``."""
    role = clean_text(worker.role) or "worker"
    return f"{role} #{worker.index} (pid {worker.pid})"


def _worker_total(worker: WorkerInfo) -> float:
    # The node that hosts a worker's blocks has no time of its own.
    return worker.node.total or sum(child.total for child in worker.node.children.values())


def render(tree: Tree, *, per_process: bool = False, ascii_only: bool = False) -> str:
    """The tree view of `tree` as text, ending with a newline.

    With `per_process`, one section for the main process (the worker blocks taken out) and one
    per entry of ``tree.workers``. `ascii_only` draws with ASCII instead of box characters.
    """
    glyphs = _ASCII if ascii_only else _UNICODE
    gpu = tree.has_gpu()
    lines = _incomplete_lines(tree)
    if per_process:
        main = main_process_root(tree)
        lines.append("== main process ==")
        lines.extend(_node_table(clean_text(tree.root.name), main, glyphs, main.total, gpu))
        for worker in tree.workers:
            where = " / ".join(clean_text(p) for p in worker.path) or clean_text(tree.root.name)
            lines.append("")
            lines.append(f"== worker {worker_label(worker)}, started under {where} ==")
            lines.extend(
                _node_table(worker_label(worker), worker.node, glyphs, _worker_total(worker), gpu)
            )
    else:
        lines.extend(
            _node_table(clean_text(tree.root.name), tree.root, glyphs, tree.root.total, gpu)
        )
    if any(node.is_parallel for _, node in tree.root.walk()):
        lines.append("")
        lines.append(
            f"{glyphs.parallel.strip()} ran in parallel (another thread or process, summed): where "
            "a branch starts, its % parent is a multiple of the parent's time "
            f"(2.00{'x' if ascii_only else '×'} = twice as long)."
        )
    if gpu:
        lines.append("")
        lines.append(
            "gpu: time the block's work took on the GPU (CUDA events; blocks opted in only, "
            "'-' where not measured)."
        )
    for extra in (_gauge_lines(tree), _metadata_lines(tree, glyphs)):
        if extra:
            lines.append("")
            lines.extend(extra)
    return "\n".join(lines) + "\n"
