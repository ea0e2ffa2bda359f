"""ML-Agents 1.1.0 end to end: PPO on ML-Agents' own Python `SimpleEnvironment`, through
`mlagents-learn`'s code path, a `SubprocessEnvManager` with 2 forked env workers and a threaded
trainer (`mlagents_train.py`), once plain and once under ``otel-rl run``, in the ML-Agents venv
with otel_rl installed there by a plain ``pip install``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import (
    Venv,
    assert_tree_from_spans_equals_timers_json,
    counts,
    load,
    node_at,
    shape,
    span_lines,
    walk,
)

TRAIN = Path(__file__).with_name("mlagents_train.py")
STEPS = 4000
START = ("TrainerController.start_learning",)
WORKERS = (*START, "TrainerController.advance", "env_step", "workers")


class Runs:
    def __init__(self, venv: Venv, root: Path) -> None:
        self.venv = venv
        self.root = root
        self.plain_dir = root / "plain"
        self.otel_dir = root / "otel"
        self.out = root / "otel-rl"
        # Both from the same folder with the same relative arguments: ML-Agents records the
        # command line in its timers.json.
        self.plain = venv.run(venv.python, TRAIN, "results", cwd=self.plain_dir.mkdir() or
                              self.plain_dir, timeout=600)
        self.otel = venv.run(venv.bin / "otel-rl", "run", "--spans", "all", "--output",
                             self.out, "--", TRAIN, "results",
                             cwd=self.otel_dir.mkdir() or self.otel_dir, timeout=600)

    def own_timers(self, otel: bool) -> Any:
        base = self.otel_dir if otel else self.plain_dir
        return load(base / "results" / "simple" / "run_logs" / "timers.json")

    def worker_tree(self, otel: bool) -> Any:
        return load((self.otel_dir if otel else self.plain_dir) / "results" /
                    "worker_timer_tree.json")


@pytest.fixture(scope="module")
def runs(venvs: Any, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(venvs("mlagents"), tmp_path_factory.mktemp("mlagents"))


def test_plain_pip_install_leaves_mlagents_importable_with_its_protobuf(runs: Runs) -> None:
    probe = runs.venv.run(runs.venv.python, "-c", (
        "import google.protobuf, numpy, otel_rl, mlagents.trainers.learn;"
        "from mlagents_envs.communicator_objects import unity_output_pb2;"
        "print(google.protobuf.__version__, numpy.__version__)"), cwd=runs.root)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split() == ["3.20.3", "1.23.5"]


def test_training_finishes_plain_and_under_otel_rl(runs: Runs) -> None:
    for done in (runs.plain, runs.otel):
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"Step: {STEPS}." in done.stdout + done.stderr
    for base in (runs.plain_dir, runs.otel_dir):
        assert (base / "results" / "simple" / "Simple.onnx").is_file()


def test_mlagents_own_timers_json_is_unchanged(runs: Runs) -> None:
    plain, otel = runs.own_timers(False), runs.own_timers(True)
    assert shape(otel) == shape(plain)
    # Forked workers start from a copy of the parent's stack, in both.
    assert node_at(otel, *WORKERS, "worker_root", "run_training.setup",
                   "TimedSimpleEnvironment.step")["count"] == 2
    assert node_at(otel, "run_training.setup")["count"] == 1
    assert set(otel["metadata"]) == set(plain["metadata"])
    assert otel["metadata"]["command_line_arguments"] == \
        plain["metadata"]["command_line_arguments"] == f"{TRAIN} results"


def test_env_workers_get_timer_tree_is_unchanged(runs: Runs) -> None:
    plain, otel = runs.worker_tree(False), runs.worker_tree(True)
    assert counts(otel) == counts(plain)
    assert ("run_training.setup", "TimedSimpleEnvironment.step") in counts(otel)
    assert set(otel["metadata"]) == set(plain["metadata"])


def test_whole_run_puts_worker_and_thread_blocks_at_mlagents_merge_points(runs: Runs) -> None:
    tree = load(runs.out / "timers.json")
    own = runs.own_timers(True)
    steps = node_at(tree, *WORKERS, "TimedSimpleEnvironment.step")
    assert steps["is_parallel"]
    merged = sum(node["count"] for path, node in walk(node_at(own, *WORKERS, "worker_root"))
                 if path[-1] == "TimedSimpleEnvironment.step")
    # Every env step once (ML-Agents merges all but the steps still in flight at the end).
    assert merged <= steps["count"] <= merged + 2
    advance = node_at(tree, *START, "trainer_threads", "trainer_advance")
    assert advance["is_parallel"]
    assert advance["count"] == node_at(own, *START, "trainer_threads", "thread_root",
                                       "trainer_advance")["count"]
    # Not where the thread and the workers were started.
    assert "children" not in node_at(tree, *START, "TrainerController._reset_env")
    assert "children" not in node_at(tree, "run_training.setup")
    # ML-Agents' own merged copies are not counted a second time.
    assert not any("worker_root" in path or "thread_root" in path for path, _ in walk(tree))
    workers = tree["workers"]
    assert sorted(w["index"] for w in workers) == [0, 1]
    assert all(tuple(w["path"]) == WORKERS for w in workers)


def test_every_process_is_in_the_run_under_the_programs_name(runs: Runs) -> None:
    spans = list(span_lines(runs.out / "spans.otlp.jsonl"))
    pids = {s["resource"]["process.pid"] for s in spans}
    assert len(pids) == 3  # the trainer and 2 env workers
    assert {s["resource"]["service.name"] for s in spans} == {"mlagents_train"}
    env_steps = [s for s in spans if s["name"] == "TimedSimpleEnvironment.step"]
    assert {s["resource"].get("otel_rl.worker.role") for s in env_steps} == {"worker"}
    run = next(s for s in spans if s["attributes"].get("otel_rl.kind") == "run")
    assert run["attributes"]["otel_rl.metadata.command_line_arguments"] == f"{TRAIN} results"


def test_tree_from_the_spans_file_equals_timers_json(runs: Runs) -> None:
    assert_tree_from_spans_equals_timers_json(runs.venv, runs.out, runs.root)


def test_otel_rl_run_writes_the_html_report(runs: Runs) -> None:
    report = (runs.out / "report.html").read_text(encoding="utf-8")
    assert "trainer_threads" in report and "TimedSimpleEnvironment.step" in report
    assert f"wrote {runs.out / 'report.html'}" in runs.otel.stderr


def test_what_needs_the_otlp_extra_says_so_in_one_line(runs: Runs) -> None:
    # The ML-Agents venv has protobuf 3.20 but, installed plainly, not opentelemetry-proto.
    done = runs.venv.run(runs.venv.bin / "otel-rl", "replay", runs.out / "spans.otlp.jsonl",
                         "--endpoint", "http://127.0.0.1:9", cwd=runs.root)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "pip install 'otel-rl[otlp]'" in done.stderr
