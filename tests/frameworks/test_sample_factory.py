"""Sample Factory 2.1.1 end to end: APPO on CartPole with 2 rollout worker processes (plus the
inference worker and the learner), ``python -m sf_examples.train_gym_env``, once plain and once
under ``otel-rl run``, in the Sample Factory venv with otel_rl installed there by a plain
``pip install``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import (
    Venv,
    assert_tree_from_spans_equals_timers_json,
    load,
    node_at,
    span_lines,
)

STEPS = 40000
COMMAND = ["-m", "sf_examples.train_gym_env", "--env=CartPole-v1", "--algo=APPO",
           "--num_workers=2", "--num_envs_per_worker=8", "--device=cpu",
           f"--train_for_env_steps={STEPS}", "--experiment=cartpole", "--train_dir=train",
           "--with_wandb=False", "--save_every_sec=1000", "--seed=1"]
#: Sample Factory's components in this run: (Timing name, role, index).
COMPONENTS = {("Batcher 0 profile", "Batcher", 0), ("Learner 0 profile", "Learner", 0),
              ("InferenceWorker_p0-w0 profile", "InferenceWorker", 0),
              ("RolloutWorker_w0 profile", "RolloutWorker", 0),
              ("RolloutWorker_w1 profile", "RolloutWorker", 1)}
_LOG_LINE = re.compile(r"^(\x1b\[[0-9;]*m)*\[\d{4}-")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def printed_trees(log: str) -> dict[str, set[tuple[str, ...]]]:
    """Sample Factory's printed ``<name> tree view:`` blocks, as the key paths they show."""
    trees: dict[str, set[tuple[str, ...]]] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"\] (.+) tree view:", line)
        if not match:
            continue
        body = []
        for follow in lines[i + 1:]:
            if _LOG_LINE.match(follow) or not follow.strip():
                break
            body.append(_ANSI.sub("", follow))
        paths: set[tuple[str, ...]] = set()
        parents: list[str] = []
        for j, text in enumerate(body):
            depth = (len(text) - len(text.lstrip(" "))) // 2
            keys = [token.split(":")[0].strip() for token in text.strip().split(", ")]
            del parents[depth:]
            next_depth = ((len(body[j + 1]) - len(body[j + 1].lstrip(" "))) // 2
                          if j + 1 < len(body) else -1)
            for key in keys:
                paths.add((*parents, key))
            if len(keys) == 1 and next_depth > depth:
                parents.append(keys[0])
        trees[match.group(1)] = paths
    return trees


def subtree_paths(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths = set()
    for name, child in (node.get("children") or {}).items():
        paths.add((*prefix, name))
        paths |= subtree_paths(child, (*prefix, name))
    return paths


class Runs:
    def __init__(self, venv: Venv, root: Path) -> None:
        self.venv = venv
        self.root = root
        self.out = root / "otel-rl"
        (root / "plain").mkdir()
        (root / "otel").mkdir()
        self.plain = venv.run(venv.python, *COMMAND, cwd=root / "plain", timeout=600)
        self.otel = venv.run(venv.bin / "otel-rl", "run", "--spans", "all", "--output", self.out,
                             "--", "python", *COMMAND, cwd=root / "otel", timeout=600)


@pytest.fixture(scope="module")
def runs(venvs: Any, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(venvs("sf"), tmp_path_factory.mktemp("sample_factory"))


def test_training_finishes_plain_and_under_otel_rl(runs: Runs) -> None:
    for done in (runs.plain, runs.otel):
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-3000:]
        collected = re.search(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)", log)
        assert collected, log[-3000:]
        assert int(collected.group(1)) >= STEPS


def test_sample_factorys_printed_trees_are_unchanged(runs: Runs) -> None:
    plain = printed_trees(runs.plain.stdout + runs.plain.stderr)
    otel = printed_trees(runs.otel.stdout + runs.otel.stderr)
    assert {name for name, _, _ in COMPONENTS} | {"Runner profile"} <= set(plain)
    assert otel == plain


def test_each_components_tree_reads_back_from_the_whole_run(runs: Runs) -> None:
    tree = load(runs.out / "timers.json")
    printed = printed_trees(runs.otel.stdout + runs.otel.stderr)
    main_loop = node_at(tree, "main_loop")
    assert set(main_loop["children"]) == {name for name, _, _ in COMPONENTS}
    for name, _, _ in COMPONENTS:
        component = node_at(tree, "main_loop", name)
        assert component["count"] == 1 and component["is_parallel"]
        assert subtree_paths(component) == printed[name]


def test_components_are_named_by_role_in_the_whole_run_and_the_spans(runs: Runs) -> None:
    tree = load(runs.out / "timers.json")
    # The runner is the run's own process: its role, from its Timing, without a component block.
    assert {(w["role"], w["index"], tuple(w["path"])) for w in tree["workers"]} == \
        {(role, index, ("main_loop", name)) for name, role, index in COMPONENTS} | \
        {("Runner", 0, ())}
    runner = next(w for w in tree["workers"] if w["role"] == "Runner")
    assert set(runner["tree"]["children"]) == {"main_loop"}
    spans = list(span_lines(runs.out / "spans.otlp.jsonl"))
    components = {(s["attributes"]["otel_rl.component"],
                   s["attributes"].get("otel_rl.component.role"),
                   s["attributes"].get("otel_rl.component.index"))
                  for s in spans if "otel_rl.component" in s["attributes"]}
    assert components == COMPONENTS | {("Runner profile", "Runner", 0)}
    roles = {s["resource"].get("otel_rl.worker.role") for s in spans}
    assert {"rollout_proc", "inference_proc", "learner_proc"} <= roles
    report = runs.venv.run(runs.venv.bin / "otel-rl", "report", runs.out / "timers.json",
                           cwd=runs.root)
    assert report.returncode == 0, report.stderr
    for role, n in (("RolloutWorker", 2), ("Learner", 1), ("InferenceWorker", 1),
                    ("Batcher", 1), ("Runner", 1)):
        assert f"== {role}: {n} workers" in report.stdout


def test_every_process_is_in_the_run_under_the_programs_name(runs: Runs) -> None:
    spans = list(span_lines(runs.out / "spans.otlp.jsonl"))
    by_role: dict[Any, set[int]] = {}
    for span in spans:
        by_role.setdefault(span["resource"].get("otel_rl.worker.role"),
                           set()).add(span["resource"]["process.pid"])
    assert len(by_role[None]) == 1  # the runner
    assert len(by_role["rollout_proc"]) == 2
    assert len(by_role["inference_proc"]) == len(by_role["learner_proc"]) == 1
    assert {s["resource"]["service.name"] for s in spans} == {"sf_examples.train_gym_env"}
    metadata = load(runs.out / "timers.json")["metadata"]
    program = metadata["command_line_arguments"].split()
    assert program[0].endswith("sf_examples/train_gym_env.py")
    assert program[1:] == COMMAND[2:]


def test_tree_from_the_spans_file_equals_timers_json(runs: Runs) -> None:
    assert_tree_from_spans_equals_timers_json(runs.venv, runs.out, runs.root)


def test_otel_rl_run_writes_the_html_report(runs: Runs) -> None:
    report = (runs.out / "report.html").read_text(encoding="utf-8")
    assert "RolloutWorker_w1 profile" in report
    for heading in ("RolloutWorker — 2 workers", "InferenceWorker — 1 workers",
                    "Learner — 1 workers", "Batcher — 1 workers", "Runner — 1 workers"):
        assert heading in report
