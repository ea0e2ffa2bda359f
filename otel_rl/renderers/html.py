"""The HTML report: one self-contained file with an icicle view, a span timeline and tables.

Everything is inline (CSS, JavaScript, data) and a Content-Security-Policy forbids network
access, so the file opens from disk, from a CI artifact or from an e-mail alike. The data goes
into a ``<script type="application/json">`` block with ``<``, ``>`` and ``&`` escaped, and the
page's script only ever sets text (never markup) from it: timer names come from user code, and
a block named ``<script>`` is shown, not run. The static tables are rendered here, escaped.

Example::

    Path("report.html").write_text(render(tree, spans, title="PPO run 42"), encoding="utf-8")
"""

from __future__ import annotations

import heapq
import html
import json
import math
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

from otel_rl._internal import semconv, timeline_side
from otel_rl._internal.jsonout import dumps
from otel_rl._internal.spandata import SpanData
from otel_rl._internal.tree import Tree, TreeNode
from otel_rl.renderers import crossworker
from otel_rl.renderers.treeview import format_count, format_seconds

__all__ = ["MAX_TIMELINE_SPANS", "render"]

#: Spans drawn in the timeline at most. Beyond it the timeline summarises the whole run: the
#: longest spans (every one at least as long as the shortest shown, with all its parents), so
#: a long run is seen end to end at a coarser grain. The page says so. (The writer of a run's
#: spans file keeps as many of its longest: `timeline_side`.)
MAX_TIMELINE_SPANS = timeline_side.CAP
_TOP_SELF_ROWS = 15
_FLAG_ERROR = 1
_FLAG_MARKER = 2  # a run or process span: context, not a timed block


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _finite(value: float) -> float | None:
    # JSON has no NaN/Infinity; JSON.parse would reject the whole page's data.
    return value if math.isfinite(value) else None


def _node_data(node: TreeNode) -> dict[str, Any]:
    """`node` and its subtree for the page's script (built with an explicit stack: trees can
    be thousands of levels deep)."""
    top = _own_node_data(node)
    todo = [(node, top)]
    while todo:
        source, data = todo.pop()
        if source.children:
            kids = data["k"] = []
            for child in source.children.values():
                child_data = _own_node_data(child)
                kids.append(child_data)
                todo.append((child, child_data))
    return top


def _own_node_data(node: TreeNode) -> dict[str, Any]:
    data: dict[str, Any] = {
        "n": node.name,
        "t": _finite(node.total),
        "s": _finite(node.self_time),
        "c": node.count,
    }
    if node.is_parallel:
        data["p"] = 1
    if node.gpu_count:
        data["g"] = _finite(node.gpu_total)
    return data


def _lane_key(span: SpanData) -> tuple[str, str]:
    pid = span.resource.get(semconv.PROCESS_PID)
    tid = span.attributes.get(semconv.THREAD_ID)
    return ("" if pid is None else str(pid), "" if tid is None else str(tid))


def _lane_label(span: SpanData) -> tuple[str, str]:
    """(process label, thread label) for the lane `span` runs in."""
    res = span.resource
    role = res.get(semconv.WORKER_ROLE)
    if role is not None:
        process = f"{role} #{res.get(semconv.WORKER_INDEX, '?')}"
    else:
        process = str(res.get(semconv.SERVICE_NAME, "process"))
    pid = res.get(semconv.PROCESS_PID)
    if pid is not None:
        process += f" · pid {pid}"
    thread_name = span.attributes.get(semconv.THREAD_NAME)
    thread_id = span.attributes.get(semconv.THREAD_ID)
    if thread_name is not None:
        thread = str(thread_name)
    elif thread_id is not None:
        thread = f"thread {thread_id}"
    else:
        thread = "thread ?"
    return process, thread


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _error_text(span: SpanData) -> str:
    for event in span.events:
        if event.name == "exception":
            kind = event.attributes.get("exception.type", "")
            message = event.attributes.get("exception.message", "")
            return f"{kind}: {message}".strip(": ")
    return "error"


