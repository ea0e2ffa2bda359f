"""What a worker process imports to join a run: nothing heavy it does not use (issue 19).

Every process of a run imports otel_rl at start-up (a spawned worker, each of Sample Factory's
or ML-Agents' processes under ``otel-rl run``), so a module that costs milliseconds to import
costs them once per process. `dataclasses` (with `inspect`) and `hashlib` (which loads OpenSSL)
were each ~3-6 ms of a spawned worker's ~20 ms start-up and used there for nothing a worker
needs; this keeps them out, with `textwrap` (for `configure`'s docstring) and otel_rl's own
modules for RLlib, torchrun and coroutines handed to another thread's loop, which a worker
imports only when it uses them (these four ~4 ms together).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

#: Modules a joining worker has no use for; each costs milliseconds to import.
HEAVY = ("dataclasses", "inspect", "hashlib", "_hashlib", "textwrap",
         "otel_rl._internal.rllib", "otel_rl._internal.torchrun", "otel_rl._internal.stepping")

SCRIPT = textwrap.dedent("""
    import json, multiprocessing as mp, sys

    HEAVY = {heavy!r}

    def child(queue):
        import otel_rl
        from otel_rl.timers import hierarchical_timer
        with hierarchical_timer("step"):
            pass
        queue.put((otel_rl.get_context() is not None,
                   [name for name in HEAVY if name in sys.modules]))

    if __name__ == "__main__":
        import otel_rl
        from otel_rl.timers import hierarchical_timer
        otel_rl.configure(spans="all", output_dir=sys.argv[1])
        queue = mp.get_context("spawn").Queue()
        process = mp.get_context("spawn").Process(target=child, args=(queue,))
        with hierarchical_timer("spawn"):
            process.start()
            joined, heavy = queue.get(timeout=60)
            process.join(60)
        otel_rl.shutdown()
        print(json.dumps({{"joined": joined, "heavy": heavy, "exit": process.exitcode}}))
""")


def test_a_spawned_worker_joins_the_run_without_importing_modules_it_does_not_use(
        tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT.format(heavy=HEAVY))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"joined": True, "heavy": [], "exit": 0}, proc.stderr[-2000:]
    tree = json.loads((tmp_path / "out" / "timers.json").read_text())
    assert tree["children"]["spawn"]["children"]["step"]["count"] == 1


def test_the_rllib_modules_patched_on_import_are_those_rllib_patches() -> None:
    from otel_rl._internal import propagation, rllib

    assert set(propagation.RLLIB_MODULES) == set(rllib.PATCHES)
