"""report.html written by the run's main process as it shuts down, not by the launcher after.

``otel-rl run`` writes report.html once the program has ended (`cli.run.write_report`): it
reads timers.json back, reads the timeline's spans from the side file (`timeline_side`),
checks them and converts them. After a 20,000-step ML-Agents run that was ~0.15 s of CPU on
top of the program's own (issue 19), for spans the main process had in hand a moment before.
So where the launcher asks for it (`REPORT_ENV`: the folder it would write the report in),
the main process writes the same page as its last step (`write`): the tree from the
timers.json it wrote, the timeline from the spans its `FileSink` kept as it wrote them
(`TimelineKeeper.chosen`), converted as a read of the file converts them. The launcher then
finds the page current (`is_current`) and has nothing to do.

The page is the one the launcher would write: each distinct (name, thread, resource) of the
timeline's spans is converted through the reader itself (spelled as the file spells it,
parsed and checked by the input boundary); the spans that share it differ only in their ids
and times, which are made as the reader makes them (spans whose extra is the shared
`record.STARTER_ENDED` share one such conversion too). A span with any other extra
(attributes, an error, a link) goes through the reader whole. Anything the reader would
refuse, or that is not exactly this process's file, leaves the page to the launcher, as
before.

A stamp beside the page (`STAMP`) holds the size and modification time (ns) of the page and
of the timers.json and spans file it was drawn from; the launcher takes the page as current
only while all three still match. Any change to those files after it (another writer, a
ledger rewrite, a file replaced) makes the launcher write the page again from the files.
"""

from __future__ import annotations

import gc
import json
import os
from typing import Any

__all__ = ["REPORT_ENV", "STAMP", "is_current", "stamp_path", "write"]

_ID64 = 1 << 64
_ID128 = 1 << 128

#: Set by ``otel-rl run`` in the program's environment: the folder it writes report.html
#: in. Only the program's main process writing its files there writes the page itself.
REPORT_ENV = "OTEL_RL_ZEROCODE_REPORT"
#: The page's stamp, a hidden file beside it.
STAMP = ".report.html.stamp"
#: The run's files, as the launcher names them (`tests/test_run_report_main.py` pins them equal).
TIMERS_FILE = "timers.json"
SPANS_FILE = "spans.otlp.jsonl"
REPORT_FILE = "report.html"


def stamp_path(folder: str) -> str:
    return os.path.join(folder, STAMP)


def _state(folder: str) -> dict[str, list[int] | None]:
    """Size and modification time (ns) of the page and its two sources; None: absent."""
    state: dict[str, list[int] | None] = {}
    for name in (REPORT_FILE, TIMERS_FILE, SPANS_FILE):
        try:
            st = os.stat(os.path.join(folder, name))
        except FileNotFoundError:
            state[name] = None
        else:
            state[name] = [st.st_size, st.st_mtime_ns]
    return state


def is_current(folder: str) -> bool:
    """Whether report.html in `folder` was written by the main process from the files there
    as they are now (its stamp matches them all)."""
    try:
        with open(stamp_path(folder), "rb") as f:
            stamp = json.loads(f.read(4096))
        state = _state(folder)
    except (OSError, ValueError):
        return False
    return type(stamp) is dict and state[REPORT_FILE] is not None and stamp == state


def _remove_stamp(folder: str) -> None:
    try:
        os.unlink(stamp_path(folder))
    except OSError:
        pass