def _lanes(
    spans: Sequence[SpanData],
) -> tuple[list[tuple[str, str]], dict[tuple[str, str], tuple[str, str]]]:
    """The timeline's lanes (pid, thread id) in display order, and their labels.

    Main processes first, in start order, then workers by role and index; within a process,
    threads by their first span.
    """
    first_by_lane: dict[tuple[str, str], int] = {}
    first_by_pid: dict[str, int] = {}
    worker_by_pid: dict[str, tuple[str, int]] = {}
    labels: dict[tuple[str, str], tuple[str, str]] = {}
    for span in spans:
        key = _lane_key(span)
        if key not in first_by_lane:
            first_by_lane[key] = span.start_ns
            labels[key] = _lane_label(span)
        first_by_pid.setdefault(key[0], span.start_ns)
        component = span.attributes.get(semconv.COMPONENT)
        if component is not None:  # a Sample Factory component runs in this lane: name it
            process, thread = labels[key]
            labels[key] = (process, f"{thread} · {component}")
        role = span.resource.get(semconv.WORKER_ROLE)
        if role is not None:
            worker_by_pid.setdefault(
                key[0], (str(role), _int(span.resource.get(semconv.WORKER_INDEX)))
            )
    order_by_pid: dict[str, tuple[int, str, int, int, str]] = {
        pid: (1, *worker_by_pid[pid], 0, pid) if pid in worker_by_pid else (0, "", 0, first, pid)
        for pid, first in first_by_pid.items()
    }
    lane_keys = sorted(first_by_lane, key=lambda k: (*order_by_pid[k[0]], first_by_lane[k]))
    return lane_keys, labels


def longest(spans: Iterable[SpanData], cap: int) -> list[SpanData]:
    """The `cap` longest spans (the earlier on a tie). A parent lasts at least as long as its
    child and starts no later, so what is kept keeps its parents: a summary of the whole run
    at a coarser grain, not its first seconds."""
    return heapq.nsmallest(cap, spans, key=lambda s: (s.start_ns - s.end_ns, s.start_ns,
                                                      s.span_id))


def _timeline_data(spans: Sequence[SpanData], cap: int) -> dict[str, Any]:
    """Lanes (one per process + thread) and spans as compact rows for the page's script.

    Past `cap` spans the timeline summarises the whole run: the `cap` longest spans. `spans`
    may itself be such a summary, streamed from a larger file (`total` = spans it stood for).
    """
    stood_for = int(getattr(spans, "total", 0) or 0)
    spans = [s for s in spans if s.attributes.get(semconv.KIND) != semconv.KIND_AGGREGATE]
    total = stood_for or len(spans)
    kept = spans if len(spans) <= cap else longest(spans, cap)
    summarised = len(kept) < total
    # Parents before children: by start, the longer first on a tie.
    chosen = sorted(kept, key=lambda s: (s.start_ns, -(s.end_ns - s.start_ns)))
    ordered = chosen
    if not chosen:
        return {"lanes": [], "spans": [], "names": [], "total": total, "shown": 0, "end": 0}
    t0 = chosen[0].start_ns
    lane_keys, labels = _lanes(chosen)
    lane_index = {key: i for i, key in enumerate(lane_keys)}
    names: dict[str, int] = {}
    rows: list[list[Any]] = []
    errors: dict[str, str] = {}
    placed: dict[tuple[str, str], tuple[int, int]] = {}  # (trace, span id) -> (row, depth)
    depth_max = [0] * len(lane_keys)
    for span in chosen:
        lane = lane_index[_lane_key(span)]
        parent = placed.get((span.trace_id, span.parent_span_id))
        depth = 0
        parent_row = -1
        if parent is not None:
            parent_row = parent[0]
            if rows[parent_row][0] == lane:
                depth = parent[1] + 1
        depth_max[lane] = max(depth_max[lane], depth)
        flags = 0
        if span.is_error:
            flags |= _FLAG_ERROR
            errors[str(len(rows))] = _error_text(span)
        if span.attributes.get(semconv.KIND) in (semconv.KIND_RUN, semconv.KIND_PROCESS,
                                                 semconv.KIND_WINDOW):
            flags |= _FLAG_MARKER
        placed[(span.trace_id, span.span_id)] = (len(rows), depth)
        rows.append(
            [
                lane,
                (span.start_ns - t0) / 1e6,
                (max(span.end_ns, span.start_ns) - t0) / 1e6,
                depth,
                names.setdefault(span.name, len(names)),
                flags,
                parent_row,
            ]
        )
    return {
        "lanes": [
            {"process": labels[k][0], "thread": labels[k][1], "depth": depth_max[i] + 1}
            for i, k in enumerate(lane_keys)
        ],
        "spans": rows,
        "names": list(names),
        "errors": errors,
        "total": total,
        "shown": len(rows),
        "end": max(row[2] for row in rows),
        "runEnd": (max(s.end_ns for s in ordered) - t0) / 1e6,
        # Summarised: every span at least this long is shown (ms), over the whole run.
        "minMs": min(s.end_ns - s.start_ns for s in chosen) / 1e6 if summarised else 0,
    }


