"""The timeline of ``otel-rl run``'s report.html, read without converting every span
(`readers.timeline`), is the page a full read of the spans file gives: on a real multi-process
run's output (several processes, windows of ``spans="auto"``, an aggregate span), with a torn
last line, with bad lines, with spans spelled otherwise than otel_rl writes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_rl._internal.cli import run as run_command
from otel_rl._internal.errors import UserError
from otel_rl._internal.readers import timeline
from otel_rl._internal.readers.boundary import DEFAULT_LIMITS
from otel_rl._internal.readers.otlp_json import read_otlp_json_file, torn_last_lines_skipped
from otel_rl._internal.readers.timeline import timeline_spans
from otel_rl._internal.tree import Tree
from otel_rl.renderers import html

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: 2 spawn rollout workers, a learner thread and the main loop, ``auto``
    windows of 0.2 s, every one kept, so that there are more spans than the timeline shows
    (`tests.long_workloads sf`)."""
    out = tmp_path_factory.mktemp("run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "tests.long_workloads", "sf", str(out), "n=6000", "workers=2",
         "window=0.2", "sample_every=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture
def run_dir(real_run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(real_run, folder)
    return folder


def _pages(folder: Path, cap: int) -> tuple[str, str]:
    """The page from a full read and the page from the timeline reader."""
    tree = Tree.from_json((folder / "timers.json").read_text())
    spans_file = folder / "spans.otlp.jsonl"
    with torn_last_lines_skipped(True):
        full = read_otlp_json_file(spans_file)
    fast = timeline_spans(spans_file, cap)
    return (html.render(tree, full, title="t", max_spans=cap),
            html.render(tree, fast, title="t", max_spans=cap))


def test_the_real_run_output_has_what_the_timeline_must_handle(real_run: Path) -> None:
    spans = read_otlp_json_file(real_run / "spans.otlp.jsonl")
    kinds = {s.attributes.get("otel_rl.kind") for s in spans}
    assert {"run", "process", "window", "aggregate", None} <= kinds
    assert len({s.resource.get("process.pid") for s in spans}) == 3  # main + 2 workers
    assert len(spans) > html.MAX_TIMELINE_SPANS  # the timeline summarises


@pytest.mark.parametrize("cap", [1, 37, 1000, html.MAX_TIMELINE_SPANS, 10**7])
def test_the_timeline_equals_a_full_reads_on_a_real_run(run_dir: Path, cap: int) -> None:
    full, fast = _pages(run_dir, cap)
    assert full == fast


def test_the_real_runs_writer_left_the_timelines_spans_beside_its_file(run_dir: Path) -> None:
    """The main process kept the longest spans it wrote (`timeline_side`); the report reads
    them, not the whole file, and they are the spans a full read chooses."""
    spans_file = run_dir / "spans.otlp.jsonl"
    kept = timeline._from_side(spans_file, html.MAX_TIMELINE_SPANS, DEFAULT_LIMITS)
    assert kept is not None
    full = read_otlp_json_file(spans_file)
    plain = [s for s in full if s.attributes.get("otel_rl.kind") != "aggregate"]
    assert list(kept) == html.longest(plain, html.MAX_TIMELINE_SPANS)
    assert kept.total == len(plain) and list(timeline_spans(spans_file, 1000)) == list(kept)[:1000]


def test_the_sample_stands_for_every_span_but_aggregates(run_dir: Path) -> None:
    spans = read_otlp_json_file(run_dir / "spans.otlp.jsonl")
    sample = timeline_spans(run_dir / "spans.otlp.jsonl", 100)
    assert sample.total == sum(s.attributes.get("otel_rl.kind") != "aggregate" for s in spans)
    assert len(sample) == 100 and sample.skipped == []


def test_write_report_writes_the_page_of_a_full_read(run_dir: Path) -> None:
    tree = Tree.from_json((run_dir / "timers.json").read_text())
    title = f"otel-rl run: {tree.metadata.get('command_line_arguments', '') or run_dir}"
    expected = html.render(tree, read_otlp_json_file(run_dir / "spans.otlp.jsonl"), title=title)
    assert run_command.write_report(str(run_dir)) == str(run_dir / "report.html")
    assert (run_dir / "report.html").read_text(encoding="utf-8") == expected


def test_a_torn_last_line_is_skipped_and_said(run_dir: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spans_file = run_dir / "spans.otlp.jsonl"
    lines = spans_file.read_bytes().splitlines(keepends=True)
    with spans_file.open("ab") as f:
        f.write(lines[1][: len(lines[1]) // 2])  # a writer killed mid-line
    full, fast = _pages(run_dir, 500)
    assert full == fast
    assert run_command.write_report(str(run_dir))
    err = capsys.readouterr().err
    assert f"line {len(lines) + 1} was cut off" in err and err.count("\n") == 1


def _rewrite(spans_file: Path, change: object) -> None:
    """Apply `change(span)` to the longest plain span of the file (the timeline shows it)."""
    docs = [json.loads(line) for line in spans_file.read_text().splitlines()]
    spans = [s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    longest = max(spans, key=lambda s: int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]))
    change(longest)  # type: ignore[operator]
    spans_file.write_text("".join(json.dumps(d) + "\n" for d in docs))


def test_spans_spelled_otherwise_are_placed_as_a_full_read_places_them(run_dir: Path) -> None:
    docs = [json.loads(line) for line in (run_dir / "spans.otlp.jsonl").read_text().splitlines()]
    for n, span in enumerate(s for d in docs for rs in d["resourceSpans"]
                             for ss in rs["scopeSpans"] for s in ss["spans"]):
        if n % 3 == 0:  # proto field names and integer times
            span["start_time_unix_nano"] = int(span.pop("startTimeUnixNano"))
            span["end_time_unix_nano"] = int(span.pop("endTimeUnixNano"))
        elif n % 3 == 1:  # base64 ids, upper-case hex trace id
            import base64

            span["spanId"] = base64.b64encode(bytes.fromhex(span["spanId"])).decode()
            span["traceId"] = span["traceId"].upper()
    (run_dir / "spans.otlp.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    for cap in (50, html.MAX_TIMELINE_SPANS):
        full, fast = _pages(run_dir, cap)
        assert full == fast


def test_a_bad_span_that_is_shown_is_refused_in_one_line(run_dir: Path) -> None:
    spans_file = run_dir / "spans.otlp.jsonl"
    _rewrite(spans_file, lambda s: s.update(traceId="not-an-id"))
    with pytest.raises(UserError) as full:
        read_otlp_json_file(spans_file)
    with pytest.raises(UserError) as fast:
        timeline_spans(spans_file, html.MAX_TIMELINE_SPANS)
    assert str(fast.value) == str(full.value)
    assert "bad traceId" in str(fast.value) and "\n" not in str(fast.value)


@pytest.mark.parametrize("line", [b"{not json\n", b'{"resourceSpans": {}}\n', b"[1, 2]\n",
                                  b'{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}\n'])
def test_a_bad_line_is_refused_in_one_line(run_dir: Path, line: bytes) -> None:
    spans_file = run_dir / "spans.otlp.jsonl"
    lines = spans_file.read_bytes().splitlines(keepends=True)
    spans_file.write_bytes(b"".join([lines[0], line, *lines[1:]]))
    with pytest.raises(UserError) as fast:
        timeline_spans(spans_file, html.MAX_TIMELINE_SPANS)
    assert "line 2" in str(fast.value) and "\n" not in str(fast.value)
    with pytest.raises(UserError) as full:
        read_otlp_json_file(spans_file)
    assert str(fast.value) == str(full.value)


def test_the_launcher_says_why_there_is_no_report_in_one_line(run_dir: Path) -> None:
    with (run_dir / "spans.otlp.jsonl").open("ab") as f:
        f.write(b"garbage\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    env["PYTHONPATH"] = str(REPO)
    (run_dir / "report.html").unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "otel_rl", "run", "--output", str(run_dir),
                           "--", "true"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert done.stderr.startswith("otel-rl run: no report.html (")
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert not (run_dir / "report.html").exists()


def test_the_launchers_file_names_are_the_runtimes() -> None:
    from otel_rl._internal import runtime

    assert (run_command.TIMERS_FILE, run_command.SPANS_FILE) == (runtime.TIMERS_FILE,
                                                                 runtime.SPANS_FILE)


def test_an_aggregate_spelled_with_escapes_is_left_out_as_a_full_read_leaves_it(
        run_dir: Path) -> None:
    spans_file = run_dir / "spans.otlp.jsonl"
    text = spans_file.read_bytes()
    assert text.count(b'"stringValue":"aggregate"') == 1
    spans_file.write_bytes(text.replace(b'"stringValue":"aggregate"',
                                        b'"stringValue":"\\u0061ggregat\\u0065"'))
    full = read_otlp_json_file(spans_file)
    assert sum(s.attributes.get("otel_rl.kind") == "aggregate" for s in full) == 1
    assert timeline_spans(spans_file, 10).total == len(full) - 1
    full_page, fast_page = _pages(run_dir, 10)
    assert full_page == fast_page


def test_otel_rl_report_draws_the_timeline_of_a_full_read(run_dir: Path) -> None:
    """`otel-rl report --html` on a spans file with aggregate spans: the tree from them, the
    timeline chosen as from a full read (every line is checked by the aggregate scan)."""
    from otel_rl._internal.cli.report import load_input

    spans_file = run_dir / "spans.otlp.jsonl"
    tree, spans = load_input(spans_file)
    assert spans is not None and len(spans) == html.MAX_TIMELINE_SPANS
    assert html.render(tree, spans, title="t") == html.render(
        tree, read_otlp_json_file(spans_file), title="t")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-m", "otel_rl", "report", str(spans_file), "--html",
                           str(run_dir / "r.html"), "--title", "t"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "r.html").read_text(encoding="utf-8") == html.render(tree, spans,
                                                                            title="t")


_ODD = [None, "", 0, 1, -1, 1.5, True, [], {}, "x", " 12", "12 ", "\uff11\uff12", "\u00b2",
        "0" * 16, "0" * 32, "Ab" * 8, "AB" * 16, "g" * 16, "ab cd ef 01 23 45", "1" * 20,
        "9" * 21, str(2**64 - 1), str(2**64), "0", "-1", "+5", "1_000", "١٢"]


def _outcome(read: object, span: object) -> object:
    try:
        return read(span, {"service.name": "s"}, "where")  # type: ignore[operator]
    except UserError as exc:
        return f"UserError: {exc}"


def test_spans_as_otel_rl_writes_them_read_as_any_span_reads(real_run: Path) -> None:
    """The reader's shortcut for spans spelled as otel_rl writes them (`_span_as_written`)
    gives what the full reading (`_span_any`) gives: the same span, or the same one-line
    error, for every span of a real run and for each of their fields given odd values,
    removed, or joined by fields the shortcut does not read."""
    import copy

    from otel_rl._internal.readers import otlp_json

    docs = [json.loads(line) for line in (real_run / "spans.otlp.jsonl").read_text().splitlines()]
    spans = [s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    taken = [s for s in spans if otlp_json._span_as_written(s, {}, "w") is not None]
    assert len(taken) >= 0.9 * len(spans) > 100  # the shortcut is what reads a run's spans
    for span in spans:
        assert _outcome(otlp_json._span, span) == _outcome(otlp_json._span_any, span)
    samples = [taken[0], max(taken, key=lambda s: len(s.get("attributes") or ())),
               next(s for s in taken if s.get("parentSpanId"))]
    fields = sorted(otlp_json._WRITTEN_FIELDS | {"flags", "trace_id", "start_time_unix_nano",
                                                "droppedAttributesCount"})
    changes = 0
    for sample in samples:
        variants = []
        for field in fields:
            removed = copy.deepcopy(sample)
            removed.pop(field, None)
            variants.append(removed)
            for value in _ODD:
                changed = copy.deepcopy(sample)
                changed[field] = value
                variants.append(changed)
        swapped = copy.deepcopy(sample)
        swapped["startTimeUnixNano"], swapped["endTimeUnixNano"] = (
            str(int(sample["endTimeUnixNano"]) + 1), sample["startTimeUnixNano"])
        variants += [swapped, [sample], "span"]
        for status in ({"code": 2}, {"code": "STATUS_CODE_ERROR"}, {"code": "x"},
                       {"message": 1}, {"code": True}):
            variants.append({**sample, "status": status})
        for attributes in ([1], [{"key": 1}], [{"key": "k", "value": {"intValue": "x"}}],
                           [{"key": "otel_rl.kind", "value": {"stringValue": "nonsense"}}],
                           [{"key": "k", "value": {"doubleValue": 1.5}}]):
            variants.append({**sample, "attributes": attributes})
        variants.append({**sample, "events": [{"name": "e", "timeUnixNano": "5"}]})
        variants.append({**sample, "links": [{"traceId": "1" * 32, "spanId": "2" * 16}]})
        for variant in variants:
            fast = _outcome(otlp_json._span, variant)
            assert fast == _outcome(otlp_json._span_any, variant), variant
            changes += 1
    assert changes > 900