def write(folder: str, timeline: tuple[list[Any], int] | None) -> bool:
    """Write `folder`'s report.html and its stamp, the page `cli.run.write_report` would
    write from the files; `timeline`: what the spans file's writer kept for the timeline
    (`FileSink.timeline_spans`), None if it did not write that file whole. False (nothing
    written) where the page must be left to the launcher.

    The garbage collector is off meanwhile: the page's objects hold no cycles and are gone
    when it returns, while a training process's heap is large (a full collection that the
    page's objects set off took 0.16 s in ML-Agents' trainer, most of what writing it cost)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _write(folder, timeline)
    finally:
        if collecting:
            gc.enable()


def _write(folder: str, timeline: tuple[list[Any], int] | None) -> bool:
    _remove_stamp(folder)
    timers = os.path.join(folder, TIMERS_FILE)
    if not os.path.exists(timers):
        return False  # no report (as the launcher writes none)
    if os.path.exists(os.path.join(folder, SPANS_FILE)):
        if timeline is None:
            return False  # not this process's file: the launcher reads it
        spans = _sample(*timeline)
        if spans is None:
            return False
    else:
        spans = None
    from otel_rl._internal import atomic
    from otel_rl._internal.tree import Tree
    from otel_rl.renderers import html

    with open(timers, encoding="utf-8") as f:
        tree = Tree.from_json(f.read())
    title = f"otel-rl run: {tree.metadata.get('command_line_arguments', '') or folder}"
    atomic.write_text(os.path.join(folder, REPORT_FILE), html.render(tree, spans, title=title))
    atomic.write_text(stamp_path(folder), json.dumps(_state(folder)))
    return True


def _sample(items: list[Any], total: int) -> Any:
    """The `readers.timeline.TimelineSample` a read of the file gives, from the writer's kept
    spans (record, offset, thread name, resource JSON), in the reader's order; None where
    the reader would refuse one of them or the file as a whole."""
    from otel_rl._internal.errors import UserError
    from otel_rl._internal.otlp.records import JsonEncoder
    from otel_rl._internal.readers.boundary import DEFAULT_LIMITS, MAX_TIME_NS, parse_json
    from otel_rl._internal.readers.otlp_json import resource_of, span_from_json
    from otel_rl._internal.readers.timeline import TimelineSample
    from otel_rl._internal.record import STARTER_ENDED
    from otel_rl._internal.spandata import SpanData

    if total > DEFAULT_LIMITS.max_spans:
        return None  # (the reader refuses the file)
    encoder = JsonEncoder()
    resources: dict[str, dict[str, Any]] = {}
    #: (name, thread id, thread name, resource JSON, starter ended) -> a span of them, as the
    #: reader made it
    read: dict[tuple[Any, ...], SpanData] = {}

    def through_reader(record: Any, offset: int, thread_name: str,
                       resource: dict[str, Any]) -> SpanData:
        text = encoder.span(record, offset, {record[5]: thread_name})
        return span_from_json(parse_json(text, "span", DEFAULT_LIMITS), resource, "span")

    spans: list[SpanData] = []
    append = spans.append
    try:
        for record, offset, thread_name, resource_json in items:
            resource = resources.get(resource_json)
            if resource is None:
                item = {"resource": parse_json(resource_json, "resource", DEFAULT_LIMITS)}
                resource = resources[resource_json] = resource_of(item, "resource")[1]
            sid, psid, name, start, end, tid, trace_id, extra = record
            start += offset
            end += offset
            if ((extra and extra is not STARTER_ENDED)
                    or not 0 < sid < _ID64 or not 0 <= psid < _ID64
                    or not 0 < trace_id < _ID128 or not 0 <= start <= end <= MAX_TIME_NS):
                append(through_reader(record, offset, thread_name, resource))
                continue
            # (The shared STARTER_ENDED extra: one attribute more, the same for all of them.)
            key = (name, tid, thread_name, resource_json, extra is STARTER_ENDED)
            like = read.get(key)
            if like is None:
                like = read[key] = through_reader(record, offset, thread_name, resource)
                append(like)
                continue
            append(SpanData(f"{trace_id:032x}", f"{sid:016x}", f"{psid:016x}" if psid else "",
                            like.name, start, end, dict(like.attributes), resource))
    except (UserError, ValueError, TypeError, OverflowError):
        return None
    return TimelineSample(spans, total, [])
