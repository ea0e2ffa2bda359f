"""Build otel_rl's optional compiled hot path in place, for the Python that runs this.

    python scripts/build_accel.py [--quiet] [--stale]

What ``pip install .`` does through setup.py, without setuptools (the test venvs of
scripts/python-matrix.sh have none): tests import the checkout, so each interpreter needs its
own ``otel_rl/_internal/_hotpath.<tag>.so`` (and ``_metricsacc.<tag>.so``, the metrics' column
reader, ``_relaycols.<tag>.so``, the relay's column writer, and ``_timingacc.<tag>.so``, Sample
Factory's Timing) beside the source. Uses the compiler and flags
Python was built with (``CC`` overrides the compiler). Exits 1 with the compiler's message if
the build fails; otel_rl then runs its pure-Python hot path. ``--stale``: only the modules
whose build is missing or older than its source (`benchmarks/run_all.py`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The compiled modules: the hot path, the metrics' column reader (issue 18), the relay's
#: column writer and Sample Factory's Timing (issue 19).
SOURCES = [ROOT / "otel_rl" / "_internal" / name
           for name in ("_hotpath.c", "_metricsacc.c", "_relaycols.c", "_timingacc.c")]
SOURCE = SOURCES[0]


def build(source: Path, quiet: bool, stale: bool = False) -> int:
    target = source.with_name(source.stem + str(sysconfig.get_config_var("EXT_SUFFIX")))
    if stale and target.exists() and target.stat().st_mtime >= max(
            source.stat().st_mtime, (source.parent / "_accel.h").stat().st_mtime):
        return 0
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    # Built beside and renamed over: a process that has the old build loaded keeps its copy.
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    command = [*cc, "-O2", "-fPIC", "-shared", "-Wall", "-Werror=implicit-function-declaration",
               f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(partial)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            os.replace(partial, target)
    except OSError as exc:  # no compiler at all
        done = subprocess.CompletedProcess(command, 1, "", str(exc))
    finally:
        partial.unlink(missing_ok=True)
    if done.returncode != 0:
        print(f"build_accel: building {target.name} failed (otel_rl runs pure Python):\n"
              f"{done.stdout}{done.stderr}", file=sys.stderr)
        return 1
    if not quiet:
        print(f"build_accel: built {target.relative_to(ROOT)}{done.stdout}{done.stderr}")
    return 0


def main(argv: list[str]) -> int:
    return max(build(source, "--quiet" in argv, "--stale" in argv) for source in SOURCES)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
