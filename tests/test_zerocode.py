"""Zero-code mode: `otel-rl run` serves otel_rl's timers to an unchanged program.

Every test runs real processes: ``otel-rl run`` (started without otel_rl on PYTHONPATH, so the
program finds otel_rl only through the zero-code `sitecustomize`), the program, and its children.
The program imports the real ``mlagents_envs`` and ``sample_factory`` packages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.signals import default_signals

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("mlagents_envs")

#: Starts the CLI with otel_rl importable in that process only (not through PYTHONPATH).
_BOOTSTRAP = (
    f"import sys; sys.path.insert(0, {str(REPO)!r}); "
    "from otel_rl._internal.cli import main; raise SystemExit(main())"
)

_USER_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    import mlagents_envs
    import mlagents_envs.timers as timers
    from mlagents_envs.timers import hierarchical_timer, timed

    @timed
    def user_step():
        pass

    with hierarchical_timer("user_block"):
        for _ in range(3):
            user_step()

    facts = {
        "module_name": timers.__name__,
        "same_object": sys.modules["mlagents_envs.timers"] is sys.modules.get("otel_rl.timers"),
        "spec_name": timers.__spec__.name,
        "parent_attribute": mlagents_envs.timers is timers,
        "timed_module": timed.__module__,
        "parent_file": mlagents_envs.__file__,
        "parent_version": mlagents_envs.__version__,
        "tree_children": sorted(timers.get_timer_tree().get("children", {})),
    }
    try:
        from sample_factory.utils.timing import Timing
    except ImportError as exc:
        facts["sample_factory"] = f"unavailable: {exc}"
    else:
        import sample_factory.utils

        facts["sample_factory"] = Timing.__module__
        facts["sf_parent_file"] = sample_factory.utils.__file__
        timing = Timing()
        with timing.add_time("sf_block"):
            pass
    print("FACTS " + json.dumps(facts), flush=True)
    """
)


def otel_rl_run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    environ.pop("PYTHONPATH", None)
    # Never let a test write its run folder into the working tree.
    environ["OTEL_RL_OUTPUT_DIR"] = str(cwd / "out")
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", _BOOTSTRAP, "run", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def facts_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("FACTS ")]
    assert len(lines) == 1, result.stdout + result.stderr
    facts: dict[str, Any] = json.loads(lines[0][len("FACTS ") :])
    return facts


@pytest.fixture
def user_script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(_USER_SCRIPT)
    return script


def test_unchanged_script_gets_otel_rl_timers(tmp_path: Path, user_script: Path) -> None:
    facts = facts_of(otel_rl_run(["--", user_script.name], cwd=tmp_path))
    assert facts["module_name"] == "otel_rl.timers"
    assert facts["same_object"] is True
    assert facts["spec_name"] == "otel_rl.timers"
    assert facts["parent_attribute"] is True
    assert facts["timed_module"] == "otel_rl.timers"
    # The parent package is the real, installed one.
    assert "site-packages" in facts["parent_file"]
    assert facts["parent_version"] == "1.1.0"
    assert "user_block" in facts["tree_children"]
    assert facts["sample_factory"] == "otel_rl.timing"
    assert "site-packages" in facts["sf_parent_file"]


def test_unchanged_script_emits_spans_named_like_its_blocks(
    tmp_path: Path, user_script: Path
) -> None:
    result = otel_rl_run(["--", user_script.name], cwd=tmp_path)
    facts_of(result)
    spans_files = list((tmp_path / "out").rglob("spans*.otlp.jsonl"))
    if not spans_files:
        pytest.skip("no spans.otlp.jsonl written (otel_rl.configure / the file sink not landed)")
    names = set()
    for path in spans_files:
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []):
                for scope_spans in resource_spans.get("scopeSpans", []):
                    names.update(s["name"] for s in scope_spans.get("spans", []))
    assert {"user_block", "user_step", "sf_block"} <= names


def _whole_run_tree(out: Path) -> dict[str, Any]:
    path = out / "timers.json"
    if not path.exists():
        pytest.skip("no timers.json written (otel_rl.configure / whole-run tree not landed)")
    tree: dict[str, Any] = json.loads(path.read_text())
    return tree