def _json_script(data: Any) -> str:
    text = dumps(data, ensure_ascii=False, separators=(",", ":"))
    # Inside <script> only "</" could end the block; escaping every <, > and & also keeps
    # "<!--" and entity-like text inert.
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _table(element_id: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{element_id}" class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _gauges_html(tree: Tree) -> str:
    if not tree.gauges:
        return '<p class="empty">No gauges were recorded.</p>'
    rows = [
        [
            f'<span class="name">{_esc(name)}</span>',
            _esc(f"{g.value:.6g}"),
            _esc(f"{g.min:.6g}"),
            _esc(f"{g.max:.6g}"),
            _esc(format_count(g.count)),
        ]
        for name, g in tree.gauges.items()
    ]
    return _table("gauges", ["gauge", "value", "min", "max", "count"], rows)


def _metadata_html(tree: Tree) -> str:
    if not tree.metadata:
        return '<p class="empty">No metadata was recorded.</p>'
    rows = [[f'<span class="name">{_esc(k)}</span>', _esc(v)] for k, v in tree.metadata.items()]
    return _table("metadata", ["key", "value"], rows)


def _path_key(path: Sequence[str]) -> str:
    """A node's path as the page's script keys it (``JSON.stringify`` of the names)."""
    return json.dumps(list(path), ensure_ascii=False, separators=(",", ":"))


def _crumbs(path: Sequence[str]) -> str:
    parents = list(path[:-1])
    if len(parents) > 8:  # a deep tree: the first and last few levels
        parents = [*parents[:3], f"… {len(parents) - 6:,} levels …", *parents[-3:]]
    return " &rsaquo; ".join(_esc(p) for p in parents)


def _hotspots_html(tree: Tree) -> str:
    everything = list(tree.root.walk())
    nodes = sorted(everything, key=lambda item: -item[1].self_time)[:_TOP_SELF_ROWS]
    root_total = tree.root.total
    rows = []
    for path, node in nodes:
        share = f"{100 * node.self_time / root_total:.1f}%" if root_total > 0 else "-"
        crumbs = _crumbs(path)
        mark = '<span class="par" title="parallel branch">&#8741;</span> ' if node.is_parallel else ""
        rows.append(
            [
                f'{mark}<span class="name hot" data-path="{_esc(_path_key(path))}">'
                f"{_esc(path[-1])}</span>"
                + (f'<div class="crumbs">{crumbs}</div>' if crumbs else ""),
                _esc(format_seconds(node.self_time)),
                _esc(share),
                _esc(format_seconds(node.total)),
                _esc(format_count(node.count)),
            ]
        )
    if not rows:
        return '<p class="empty">The tree has no timed blocks.</p>'
    table = _table("hotspots", ["block", "self", "% of run", "total", "count"], rows)
    # Self times of parallel blocks ran beside the main process: over all blocks they can add
    # up to more than the run. Say so rather than let the column look wrong.
    summed = tree.root.self_time + sum(node.self_time for _, node in everything)
    if root_total > 0 and summed > root_total * 1.0005:
        table += (
            f'<p id="hotspots-note" class="hint">Over all blocks, "% of run" adds up to '
            f"{100 * summed / root_total:,.0f}%, past 100%: parallel blocks (&#8741;) ran beside "
            "the main process, in other threads or processes, and their time is summed over "
            "them.</p>"
        )
    return table


def _gpu_html(tree: Tree) -> str:
    """GPU-timed blocks: wall time beside GPU time (empty when no block has GPU time)."""
    rows = []
    for path, node in tree.root.walk():
        if not node.gpu_count:
            continue
        crumbs = " &rsaquo; ".join(_esc(p) for p in path[:-1])
        ratio = f"{node.gpu_total / node.total:.2f}&times;" if node.total > 0 else "-"
        rows.append(
            [
                f'<span class="name" data-path="{_esc(_path_key(path))}">{_esc(path[-1])}</span>'
                + (f'<div class="crumbs">{crumbs}</div>' if crumbs else ""),
                _esc(format_seconds(node.total)),
                _esc(format_seconds(node.gpu_total)),
                ratio,
                _esc(f"{format_count(node.gpu_count)} / {format_count(node.count)}"),
            ]
        )
    if not rows:
        return ""
    return (
        '<section class="card" id="gpu-section"><h2>GPU time <span class="sub">blocks opted '
        "in to GPU timing</span></h2><p class=\"hint\">CPU timers put asynchronous GPU work "
        "in whichever block waits for it; the GPU column is the time each block's own work "
        "took on the device (CUDA events).</p>"
        + _table("gpu", ["block", "total (wall)", "gpu", "gpu / wall", "runs measured"], rows)
        + "</section>"
    )


def _workers_html(tree: Tree) -> str:
    sections: list[str] = []
    gpu = tree.has_gpu()
    for summary in crossworker.summarize(tree):
        rows = []
        for stats in summary.nodes:
            name = stats.path[-1] if stats.path else "(all blocks)"
            indent = len(stats.path) * 14
            spread = stats.max_total / stats.mean_total if stats.mean_total > 0 else 1.0
            gpu_cells = []
            if gpu:
                mean, top = stats.mean_gpu, stats.max_gpu
                gpu_cells = [_esc(format_seconds(mean)) if mean is not None else "-",
                             _esc(format_seconds(top)) if top is not None else "-"]
            rows.append(
                [
                    f'<span class="name" style="padding-left:{indent}px">{_esc(name)}</span>',
                    f"{len(stats.totals)}/{len(summary.workers)}",
                    _esc(format_seconds(stats.min_total)),
                    _esc(format_seconds(stats.mean_total)),
                    _esc(format_seconds(stats.max_total)),
                    f'<span class="{"warn" if spread > 1.2 else ""}">{spread:.2f}&times;</span>',
                    *gpu_cells,
                    _esc(f"#{stats.slowest.index} (pid {stats.slowest.pid})"),
                ]
            )
        heading = f"{summary.role or 'worker'} — {len(summary.workers)} workers"
        sections.append(
            f'<h3 class="role">{_esc(heading)}</h3>'
            + _table(
                f"workers-{len(sections)}",
                ["block", "workers", "total min", "mean", "max", "max/mean",
                 *(["gpu mean", "gpu max"] if gpu else []), "slowest"],
                rows,
            )
        )
    return "".join(sections)


def _asset(name: str) -> str:
    return resources.files("otel_rl.renderers").joinpath(name).read_text(encoding="utf-8")


def render(
    tree: Tree,
    spans: Sequence[SpanData] | None = None,
    *,
    title: str = "otel-rl report",
    max_spans: int = MAX_TIMELINE_SPANS,
) -> str:
    """One self-contained HTML page for `tree`; with `spans`, a timeline of them too."""
    timeline = None if spans is None else _timeline_data(spans, max_spans)
    data = {
        "title": title,
        "tree": _node_data(tree.root),
        "complete": tree.complete,
        "timeline": timeline,
    }
    blocks = sum(1 for _ in tree.root.walk())
    facts = [
        ("total", format_seconds(tree.root.total)),
        ("blocks", format_count(blocks)),
        ("workers", format_count(len(tree.workers))),
    ]
    if timeline is not None:
        facts.append(("spans", format_count(timeline["total"])))
    facts_html = "".join(
        f'<div class="fact"><div class="value">{_esc(v)}</div><div class="label">{_esc(k)}</div></div>'
        for k, v in facts
    )
    banner = ""
    if not tree.complete:
        notes = "".join(f"<li>{_esc(note)}</li>" for note in tree.notes)
        banner = (
            '<div id="incomplete" class="banner"><strong>Incomplete tree.</strong> It was built '
            f"from a partial or sampled set of spans; totals are lower bounds.<ul>{notes}</ul></div>"
        )
    workers = _workers_html(tree)
    workers_section = (
        f'<section class="card"><h2>Workers</h2><p class="hint">Each worker role merged: '
        f"the spread between the fastest and the slowest worker per block.</p>{workers}</section>"
        if workers
        else ""
    )
    return _TEMPLATE.format(
        title=_esc(title),
        css=_asset("report.css"),
        js=_asset("report.js"),
        data=_json_script(data),
        facts=facts_html,
        banner=banner,
        hotspots=_hotspots_html(tree),
        gpu=_gpu_html(tree),
        workers=workers_section,
        gauges=_gauges_html(tree),
        metadata=_metadata_html(tree),
    )


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="otel-rl">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<header class="top">
  <div><div class="brand">otel-rl</div><h1 id="title">{title}</h1></div>
  <div class="facts">{facts}</div>
</header>
<main>
{banner}
<section class="card" id="tree-section">
  <div class="toolbar">
    <h2>Timer tree</h2>
    <div class="controls">
      <input id="search" type="search" placeholder="Highlight blocks…" aria-label="highlight blocks by name">
      <div class="seg" role="group" aria-label="metric">
        <button id="mode-total" class="active" type="button">Total</button><button id="mode-self" type="button">Self</button>
      </div>
      <button id="zoom-reset" type="button" disabled>Reset zoom</button>
    </div>
  </div>
  <div id="breadcrumb" class="crumbs"></div>
  <div id="icicle" data-mode="total" data-zoom="[]"></div>
  <div id="icicle-notes"></div>
  <div class="legend">width = total time, one scale: a block's share of its parent's width is its share of its parent's time · <span class="swatch parallel-swatch"></span> parallel branch (other threads or processes, summed): fills the width its serial siblings leave, drawn smaller (dashed) when its time needs more<span id="legend-mode"></span> · click a block to zoom in, an ancestor to zoom out</div>
</section>
<section class="card" id="hotspots-section"><h2>Where the time goes <span class="sub">blocks by self time</span></h2>{hotspots}</section>
{gpu}
<section class="card" id="timeline-section">
  <div class="toolbar"><h2>Timeline</h2><div class="controls"><button id="timeline-reset" type="button" disabled>Reset zoom</button></div></div>
  <p id="timeline-note" class="hint"></p>
  <div id="timeline"></div>
</section>
{workers}
<div class="two">
<section class="card" id="gauges-section"><h2>Gauges</h2>{gauges}</section>
<section class="card" id="metadata-section"><h2>Metadata</h2>{metadata}</section>
</div>
</main>
<div id="tooltip" role="tooltip" hidden></div>
<script id="report-data" type="application/json">{data}</script>
<script>{js}</script>
</body>
</html>
"""
