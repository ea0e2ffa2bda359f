"""``otel-rl run`` as a user meets it: the service named after the program (unless told
otherwise), the program's real command line in the run's metadata, report.html at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

MODULE = """
import sys
from mlagents_envs.timers import hierarchical_timer
with hierarchical_timer("module_block"):
    pass
"""

pytest.importorskip("mlagents_envs")


def otel_rl_run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    environ["PYTHONPATH"] = str(REPO)  # this checkout's otel_rl, in the CLI and the program
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "otel_rl", "run", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=120)


def run_span(folder: Path) -> dict[str, Any]:
    for line in (folder / "spans.otlp.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            resource = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    if span["name"] == "run":
                        return {"service": resource["service.name"]["stringValue"]}
    raise AssertionError("no run span")


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "trainmod.py").write_text(MODULE)
    return tmp_path


def test_service_is_named_after_the_program_and_its_real_command_line_recorded(
    program: Path,
) -> None:
    done = otel_rl_run(["--output", "out", "--", sys.executable, "-m", "trainmod", "--lr=3"],
                       cwd=program)
    assert done.returncode == 0, done.stderr
    assert run_span(program / "out")["service"] == "trainmod"
    metadata = json.loads((program / "out" / "timers.json").read_text())["metadata"]
    assert metadata["command_line_arguments"] == f"{program / 'trainmod.py'} --lr=3"


@pytest.mark.parametrize(("args", "env", "expected"), [
    (["--service-name", "from-option"], {"OTEL_SERVICE_NAME": "from-env"}, "from-option"),
    ([], {"OTEL_SERVICE_NAME": "from-env"}, "from-env"),
    ([], {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-resource"}, "from-resource"),
])
def test_service_name_can_be_set_as_usual(program: Path, args: list[str], env: dict[str, str],
                                          expected: str) -> None:
    done = otel_rl_run([*args, "--output", "out", "--", "trainmod.py"], cwd=program, **env)
    assert done.returncode == 0, done.stderr
    assert run_span(program / "out")["service"] == expected


def test_report_html_is_written_in_the_default_run_folder(program: Path) -> None:
    done = otel_rl_run(["--", "trainmod.py"], cwd=program)
    assert done.returncode == 0, done.stderr
    folders = list((program / "otel-rl-runs").iterdir())
    assert len(folders) == 1
    report = folders[0] / "report.html"
    assert "module_block" in report.read_text(encoding="utf-8")
    assert f"wrote {report}" in done.stderr


@pytest.mark.parametrize(("run_id", "folder"), [
    ("../escape", ".._escape"), ("a/b", "a_b"), ("..", "_"), ("nightly-3.1_x", "nightly-3.1_x"),
])
def test_a_run_id_names_one_folder_inside_the_runs_folder(program: Path, run_id: str,
                                                           folder: str) -> None:
    """A run id is any string (it joins nodes and processes into one run, unchanged): its
    default folder is one name inside ``otel-rl-runs``, never a path out of it or a nest."""
    work = program / "work"
    work.mkdir()
    (work / "trainmod.py").write_text(MODULE)
    done = otel_rl_run(["--", "trainmod.py"], cwd=work, OTEL_RL_RUN_ID=run_id)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (work / "otel-rl-runs").iterdir()] == [folder]
    assert (work / "otel-rl-runs" / folder / "timers.json").exists()
    assert sorted(p.name for p in program.iterdir()) == ["trainmod.py", "work"]
    metadata = json.loads((work / "otel-rl-runs" / folder / "timers.json").read_text())["metadata"]
    assert metadata["otel_rl_run_id"] == run_id
