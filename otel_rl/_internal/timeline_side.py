"""The side file of a spans file: the spans report.html's timeline shows, kept by the writer.

After a run, ``otel-rl run`` writes report.html, whose timeline draws the `CAP` longest spans
of the run's spans file. Finding them meant reading the whole file: ~0.2 s of CPU after a
60,000-step Sample Factory run (7 MB, 20,000 spans), all of it on top of the program's own
(issue 19), and minutes after a long run. The main process's `FileSink` sees every span as it
writes it, so it keeps the longest as it goes (`sinks.timeline.TimelineKeeper`: a subtraction
and a comparison per span) and, once it has written its last line, puts them in a side file
beside the spans file. The report reads that instead while it still describes the spans file
(`readers.timeline`), and checks its spans as it checks the spans file's: the page is the one a
read of the whole spans file gives.

Two lines. The header, a JSON object (`header`): the format's version, the spans file's size
and modification time (ns) when the writer closed it, how many of its spans the timeline
stands for (``total``, aggregate spans left out) and how many are kept (``kept``, the longest);
then one OTLP/JSON request line holding those spans, each spelled as in the spans file, in the
spans file's order. Written only when the spans file has more than `CAP` spans (a smaller file
is read whole quickly), only by the process that wrote the whole spans file, and removed when
a new writer opens it.
"""

from __future__ import annotations

import json
import os

__all__ = ["CAP", "VERSION", "header", "side_path"]

#: Spans the timeline shows at most (`otel_rl.renderers.html.MAX_TIMELINE_SPANS`).
CAP = 5000
VERSION = 1


def side_path(spans_path: str | os.PathLike[str]) -> str:
    """The side file of `spans_path`: a hidden file beside it."""
    folder, name = os.path.split(os.fspath(spans_path))
    return os.path.join(folder, f".{name}.timeline")


def header(size: int, mtime_ns: int, total: int, kept: int) -> str:
    """The side file's first line (no newline)."""
    return json.dumps({"otel_rl_timeline": VERSION, "size": size, "mtime_ns": mtime_ns,
                       "total": total, "kept": kept}, separators=(",", ":"))