def test_child_python_processes_join_the_run(tmp_path: Path) -> None:
    (tmp_path / "parent.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            from mlagents_envs.timers import hierarchical_timer
            code = (
                "import mlagents_envs.timers as t\\n"
                "print('CHILD', t.__name__)\\n"
                "with t.hierarchical_timer('child_block'): pass\\n"
            )
            with hierarchical_timer("parent_block"):
                subprocess.run([sys.executable, "-c", code], check=True)
            """
        )
    )
    result = otel_rl_run(["--", "parent.py"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "CHILD otel_rl.timers" in result.stdout
    tree = _whole_run_tree(tmp_path / "out")
    assert tree["metadata"]["command_line_arguments"] == "parent.py"
    child = tree["children"]["parent_block"]["children"]["child_block"]
    assert child["count"] == 1
    assert child["is_parallel"] is True


def test_multiprocessing_helpers_do_not_pose_as_the_run(tmp_path: Path) -> None:
    # spawn also starts multiprocessing's resource tracker: a Python process of its own that
    # must not write a second run over the program's.
    (tmp_path / "pool.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing as mp
            from mlagents_envs.timers import hierarchical_timer
            from sample_factory.utils.timing import Timing

            def work(i):
                timing = Timing()
                with timing.add_time("worker_block"):
                    pass

            if __name__ == "__main__":
                ctx = mp.get_context("spawn")
                with hierarchical_timer("main_block"):
                    workers = [ctx.Process(target=work, args=(i,)) for i in range(2)]
                    for w in workers:
                        w.start()
                    for w in workers:
                        w.join()
            """
        )
    )
    result = otel_rl_run(["--", "pool.py"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tree = _whole_run_tree(tmp_path / "out")
    assert tree["metadata"]["command_line_arguments"] == "pool.py"
    assert tree["children"]["main_block"]["children"]["worker_block"]["count"] == 2


def test_the_resource_tracker_does_not_join_the_run(tmp_path: Path) -> None:
    # multiprocessing's resource tracker runs no program code: otel_rl stays off in it (no
    # threads of its own, not even its runtime imported), while the spawn worker joins.
    (tmp_path / "tracked.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing as mp, os
            from multiprocessing import resource_tracker
            from mlagents_envs.timers import hierarchical_timer

            def work(q):
                with hierarchical_timer("worker_block"):
                    with open("/proc/self/maps") as f:
                        q.put("_hotpath" in f.read())

            if __name__ == "__main__":
                ctx = mp.get_context("spawn")
                with hierarchical_timer("main_block"):
                    q = ctx.Queue()
                    w = ctx.Process(target=work, args=(q,))
                    w.start()
                    in_worker = q.get()
                    w.join()
                    pid = resource_tracker._resource_tracker._pid
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        command = f.read().replace(b"\\0", b" ").decode()
                    with open(f"/proc/{pid}/maps") as f:
                        loaded = "_hotpath" in f.read()  # the recorder's compiled part
                    print("TRACKER", len(os.listdir(f"/proc/{pid}/task")), loaded, in_worker,
                          command)
            """
        )
    )
    result = otel_rl_run(["--", "tracked.py"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("TRACKER ")]
    _, threads, loaded, in_worker, command = line.split(" ", 4)
    assert "multiprocessing.resource_tracker" in command
    assert threads == "1"
    if in_worker != "True":  # the recorder's compiled part is how its import is seen
        pytest.skip("no compiled hot path here: the tracker's imports cannot be seen")
    assert loaded == "False"
    tree = _whole_run_tree(tmp_path / "out")
    assert tree["children"]["main_block"]["children"]["worker_block"]["count"] == 1


def test_main_process_stays_the_run_across_exec(tmp_path: Path) -> None:
    code = "from mlagents_envs.timers import hierarchical_timer as h\nwith h('after_exec'): pass\n"
    (tmp_path / "launcher.py").write_text(
        f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {code!r}])\n"
    )
    result = otel_rl_run(["--", "launcher.py"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tree = _whole_run_tree(tmp_path / "out")
    assert tree["children"]["after_exec"]["count"] == 1


def test_options_become_environment_of_the_program(tmp_path: Path) -> None:
    code = (
        "import os, json; print(json.dumps({'pid': os.getpid(), **{k: os.environ.get(k) for k in "
        "('OTEL_RL_SERVICE_NAME', 'OTEL_RL_SPANS', 'OTEL_RL_OUTPUT_DIR', 'PYTHONPATH', "
        "'OTEL_RL_ZEROCODE_MAIN')}}))"
    )
    result = otel_rl_run(
        [
            "--service-name",
            "trainer",
            "--spans",
            "off",
            "--output",
            "runs/a",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": "/somewhere/else"},
    )
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout.strip().splitlines()[-1])
    zerocode = str(REPO / "otel_rl" / "_internal" / "zerocode" / "site")
    assert env["OTEL_RL_SERVICE_NAME"] == "trainer"
    assert env["OTEL_RL_SPANS"] == "off"
    assert env["OTEL_RL_OUTPUT_DIR"] == str(tmp_path / "runs" / "a")
    assert env["PYTHONPATH"].split(os.pathsep) == [zerocode, "/somewhere/else"]
    # Claimed by the program's main process (see otel_rl._internal.zerocode.MAIN_ENV).
    assert env["OTEL_RL_ZEROCODE_MAIN"] == f"pid:{env['pid']}"


def test_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    code = (
        "import os, mlagents_envs.timers as t; "
        "print('RESULT', os.environ.get('USER_SITECUSTOMIZE'), t.__name__)"
    )
    result = otel_rl_run(
        ["--", sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(other)}
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT ran otel_rl.timers" in result.stdout


def test_exit_code_of_the_program_is_returned(tmp_path: Path) -> None:
    result = otel_rl_run(["--", sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path)
    assert result.returncode == 3


def test_program_killed_by_a_signal_gives_128_plus_signal(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = otel_rl_run(["--", sys.executable, "-c", code], cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGKILL


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "otel-rl run: no command given"),
        (["--"], "otel-rl run: no command given"),
        (["--", "missing.py"], "otel-rl run: no such file: missing.py"),
        (["--", "no-such-command-xyz"], "otel-rl run: command not found: no-such-command-xyz"),
        (["--service-name", " ", "--", "x.py"], "otel-rl run: --service-name must not be empty"),
    ],
)
def test_bad_command_line_is_one_line_error(tmp_path: Path, args: list[str], message: str) -> None:
    result = otel_rl_run(args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("signum", "expected"),
    [(signal.SIGTERM, 7), (signal.SIGINT, 128 + signal.SIGINT), (signal.SIGUSR1, 9)],
)
def test_signals_are_forwarded_to_the_program(tmp_path: Path, signum: int, expected: int) -> None:
    program = textwrap.dedent(
        """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
        signal.signal(signal.SIGUSR1, lambda *a: sys.exit(9))
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    (tmp_path / "wait.py").write_text(program)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    environ.pop("PYTHONPATH", None)
    environ["OTEL_RL_OUTPUT_DIR"] = str(tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-c", _BOOTSTRAP, "run", "--", "wait.py"],
        cwd=tmp_path,
        env=environ,
        preexec_fn=default_signals,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signum)  # to otel-rl run only, not to its process group
        assert proc.wait(timeout=30) == expected
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


# The alias finder on its own -------------------------------------------------------------------


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    environ["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_alias_is_not_invented_when_parent_is_missing(tmp_path: Path) -> None:
    result = _python(
        """
        import sys
        from otel_rl._internal.zerocode.aliases import install
        install()
        # As if ML-Agents and Sample Factory were not installed.
        sys.path[:] = [p for p in sys.path if "-packages" not in p]
        for name in ("mlagents_envs.timers", "sample_factory.utils.timing"):
            try:
                __import__(name)
            except ModuleNotFoundError as exc:
                print("MISSING", exc.name, name in sys.modules)
            else:
                print("IMPORTED", name)
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        "MISSING mlagents_envs False",
        "MISSING sample_factory False",
    ]


def test_original_module_loads_when_otel_rl_module_cannot(tmp_path: Path) -> None:
    result = _python(
        """
        import logging
        logging.basicConfig(level=logging.WARNING)
        from otel_rl._internal.zerocode.aliases import install
        install({"mlagents_envs.timers": "otel_rl.no_such_module"})
        import mlagents_envs.timers as t
        print("LOADED", t.__name__, t.__file__.endswith("mlagents_envs/timers.py"))
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "LOADED mlagents_envs.timers True" in result.stdout
    assert "cannot serve mlagents_envs.timers with otel_rl.no_such_module" in result.stderr


def test_install_is_idempotent_and_uninstall_restores_imports(tmp_path: Path) -> None:
    result = _python(
        """
        import sys
        from otel_rl._internal.zerocode import aliases
        first = aliases.install()
        assert aliases.install() is first
        print("FINDERS", sum(isinstance(f, aliases.AliasFinder) for f in sys.meta_path))
        aliases.uninstall()
        import mlagents_envs.timers as t
        print("AFTER", t.__name__)
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["FINDERS 1", "AFTER mlagents_envs.timers"]


def test_the_programs_own_modules_are_not_shadowed(tmp_path: Path) -> None:
    (tmp_path / "aliases.py").write_text("VALUE = 'the program s own'\n")
    script = tmp_path / "train.py"
    script.write_text("import aliases\nprint(aliases.VALUE)\n")
    proc = subprocess.run([sys.executable, "-m", "otel_rl", "run", "--output", str(tmp_path / "out"),
                           "--", str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "the program s own"
