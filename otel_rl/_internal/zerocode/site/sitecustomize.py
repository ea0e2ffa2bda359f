"""Start-up hook of zero-code mode (`otel-rl run`), run by Python's `site` module.

`otel-rl run` prepends this folder to PYTHONPATH, so Python imports this file as
``sitecustomize`` when the program starts, and again in every Python process the program
starts (they inherit PYTHONPATH). In each it serves otel_rl's timers under the ML-Agents and
Sample Factory module names and runs the ``sitecustomize`` this one shadows (if any). It calls
``otel_rl.configure()`` (settings from the environment) in the program's main process, and in
a process started from the run with a trace context in its environment; other Python processes
(multiprocessing's helpers, its workers before otel_rl's worker bootstrap) are left alone, so
that none of them writes a second run into the output folder.

It runs before the user's program, in every child Python process, possibly under a Python
without otel_rl: it never raises, and says in one line what it skipped.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The folder holding the ``otel_rl`` package this file belongs to.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))


def _warn(what: str, exc: BaseException) -> None:
    sys.stderr.write(f"otel-rl run: {what} ({type(exc).__name__}: {exc}); continuing\n")


def _import_otel_rl() -> bool:
    try:
        import otel_rl
    except ImportError:
        pass
    else:
        return True
    # otel_rl runs from a source tree that is not installed: find it next to this file.
    # Appended (not prepended) so nothing else the program imports can be shadowed by it.
    if _PACKAGE_ROOT in sys.path:
        return False
    sys.path.append(_PACKAGE_ROOT)
    try:
        import otel_rl  # noqa: F401
    except Exception as exc:
        sys.path.remove(_PACKAGE_ROOT)
        _warn("cannot import otel_rl", exc)
        return False
    return True


def _chain() -> None:
    """Run the ``sitecustomize`` that this one hides, as Python would have without otel_rl."""
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:
        # What site.py prints for a failing sitecustomize.
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{type(exc).__name__}: {exc}\n"
        )


def _claim_main(variable: str) -> bool:
    """Whether this is the main process of the program `otel-rl run` started (see MAIN_ENV)."""
    value = os.environ.get(variable)
    mine = f"pid:{os.getpid()}"
    if value == "1" or value == mine:
        os.environ[variable] = mine
        return True
    return False


def _configure(is_main: bool) -> None:
    # Not the main process: join the trace a parent handed down, or leave otel_rl off (a
    # multiprocessing worker is started by otel_rl's worker bootstrap once unpickled). The
    # carrier is read without `otel_rl.context_from_env`, which imports the runtime: a process
    # that does not join (multiprocessing's resource tracker, a helper script) paid ~20 ms.
    from otel_rl._internal import carrier

    if is_main or carrier.from_env():
        import otel_rl
        from otel_rl._internal import recorder

        # sys.argv is not final yet (``-m module`` still reads "-m"): timers record the
        # program's real command line once it is.
        recorder.set_startup_argv(" ".join(sys.argv))
        otel_rl.configure()


def _start() -> None:
    # Read before anything can start a child process that would inherit the unclaimed value;
    # the name is MAIN_ENV of otel_rl._internal.zerocode, not importable yet here.
    is_main = _claim_main("OTEL_RL_ZEROCODE_MAIN")
    have_otel_rl = _import_otel_rl()
    if have_otel_rl:
        try:
            from otel_rl._internal.zerocode.aliases import install

            install()
        except Exception as exc:
            _warn("cannot serve otel_rl's timers", exc)
        try:
            from otel_rl._internal.zerocode.scalars import install as record_scalars

            record_scalars()  # TensorBoard / ML-Agents stats as metrics (files unchanged)
        except Exception as exc:
            _warn("cannot record training scalars", exc)
    _chain()
    if have_otel_rl:
        try:
            _configure(is_main)
        except Exception as exc:
            _warn("cannot configure otel_rl", exc)


# Only as Python's start-up hook: importing this file under its package name does nothing.
if __name__ == "sitecustomize":
    _start()
