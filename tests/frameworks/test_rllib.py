"""RLlib 2.60 end to end, no code change: PPO on CartPole (new API stack, 2 env runners, a
Learner actor) once plain and once under ``otel-rl run``, in the Ray venv with otel_rl
installed there by a plain ``pip install``. RLlib's own timers (``MetricsLogger.log_time``)
become blocks, the env runners' blocks sit under the driver block that asked them for samples,
the roles are RLlib's, and RLlib's results dict and printed output are the same as without
otel_rl."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import (
    Venv,
    assert_tree_from_spans_equals_timers_json,
    load,
    node_at,
    walk,
)

HERE = Path(__file__).resolve().parent
ITERATIONS = 2
DRIVER_TIMERS = ("training_iteration", "training_step", "env_runner_sampling_timer",
                 "learner_update_timer", "synch_weights")
SAMPLING = ("training_iteration", "training_step", "env_runner_sampling_timer")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class Runs:
    def __init__(self, venv: Venv, root: Path) -> None:
        self.venv = venv
        self.root = root
        self.out = root / "otel" / "out"
        for name in ("plain", "otel"):
            (root / name).mkdir()
            shutil.copy(HERE / "rllib_train.py", root / name / "rllib_train.py")
        self.plain = venv.run(venv.python, "rllib_train.py", root / "plain.json", str(ITERATIONS),
                              cwd=root / "plain", timeout=600)
        self.otel = venv.run(venv.bin / "otel-rl", "run", "--spans", "all", "--output", self.out,
                             "--", "python", "rllib_train.py", root / "otel.json",
                             str(ITERATIONS), cwd=root / "otel", timeout=600)

    def results(self, name: str) -> list[dict[str, Any]]:
        return list(load(self.root / f"{name}.json")["iterations"])


@pytest.fixture(scope="module")
def runs(venvs: Any, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(venvs("ray"), tmp_path_factory.mktemp("rllib"))


def test_training_finishes_plain_and_under_otel_rl(runs: Runs) -> None:
    for done in (runs.plain, runs.otel):
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert [r["iteration"] for r in runs.results("otel")] == list(range(1, ITERATIONS + 1))


def _without_perf(paths: list[str]) -> list[str]:
    # RLlib's `perf` (system CPU and RAM use, sampled by a timer) is empty in an iteration
    # that ended before the first sample, with or without otel_rl.
    return [p for p in paths if p.split("/")[0] != "perf"]


def test_rllibs_results_dict_is_unchanged(runs: Runs) -> None:
    plain, otel = runs.results("plain"), runs.results("otel")
    assert [_without_perf(r["paths"]) for r in otel] == [_without_perf(r["paths"]) for r in plain]
    assert [r["timers"] for r in otel] == [r["timers"] for r in plain]
    assert set(DRIVER_TIMERS) <= set(plain[0]["timers"])
    assert [r["env_steps"] for r in otel] == [r["env_steps"] for r in plain]


def _masked(text: str) -> list[str]:
    """Lines with numbers masked, without RLlib's `perf` block (see `_without_perf`)."""
    lines, in_perf = [], False
    for line in text.splitlines():
        if line.startswith("perf:"):
            in_perf = True
            continue
        if in_perf and line.startswith(" "):
            continue
        in_perf = False
        lines.append(_NUMBER.sub("N", line))
    return lines


def test_rllibs_printed_output_is_unchanged_but_for_numbers(runs: Runs) -> None:
    assert _masked(runs.otel.stdout) == _masked(runs.plain.stdout)
    assert "timers:" in runs.plain.stdout
    # otel_rl adds one line of its own (the report), and no warning.
    ours = [line for line in runs.otel.stderr.splitlines() if "otel" in line.lower()]
    assert ours == [f"otel-rl run: wrote {runs.out / 'report.html'}"], ours


def _block_name(path: str) -> str:
    """The block a results-dict timer path names: its key without RLlib's aggregation prefix
    (``env_runners/``, ``learners/``) and without ``timers``, joined by dots."""
    parts = path.split("/")
    if parts[0] in ("env_runners", "learners"):
        parts = parts[1:]
    return ".".join(p for p in parts if p != "timers")


