"""The spans file's writer keeps the spans report.html's timeline shows and leaves them in a
side file (`timeline_side`, issue 19): the timeline read from it is the one a read of the whole
spans file gives, and the side file is used only while it describes the spans file."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_rl._internal import runreport, semconv, timeline_side
from otel_rl._internal.otlp.records import Batch
from otel_rl._internal.readers import timeline
from otel_rl._internal.readers.boundary import DEFAULT_LIMITS
from otel_rl._internal.record import STARTER_ENDED, Record
from otel_rl._internal.sinks.base import Stats
from otel_rl._internal.sinks.file import FileSink
from otel_rl._internal.tree import Tree
from otel_rl.renderers import html
from tests.faults.helpers import small_tmpfs

OFFSET = 1_790_000_000_000_000_000


def _batches(n: int, seed: int = 1) -> list[Batch]:
    """`n` records in batches of two processes: plain blocks with long-tailed durations and
    many ties (equal durations, equal starts), blocks with errors, attributes and links, blocks
    whose starter ended, and aggregate spans (which the timeline leaves out)."""
    rng = random.Random(seed)
    resources = [{semconv.SERVICE_NAME: "train", semconv.PROCESS_PID: pid} for pid in (11, 12)]
    batches = []
    t = 1_000_000
    left = n
    while left:
        records: list[Record] = []
        for _ in range(min(left, rng.randint(1, 700))):
            duration = rng.choice((1000, 2000, int(rng.lognormvariate(9, 2))))
            t += rng.choice((0, 10, 5000))
            extra = None
            pick = rng.random()
            if pick < 0.02:
                extra = {"error": ("ValueError", "bad", "stack")}
            elif pick < 0.04:
                extra = {"attrs": {semconv.KIND: semconv.KIND_AGGREGATE}}
            elif pick < 0.06:
                extra = {"attrs": {"x": 1.5}, "link": (5, 6)}
            elif pick < 0.2:
                extra = STARTER_ENDED  # (the shared extra the windows give, written fast)
            records.append((rng.getrandbits(64), rng.getrandbits(64) if rng.random() < 0.9 else 0,
                            f"block{rng.randint(0, 30)}", t, t + duration, rng.choice((7, 8)),
                            rng.getrandbits(128), extra))
        left -= len(records)
        batches.append(Batch(rng.choice(resources), OFFSET, records, {7: "MainThread"}))
    return batches


def _write(path: Path, batches: list[Batch]) -> FileSink:
    sink = FileSink(str(path), Stats(), timeline=True)
    for i in range(0, len(batches), 5):
        sink.export(batches[i:i + 5], deadline=float("inf"))
    return sink


def _full(path: Path, cap: int) -> timeline.TimelineSample:
    """The timeline from a read of the whole spans file (the side file set aside)."""
    side = Path(timeline_side.side_path(path))
    hidden = side.with_name(side.name + ".away")
    side.rename(hidden)
    try:
        return timeline.timeline_spans(path, cap)
    finally:
        hidden.rename(side)


def _from_side(path: Path, cap: int) -> timeline.TimelineSample:
    sample = timeline._from_side(path, cap, DEFAULT_LIMITS)
    assert sample is not None
    return sample


def _tree() -> Tree:
    return Tree.from_json('{"name": "root", "total": 1.0, "count": 1, "children": {}}')


def test_the_side_file_holds_what_a_full_read_chooses(tmp_path: Path) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    batches = _batches(12_000)
    _write(path, batches).shutdown(float("inf"))
    aggregates = sum(1 for b in batches for r in b.records
                     if r[7] and r[7].get("attrs", {}).get(semconv.KIND) == "aggregate")
    assert aggregates > 0
    head = Path(timeline_side.side_path(path)).read_text().split("\n")[0]
    assert f'"total":{12_000 - aggregates},"kept":{timeline_side.CAP}' in head
    for cap in (1, 37, 1000, timeline_side.CAP):
        fast, full = _from_side(path, cap), _full(path, cap)
        assert list(fast) == list(full) and fast.total == full.total == 12_000 - aggregates
        assert html.render(_tree(), fast, max_spans=cap) == html.render(_tree(), full,
                                                                         max_spans=cap)
    assert timeline._from_side(path, timeline_side.CAP + 1, DEFAULT_LIMITS) is None


def test_the_writers_kept_spans_make_the_timeline_a_full_read_makes(tmp_path: Path) -> None:
    # What report.html's main process draws (`runreport`, from the spans the sink kept as it
    # wrote them): span for span, attributes included, what a read of the whole file gives.
    path = tmp_path / "spans.otlp.jsonl"
    sink = _write(path, _batches(12_000, seed=3))
    sink.shutdown(float("inf"))
    kept = sink.timeline_spans()
    assert kept is not None
    drawn, full = runreport._sample(*kept), _full(path, timeline_side.CAP)
    assert drawn is not None and list(drawn) == list(full) and drawn.total == full.total
    assert any(s.attributes.get(semconv.STARTER_ENDED) for s in drawn)
    assert html.render(_tree(), drawn) == html.render(_tree(), full)


def test_spans_of_one_name_share_a_conversion_only_with_the_same_extra() -> None:
    # report.html converts one span of each (name, thread, resource) through the reader and
    # makes the others like it: a starter-ended span, one with an empty extra and one with
    # none keep their own attributes.
    resource = '{"attributes":[{"key":"service.name","value":{"stringValue":"s"}}]}'
    items = [((sid, 2, "a", 10, 10 + sid, 5, 9, extra), OFFSET, "T", resource)
             for sid, extra in ((1, STARTER_ENDED), (2, {}), (3, None), (4, STARTER_ENDED))]
    drawn = runreport._sample(items, len(items))
    assert [s.attributes.get(semconv.STARTER_ENDED) for s in drawn] == [True, None, None, True]
    assert all(s.attributes[semconv.THREAD_NAME] == "T" for s in drawn)


def test_a_side_file_that_no_longer_describes_the_spans_file_is_not_used(
        tmp_path: Path) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    _write(path, _batches(8000)).shutdown(float("inf"))
    side = Path(timeline_side.side_path(path))
    # The side file is what is read: a name changed in it shows on the page...
    side.write_text(side.read_text().replace('"name":"block', '"name":"BLOCK'))
    assert all(s.name.startswith("BLOCK") or s.attributes.get(semconv.KIND)
               for s in timeline.timeline_spans(path, 100))
    # ... until the spans file changes: touched, or appended to, the file itself is read.
    os.utime(path)
    assert timeline._from_side(path, 100, DEFAULT_LIMITS) is None
    assert all(s.name.startswith("block") for s in timeline.timeline_spans(path, 100))
    lines = path.read_bytes().splitlines(keepends=True)
    with path.open("ab") as f:
        f.write(lines[0])
    assert timeline._from_side(path, 100, DEFAULT_LIMITS) is None


@pytest.mark.parametrize("damage", ["bad json", "torn", "header only", "fewer spans",
                                    "total too small", "fifo", "directory"])
def test_a_damaged_side_file_falls_back_to_the_whole_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    _write(path, _batches(7000)).shutdown(float("inf"))
    side = Path(timeline_side.side_path(path))
    expected = _full(path, 500)
    head, body = side.read_text().split("\n", 1)
    if damage == "bad json":
        side.write_text(head + "\n" + body.replace("traceId", "trace\x01Id", 1))
    elif damage == "torn":
        side.write_text(head + "\n" + body[: len(body) // 2])
    elif damage == "header only":
        side.write_text(head + "\n")
    elif damage == "fewer spans":
        side.write_text(head.replace('"kept":5000', '"kept":5001') + "\n" + body)
    elif damage == "total too small":
        side.write_text(re.sub(r'"total":\d+', '"total":5000', head) + "\n" + body)
    elif damage == "fifo":
        side.unlink()
        os.mkfifo(side)
    else:
        side.unlink()
        side.mkdir()
    assert timeline._from_side(path, 500, DEFAULT_LIMITS) is None
    again = timeline.timeline_spans(path, 500)
    assert list(again) == list(expected) and again.total == expected.total


def test_no_side_file_for_a_file_the_timeline_shows_whole(tmp_path: Path) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    _write(path, _batches(timeline_side.CAP)).shutdown(float("inf"))
    assert path.exists() and not os.path.exists(timeline_side.side_path(path))


def test_a_file_with_an_earlier_writers_spans_gets_no_side_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    _write(path, _batches(6000)).shutdown(float("inf"))
    stale = Path(timeline_side.side_path(path))
    assert stale.exists()
    _write(path, _batches(6000, seed=2)).shutdown(float("inf"))  # a second run, appending
    assert not stale.exists()  # removed when the second writer opened the file
    assert timeline.timeline_spans(path, 10).total > 11_000


def test_a_record_the_reader_would_not_place_makes_the_keeper_give_up(tmp_path: Path) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    batches = _batches(6000)
    r = batches[-1].records[0]
    batches[-1].records[0] = (*r[:3], r[4] + 1, r[4], *r[5:])  # ends before it starts
    _write(path, batches).shutdown(float("inf"))
    assert not os.path.exists(timeline_side.side_path(path))


def test_a_forked_childs_copy_of_the_sink_writes_no_side_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.otlp.jsonl"
    sink = _write(path, _batches(6000))
    pid = os.fork()
    if pid == 0:  # the child shuts down its copy of the parent's sink
        try:
            sink.shutdown(float("inf"))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert not os.path.exists(timeline_side.side_path(path))
    sink.shutdown(float("inf"))
    assert os.path.exists(timeline_side.side_path(path))


@pytest.fixture(params=["4m", "8m"])
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of 4 MiB (the spans file fits, its side file does not beside the room kept for
    timers.json) or 8 MiB (both fit)."""
    with small_tmpfs(tmp_path, request.param) as mount:
        yield mount


def test_the_side_file_leaves_timers_json_its_room(small_disk: Path) -> None:
    path = small_disk / "spans.otlp.jsonl"
    sink = _write(path, _batches(6000))
    sink.shutdown(float("inf"))
    assert timeline.timeline_spans(path, 100).total > timeline_side.CAP  # every span written
    st = os.statvfs(small_disk)
    assert st.f_bavail * st.f_frsize >= sink.reserve
    side = os.path.exists(timeline_side.side_path(path))
    assert side == (os.statvfs(small_disk).f_blocks * st.f_frsize > 6 << 20)
