"""A full disk, and trees deep, wide and many-threaded: readable files, an exact ledger
(issue 16).

The full disk is a small tmpfs the test mounts (needs root, as CI has; skipped otherwise,
saying so).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_rl._internal.tree import Tree
from tests.faults import helpers
from tests.faults.helpers import ROOT, blocks, cli, env, exit_lines, file_spans, ledger, lost
from tests.faults.workload import expected_blocks


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs, unmounted afterwards."""
    with helpers.small_tmpfs(tmp_path, "3m") as mount:
        yield mount


def test_full_disk_keeps_timers_json_whole_lines_and_one_accurate_line(small_disk: Path) -> None:
    from tests.faults.helpers import run_workload

    blocks_per_thread = 1500  # ~24,000 spans: about 6 MB of spans file for a 3 MiB disk
    out = small_disk / "run"
    proc, _ = run_workload(out, "--blocks", str(blocks_per_thread))
    assert proc.returncode == 0, proc.stderr  # training untouched
    # timers.json is there and whole: the spans file stopped before taking its room.
    tree = json.loads((out / "timers.json").read_text())
    assert tree["children"]["main"]["count"] == 1
    book = ledger(out)
    assert book is not None
    file = book["sinks"]["file"]
    spans_path = out / "spans.otlp.jsonl"
    assert spans_path.read_text().endswith("\n")  # no torn last line
    spans = file_spans(spans_path)
    assert file["delivered"] == len(spans)
    assert set(file["lost"]) == {"disk full"}
    assert file["delivered"] + lost(file) == file["recorded"]
    assert blocks(spans) < expected_blocks(blocks_per_thread)
    # One line, and it is the ledger's: nothing else warned.
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("otel_rl:")]
    (line,) = warnings
    assert f"{lost(file)} of {file['recorded']} lost (disk full {lost(file)})" in line
    assert exit_lines(proc.stderr) == [line]
    # The readers: timers.json is complete. The spans file's tree comes from its aggregate
    # spans (exact) when the last one fitted, else it is partial and says so.
    assert cli("report", str(out / "timers.json")).returncode == 0
    rebuilt = small_disk.parent / "t.json"
    result = cli("tree", str(spans_path), "-o", str(rebuilt))
    assert result.returncode in (0, 3), result.stderr
    if result.returncode == 0:
        written = Tree.from_json((out / "timers.json").read_text())
        again = Tree.from_json(rebuilt.read_text())
        for key in ("otel_rl_ledger", "otel_rl_dropped_spans"):  # the ledger as it ended,
            written.metadata.pop(key)  # and as it was when the aggregate was made
            again.metadata.pop(key, None)
        assert again == written
    else:  # no final aggregate: built from the spans that fitted, and said to be partial
        assert json.loads(rebuilt.read_text())["complete"] is False
    print(f"LEDGER disk full: recorded {file['recorded']} / file delivered {len(spans)} / "
          f"lost {file['lost']}")


DEEP = """
import sys, otel_rl
from otel_rl.timers import hierarchical_timer
otel_rl.configure(output_dir=sys.argv[1], spans="all", timers_interval=1, flush_interval=0.2)
stack = []
for i in range(int(sys.argv[2])):
    t = hierarchical_timer(f"level{i % 10}")
    t.__enter__()
    stack.append(t)
import time; time.sleep(1.5)  # periodic timers.json and flushes while 10,000 blocks are open
for t in reversed(stack):
    t.__exit__(None, None, None)
"""


def test_ten_thousand_deep_run_writes_a_linear_timers_json(tmp_path: Path) -> None:
    sizes = {}
    for depth in (1000, 10_000):
        out = tmp_path / str(depth)
        proc = subprocess.run([sys.executable, "-c", DEEP, str(out), str(depth)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT, env=env())
        assert proc.returncode == 0 and "otel_rl" not in proc.stderr, proc.stderr
        sizes[depth] = (out / "timers.json").stat().st_size
        spans = file_spans(out / "spans.otlp.jsonl")
        assert blocks(spans) == depth
        assert ledger(out) is None  # nothing lost
        assert cli("report", str(out / "timers.json")).returncode == 0
        result = cli("tree", str(out / "spans.otlp.jsonl"), "-o", str(out / "tree.json"))
        assert result.returncode == 0, result.stderr
        assert Tree.from_json((out / "tree.json").read_text()) == Tree.from_json(
            (out / "timers.json").read_text())
    # Linear in depth: ten times deeper, about ten times larger (quadratic would be 100x).
    assert sizes[10_000] < 12 * sizes[1000]
    print(f"SIZES timers.json: depth 1,000 {sizes[1000]:,} B; depth 10,000 {sizes[10_000]:,} B")


WIDE = """
import sys, threading, otel_rl
from otel_rl.timers import hierarchical_timer
otel_rl.configure(output_dir=sys.argv[1], spans="all", flush_interval=0.1)
def work(t):
    for i in range(int(sys.argv[3])):
        with hierarchical_timer(f"block{t}_{i % 500}"):
            pass
threads = [threading.Thread(target=work, args=(t,)) for t in range(int(sys.argv[2]))]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_wide_tree_many_threads_every_block_accounted(tmp_path: Path) -> None:
    threads, per_thread = 64, 400  # 25,600 blocks; 64 x 500 distinct names at most
    proc = subprocess.run([sys.executable, "-c", WIDE, str(tmp_path), str(threads),
                           str(per_thread)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env())
    assert proc.returncode == 0, proc.stderr
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    assert blocks(spans) == threads * per_thread
    assert ledger(tmp_path) is None and exit_lines(proc.stderr) == []
    tree = json.loads((tmp_path / "timers.json").read_text())
    assert sum(child["count"] for child in tree["children"].values()) == threads * per_thread
    print(f"LEDGER wide/many threads: expected {threads * per_thread} / file "
          f"{blocks(spans)} / lost 0")


def test_small_span_buffer_counts_buffer_full_exactly(tmp_path: Path) -> None:
    threads, per_thread = 8, 2000
    script = WIDE.replace('flush_interval=0.1', 'flush_interval=3600, max_buffer=1000')
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(threads),
                           str(per_thread)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env())
    assert proc.returncode == 0, proc.stderr
    spans = file_spans(tmp_path / "spans.otlp.jsonl")
    book = ledger(tmp_path)
    assert book is not None
    file = book["sinks"]["file"]
    assert set(file["lost"]) == {"buffer full"}
    assert blocks(spans) + file["lost"]["buffer full"] == threads * per_thread
    assert file["delivered"] == len(spans)
    print(f"LEDGER buffer full: expected {threads * per_thread} / file {blocks(spans)} / "
          f"lost {file['lost']}")