def test_every_rllib_timer_in_the_results_is_a_block(runs: Runs) -> None:
    tree = load(runs.out / "timers.json")
    names = {path[-1] for path, _ in walk(tree)}
    timer_paths = [p for p in runs.results("otel")[0]["paths"]
                   if p.startswith("timers/") or "/timers/" in p or p.endswith("_timer")]
    assert len(timer_paths) >= 20
    missing = sorted(_block_name(p) for p in timer_paths if _block_name(p) not in names)
    assert missing == []


def test_rllib_timers_nest_as_rllib_calls_them(runs: Runs) -> None:
    tree = load(runs.out / "timers.json")
    assert node_at(tree, "training_iteration")["count"] == ITERATIONS
    step = node_at(tree, "training_iteration", "training_step")
    assert step["count"] == ITERATIONS and not step.get("is_parallel")
    for name in DRIVER_TIMERS[2:]:
        assert node_at(step, name)["count"] == ITERATIONS
    # The env runners' blocks are under the driver block that asked them for samples.
    sample = node_at(tree, *SAMPLING, "sample")
    assert sample["is_parallel"] and sample["count"] >= 2
    steps = node_at(sample, "env_step_timer")
    assert steps["count"] >= runs.results("otel")[-1]["env_steps"]
    for name in ("env_reset_timer", "rlmodule_inference_timer",
                 "env_to_module_connector.connector_pipeline_timer"):
        assert node_at(sample, name)["is_parallel"]
    assert not any(path[0] == "sample" for path, _ in walk(tree))  # nothing left at the root
    # The Learner actor's blocks are under the driver's learner update.
    learner = node_at(tree, "training_iteration", "training_step", "learner_update_timer",
                      "__all_modules__.learner_connector.connector_pipeline_timer")
    assert learner["is_parallel"] and learner["count"] == ITERATIONS


def test_a_clean_algo_stop_loses_nothing_and_says_so(runs: Runs) -> None:
    # RLlib's algo.stop() stops its env runners and ray.kill()s them, idle; ray.shutdown().
    tree = load(runs.out / "timers.json")
    assert tree.get("notes") is None and tree.get("complete", True) is True


