"""The worker tally (issue 16): a relaying worker's record count in a shared file, read after
the worker was SIGKILLed. The whole path (a real worker killed, the parent's exact count) is
`test_processes.test_sigkill_of_a_worker_is_counted_exactly_and_its_open_block_cut_short`."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
import textwrap

from otel_rl._internal import recorder, tallyfile
from tests.faults.helpers import ROOT, env

KILLED = """
import os, signal, sys, threading
import otel_rl
from otel_rl._internal import tallyfile
from otel_rl.timers import hierarchical_timer as t

otel_rl.configure(output_dir=sys.argv[1], spans="all", flush_interval=3600)
print(tallyfile.share("test"), flush=True)

def steps():
    for _ in range(1000):
        with t("step"):
            with t("inner"):
                pass

threads = [threading.Thread(target=steps) for _ in range(3)]
for th in threads:
    th.start()
for th in threads:
    th.join()
with t("open"):
    with t("also open"):
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _body(function: object) -> list[str]:
    """The code of a function after its signature and docstring."""
    lines = [line.strip() for line in
             textwrap.dedent(inspect.getsource(function)).splitlines()]  # type: ignore[arg-type]
    start = lines.index("st = self._stack")
    return [line for line in lines[start:] if line]


def test_tallied_enter_is_the_plain_enter_plus_one_store() -> None:
    plain = _body(recorder._untallied_enter)
    tallied = _body(recorder._tallied_enter)
    assert "self._sid = next(_ids)" in plain
    assert [line.replace("tally[st.slot] = ", "") for line in tallied] == plain


def test_a_sigkilled_process_leaves_its_exact_count(tmp_path: object) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    path = proc.stdout.strip()
    try:
        # 3 threads x 1000 steps x 2 blocks, and the 2 blocks open when it died.
        assert tallyfile.count(path) == 3 * 1000 * 2 + 2
    finally:
        tallyfile.remove(path)
    assert tallyfile.count(path) is None  # removed


MANY_THREADS = """
import os, signal, sys, threading
import otel_rl
from otel_rl._internal import recorder, tallyfile
from otel_rl.timers import hierarchical_timer as t

otel_rl.configure(output_dir=sys.argv[1], spans="all", flush_interval=3600,
                  max_buffer=1_000_000)
print(tallyfile.share("many"), flush=True)
threading.stack_size(256 * 1024)
hold = threading.Event()

def steps():
    with t("step"):
        with t("inner"):
            pass
    hold.wait()  # alive until all have run: each thread its own stack (idents not reused)

threads = [threading.Thread(target=steps) for _ in range(5000)]
for th in threads:
    th.start()
slots = {st.slot for st in recorder.all_stacks()}
print(len(recorder.all_stacks()), len(slots), len(recorder.tally), flush=True)
with t("open"):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_more_than_4094_threads_each_keep_a_slot_and_the_count_stays_exact(
        tmp_path: object) -> None:
    proc = subprocess.run([sys.executable, "-c", MANY_THREADS, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    path, sizes = proc.stdout.splitlines()
    stacks, slots, length = map(int, sizes.split())
    try:
        assert stacks > 5000 and slots == stacks  # no two stacks share a slot
        assert length > recorder.TALLY_SLOTS  # the file grew (same file, mapped larger)
        # 5000 threads x 2 blocks, and the main thread's block open when it died.
        assert tallyfile.count(path) == 5000 * 2 + 1
    finally:
        tallyfile.remove(path)