def test_env_runner_spans_are_children_of_the_sampling_span(runs: Runs) -> None:
    spans: dict[str, dict[str, Any]] = {}
    for line in (runs.out / "spans.otlp.jsonl").read_text(encoding="utf-8").splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            resource = {a["key"]: next(iter(a["value"].values()))
                        for a in rs["resource"].get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    spans[span["spanId"]] = {**span, "_resource": resource}
    samples = [s for s in spans.values() if s["name"] == "sample"]
    assert len(samples) >= 2
    for span in samples:
        parent = spans[span["parentSpanId"]]
        assert parent["name"] == "env_runner_sampling_timer"
        assert span["_resource"]["otel_rl.worker.role"] == "EnvRunner"
        assert span["_resource"]["process.pid"] != parent["_resource"]["process.pid"]
    assert {s["_resource"]["otel_rl.worker.index"] for s in samples} == {"1", "2"}


def test_roles_in_the_cross_worker_view_and_the_html_report(runs: Runs) -> None:
    tree = load(runs.out / "timers.json")
    roles = sorted({(w["role"], w["index"], w["pid"]) for w in tree["workers"]})
    assert [(role, index) for role, index, _ in roles] == \
        [("EnvRunner", 1), ("EnvRunner", 2), ("Learner", 0)]
    for worker in tree["workers"]:
        expected = list(SAMPLING) if worker["role"] == "EnvRunner" else \
            ["training_iteration", "training_step", "learner_update_timer"]
        assert worker["path"] == expected
    # (--allow-partial: this test is about the roles; completeness has its own test.)
    report = runs.venv.run(runs.venv.bin / "otel-rl", "report", "--allow-partial",
                           runs.out / "timers.json", cwd=runs.root)
    assert report.returncode == 0, report.stderr
    assert "== EnvRunner: 2 workers" in report.stdout
    assert "== Learner: 1 workers" in report.stdout
    html = (runs.out / "report.html").read_text(encoding="utf-8")
    assert "EnvRunner — 2 workers" in html and "Learner — 1 workers" in html


def test_tree_from_the_spans_file_equals_timers_json(runs: Runs) -> None:
    # (Partial or not: completeness has its own test; here the two trees must agree.)
    assert_tree_from_spans_equals_timers_json(runs.venv, runs.out, runs.root, allow_partial=True)
    assert (load(runs.root / "rebuilt.json").get("notes") or []) == \
        (load(runs.out / "timers.json").get("notes") or [])


_LOGGER_SCRIPT = """
import json, time
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.metrics.stats.base import StatsBase

m = MetricsLogger(root=True)
for _ in range(3):
    with m.log_time(("timers", "outer")) as stats:
        with m.log_time(("timers", "inner")):
            time.sleep(0.001)
# Entered and exited by hand, the outer one first (out of order).
a, b = m.log_time("by_hand_a"), m.log_time("by_hand_b")
a.__enter__(); b.__enter__(); a.__exit__(None, None, None); b.__exit__(None, None, None)
with m.log_time("after"):
    pass
try:
    with m.log_time("raises"):
        raise ValueError("from the block")
except ValueError:
    pass
reduced = m.reduce()
print(json.dumps({"is_stats": isinstance(stats, StatsBase), "type": type(stats).__name__,
                  "keys": sorted(reduced), "timers": sorted(reduced["timers"])}))
"""


def test_metrics_logger_blocks_nest_and_rllib_sees_its_own_objects(venvs: Any,
                                                                   tmp_path: Path) -> None:
    venv = venvs("ray")
    script = tmp_path / "logger.py"
    script.write_text(_LOGGER_SCRIPT)
    plain = venv.run(venv.python, script, cwd=tmp_path)
    otel = venv.run(venv.bin / "otel-rl", "run", "--output", tmp_path / "out", "--", "python",
                    script, cwd=tmp_path)
    for done in (plain, otel):
        assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(otel.stdout.splitlines()[-1])
    assert facts == json.loads(plain.stdout.splitlines()[-1])
    assert facts["is_stats"] is True
    tree = load(tmp_path / "out" / "timers.json")
    assert node_at(tree, "outer")["count"] == 3
    assert node_at(tree, "outer", "inner")["count"] == 3
    # The out-of-order pair still nests, and the blocks after it are back at the root.
    assert node_at(tree, "by_hand_a", "by_hand_b")["count"] == 1
    assert node_at(tree, "by_hand_a")["count"] == 1
    assert node_at(tree, "after")["count"] == 1 and node_at(tree, "raises")["count"] == 1


def test_a_local_learner_num_learners_0_runs_in_a_learner_block(venvs: Any,
                                                                 tmp_path: Path) -> None:
    """RLlib's default ``num_learners=0``: the Learner is the driver's own, not an actor (no
    ``Learner`` role); its updates are a ``Learner`` block under ``learner_update_timer``, its
    learner connector's blocks inside it, apart from the env runners' sampling."""
    venv = venvs("ray")
    shutil.copy(HERE / "rllib_train.py", tmp_path / "rllib_train.py")
    out = tmp_path / "out"
    done = venv.run(venv.bin / "otel-rl", "run", "--output", out, "--", "python",
                    "rllib_train.py", tmp_path / "local.json", str(ITERATIONS), "0",
                    cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tree = load(out / "timers.json")
    update = node_at(tree, "training_iteration", "training_step", "learner_update_timer")
    learner = node_at(update, "Learner")
    assert learner["count"] == ITERATIONS and not learner.get("is_parallel")
    inner = node_at(learner, "__all_modules__.learner_connector.connector_pipeline_timer")
    assert inner["count"] == ITERATIONS
    assert [path for path, _ in walk(tree) if path[-1] == "Learner"] == [
        ("training_iteration", "training_step", "learner_update_timer", "Learner")]
    assert node_at(tree, *SAMPLING, "sample")["is_parallel"]
    assert "Learner" not in {w["role"] for w in tree.get("workers", [])}


def test_rllib_run_by_ray_tune_keeps_its_tree_and_names_no_learner_worker(
        venvs: Any, tmp_path: Path) -> None:
    """Tune runs PPO (``tune.Tuner(PPO, ...)``): the Algorithm, its local Learner and its local
    env runner live in the trial's actor. The whole RLlib tree sits under the driver's
    ``tuning`` block; the trial's process keeps its actor's role (``PPO``), not ``Learner``,
    and its learning is a ``Learner`` block, as in the driver with ``num_learners=0``; the
    remote env runner is ``EnvRunner 1``, its blocks under the block that asked for samples."""
    venv = venvs("ray")
    shutil.copy(HERE / "rllib_tune.py", tmp_path / "rllib_tune.py")
    out = tmp_path / "out"
    done = venv.run(venv.bin / "otel-rl", "run", "--spans", "all", "--output", out, "--",
                    "python", "rllib_tune.py", str(ITERATIONS), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f'RESULT {{"iterations": {ITERATIONS}}}' in done.stdout
    tree = load(out / "timers.json")
    assert "complete" not in tree, tree.get("notes")
    iteration = node_at(tree, "tuning", "training_iteration")
    assert iteration["count"] == ITERATIONS and iteration["is_parallel"]
    update = node_at(tree, "tuning", "training_iteration", "training_step",
                     "learner_update_timer")
    assert node_at(update, "Learner")["count"] == ITERATIONS
    sample = node_at(tree, "tuning", *SAMPLING, "sample")
    assert sample["count"] == ITERATIONS and sample["is_parallel"]
    roles = sorted((w["role"], w["index"], tuple(w["path"])) for w in tree["workers"])
    assert roles == [("EnvRunner", 1, ("tuning", *SAMPLING)), ("PPO", 0, ("tuning",))]
    assert_tree_from_spans_equals_timers_json(venv, out, tmp_path)


def test_rllibs_own_timer_methods_compiled_give_rllibs_numbers(venvs: Any,
                                                                tmp_path: Path) -> None:
    """The compiled copy of RLlib's ``StatsBase.__enter__`` / ``__exit__`` (an ``EmaStats``'
    push inlined) that the glue calls: random programs on real stats objects give what RLlib's
    own methods give, call for call and bit for bit (rllib_stats_diff.py), and a float pushed
    into a plain ``EmaStats`` no longer runs RLlib's Python ``push``."""
    venv = venvs("ray")
    for seed in (1, 2, 3):
        done = venv.run(venv.python, HERE / "rllib_stats_diff.py", tmp_path / f"out{seed}",
                        str(seed), "3000", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        facts = json.loads(done.stdout.splitlines()[-1])
        assert facts["calls"] == 3000
        assert facts["same"], facts["first_difference"]
        pushes = facts["python_pushes"]
        # RLlib's push runs for the objects the copy hands back (another class's push, an
        # int coefficient, a numpy value, a replaced push), not for the plain EMAs.
        assert 0 < pushes["compiled"] < pushes["rllib"] / 1.5


def test_rllibs_log_time_compiled_gives_rllibs_stats_objects(venvs: Any, tmp_path: Path) -> None:
    """The compiled copy of RLlib's ``MetricsLogger.log_time`` (`_hotpath.rllib_log_time`):
    random programs of calls on real loggers return the same stats objects and leave the same
    ``stats`` trees as RLlib's own (rllib_log_time_diff.py), answer a held key without RLlib's
    Python lookup, and hand every other call to RLlib's function."""
    venv = venvs("ray")
    for seed in (1, 2):
        done = venv.run(venv.python, HERE / "rllib_log_time_diff.py", tmp_path / f"out{seed}",
                        str(seed), "2500", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        facts = json.loads(done.stdout.splitlines()[-1])
        assert facts["calls"] == 2500 and facts["lock_is_dummy"]
        assert facts["same"], facts["first_difference"]
        key_ins = facts["python_key_in_stats"]
        # Each call the copy answered is one RLlib's Python lookup did not run; the rest ran it.
        assert facts["answered_by_the_copy"] > 500
        assert key_ins["rllib"] - key_ins["compiled"] == facts["answered_by_the_copy"]
