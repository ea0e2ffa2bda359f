"""Issue 18 with the real frameworks: a Sample Factory run and an ML-Agents run under
``otel-rl run`` (no code change), metrics straight to a real Prometheus's OTLP endpoint and
spans to a real Jaeger (two endpoints, the per-signal settings), queried over PromQL; and the
TensorBoard event files that zero-code scalar recording leaves byte-for-byte as they were."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.jaeger import JaegerServer
from tests.fixtures.prometheus import PrometheusServer
from tests.frameworks.conftest import Venv, load, walk

HERE = Path(__file__).parent
SF_STEPS = 30000
SF_COMMAND = ["-m", "sf_examples.train_gym_env", "--env=CartPole-v1", "--algo=APPO",
              "--num_workers=2", "--num_envs_per_worker=8", "--device=cpu",
              f"--train_for_env_steps={SF_STEPS}", "--experiment=cartpole", "--train_dir=train",
              "--with_wandb=False", "--save_every_sec=1000", "--seed=1",
              "--experiment_summaries_interval=2", "--stats_avg=20"]
ML_STEPS = 4000


def _endpoints(prometheus: PrometheusServer, jaeger: JaegerServer, run_id: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http_endpoint}/v1/traces",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": prometheus.otlp_metrics_endpoint,
            "OTEL_RL_RUN_ID": run_id, "OTEL_RL_METRICS_INTERVAL": "1",
            "OTEL_RL_WINDOW": "2", "OTEL_RL_SAMPLE_EVERY": "3"}


def _block_counts(timers: dict[str, Any]) -> dict[str, int]:
    """Runs per block name in a whole-run timers.json (every node of that name)."""
    result: dict[str, int] = {}
    for path, node in walk(timers):
        if path:
            result[path[-1]] = result.get(path[-1], 0) + int(node.get("count") or 0)
    return result


def _check_run(prometheus: PrometheusServer, jaeger: JaegerServer, run_id: str, started: float,
               timers: dict[str, Any], reward: str, fps_gauge: str | None,
               gauges: bool) -> None:
    run = f'otel_rl_run_id="{run_id}"'
    counts = {r["metric"]["block"]: float(r["value"][1]) for r in prometheus.wait_for(
        f"sum by (block) (otel_rl_block_duration_seconds_count{{{run}}})")}
    # Every run of a block, in every process, equals the whole-run timers.json's count.
    expected = _block_counts(timers)
    busiest = max(counts, key=lambda b: counts[b])
    assert counts[busiest] == expected[busiest] > 10, (busiest, counts, expected)
    # Per path: each is the block's path in its thread's tree, so the end of a path of the
    # whole-run timers.json (which puts a thread's or worker's blocks under the block that
    # started it); no path is unplaced, and the per-path runs add up to the per-block ones.
    by_path = {(r["metric"]["path"], r["metric"]["block"]): float(r["value"][1])
               for r in prometheus.query(f"sum by (path, block) "
                                         f"(otel_rl_block_duration_seconds_count{{{run}}})")}
    whole = {"/".join(path) for path, _node in walk(timers) if path}
    for path, block in by_path:
        assert path.split("/")[-1] == block
        assert any(w == path or w.endswith("/" + path) for w in whole), (path, sorted(whole))
    assert sum(n for (_p, b), n in by_path.items() if b == busiest) == counts[busiest]
    # histogram_quantile of that block: between the block's fastest and slowest run.
    (p50,) = prometheus.query(f"histogram_quantile(0.5, sum by (le) (otel_rl_block_duration_"
                              f'seconds_bucket{{{run},block="{busiest}"}}))')
    mean = sum(n.get("total", 0.0) for p, n in walk(timers) if p and p[-1] == busiest) \
        / expected[busiest]
    assert 0 < float(p50["value"][1]) < 1000 * max(mean, 1e-6)
    # The reward gauge over steps: several values, at rising steps.
    end = time.time() + 1
    series = prometheus.query_range(f'otel_rl_scalar_step{{{run},name="{reward}"}}', started,
                                    end, 0.5)
    assert series, prometheus.names()
    steps = [float(v) for _, v in series[0]["values"]]
    assert len(set(steps)) >= 2 and steps == sorted(steps)
    (value,) = prometheus.query(f'otel_rl_scalar{{{run},name="{reward}"}}')
    assert float(value["value"][1]) == float(value["value"][1])  # a number, not NaN
    # FPS: the rate of the env-steps counter, and the framework's own FPS scalar.
    rate = prometheus.query(f"sum(rate(otel_rl_env_steps_total{{{run}}}[5m]))")
    assert float(rate[0]["value"][1]) > 0
    if fps_gauge is not None:
        (fps,) = prometheus.query(f'otel_rl_scalar{{{run},name="{fps_gauge}"}}')
        assert float(fps["value"][1]) > 0
    # Every query of the provisioned Grafana dashboard has this run's data (explicit buckets:
    # the native-histogram queries are for metrics_histogram=exponential), but the set_gauge
    # panels where the framework sets no gauge (Sample Factory; ML-Agents' GaugeWriter does)
    # and, without an FPS scalar, that query.
    from tests.test_metrics_stack import dashboard_queries

    for title, expr in dashboard_queries(run_id).items():
        if "otel_rl_block_duration_seconds{" in expr or ("otel_rl_gauge{" in expr and not gauges):
            continue
        if fps_gauge is None and title == "FPS (env steps / s) / B":
            continue
        assert prometheus.query(expr), f"dashboard panel {title!r} is empty: {expr}"
    # An exemplar of that block resolves to a span Jaeger holds.
    groups = prometheus.exemplars(f'otel_rl_block_duration_seconds_bucket{{{run},'
                                  f'block="{busiest}"}}', started - 5, end)
    exemplars = [e for g in groups for e in g["exemplars"]]
    assert exemplars
    resolved = 0
    for exemplar in exemplars[:5]:
        span = jaeger.wait_for_span(exemplar["labels"]["trace_id"], exemplar["labels"]["span_id"])
        resolved += span["name"] == busiest
    assert resolved == min(5, len(exemplars))


@pytest.mark.prometheus
@pytest.mark.jaeger
def test_sample_factory_run_in_prometheus(venvs: Any, prometheus: PrometheusServer,
                                          jaeger: JaegerServer, tmp_path: Path) -> None:
    venv: Venv = venvs("sf")
    run_id = f"sf-{time.time_ns()}"
    out = tmp_path / "otel-rl"
    started = time.time()
    done = venv.run(venv.bin / "otel-rl", "run", "--output", str(out), "--", "python",
                    *SF_COMMAND, cwd=tmp_path, timeout=600,
                    **_endpoints(prometheus, jaeger, run_id))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # Sample Factory writes its FPS scalar only once two of its 5 s reports have counted steps:
    # a run that trains its 30,000 steps faster than that (the compiled Timing, an idle
    # machine) writes none. What it wrote to its own TensorBoard files is what must arrive.
    events = list((tmp_path / "train" / "cartpole").rglob("events.out.tfevents*"))
    assert events, "Sample Factory wrote its TensorBoard summaries"
    wrote_fps = any(b"perf/_fps" in f.read_bytes() for f in events)
    _check_run(prometheus, jaeger, run_id, started, load(out / "timers.json"),
               reward="reward/reward", fps_gauge="perf/_fps" if wrote_fps else None,
               gauges=False)


@pytest.mark.prometheus
@pytest.mark.jaeger
def test_mlagents_run_in_prometheus(venvs: Any, prometheus: PrometheusServer,
                                    jaeger: JaegerServer, tmp_path: Path) -> None:
    venv: Venv = venvs("mlagents")
    run_id = f"mla-{time.time_ns()}"
    out = tmp_path / "otel-rl"
    started = time.time()
    done = venv.run(venv.bin / "otel-rl", "run", "--output", str(out), "--",
                    str(HERE / "mlagents_train.py"), "results", "--steps", str(ML_STEPS),
                    cwd=tmp_path, timeout=600, **_endpoints(prometheus, jaeger, run_id))
    assert done.returncode == 0, done.stderr[-3000:]
    _check_run(prometheus, jaeger, run_id, started, load(out / "timers.json"),
               reward="Environment/Cumulative Reward", fps_gauge=None, gauges=True)
    # The behavior name is the category (StatsReporter's and the TensorBoard folder's).
    (steps,) = prometheus.query(f'otel_rl_env_steps_total{{otel_rl_run_id="{run_id}"}}')
    assert steps["metric"]["category"] == "Simple"
    assert float(steps["value"][1]) == ML_STEPS


# --- TensorBoard files are untouched ---------------------------------------------------------

def _records(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file (length, its CRC, data, its CRC)."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        yield data[at + 12:at + 12 + length]
        at += 12 + length + 4
    assert at == len(data)


def _without_wall_time(event: bytes) -> bytes:
    """An Event message without field 1 (``wall_time``, a double): the only field that
    differs between two runs writing the same values."""
    out, at = bytearray(), 0
    while at < len(event):
        start = at
        key = 0
        shift = 0
        while True:
            byte = event[at]
            at += 1
            key |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        wire = key & 7
        if wire == 0:
            while event[at] & 0x80:
                at += 1
            at += 1
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length = shift = 0
            while True:
                byte = event[at]
                at += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            at += length
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        if key >> 3 != 1:
            out += event[start:at]
    return bytes(out)


def _events(logdir: Path) -> list[bytes]:
    (path,) = logdir.glob("events.out.tfevents.*")
    return [_without_wall_time(r) for r in _records(path)]


@pytest.mark.parametrize(("target", "kind"), [("sf", "tensorboardX"), ("mlagents", "torch")])
def test_tensorboard_event_files_stay_byte_for_byte_under_otel_rl_run(
        venvs: Any, tmp_path: Path, target: str, kind: str) -> None:
    venv: Venv = venvs(target)
    script = str(HERE / "tb_scalars.py")
    plain = venv.run(venv.python, script, kind, str(tmp_path / "plain"), cwd=tmp_path)
    otel = venv.run(venv.bin / "otel-rl", "run", "--output", str(tmp_path / "out"), "--",
                    script, kind, str(tmp_path / "otel"), cwd=tmp_path)
    assert plain.returncode == 0 and otel.returncode == 0, plain.stderr + otel.stderr
    # Same events, byte for byte, once the wall-time field is set aside.
    assert _events(tmp_path / "otel") == _events(tmp_path / "plain")
    assert len(_events(tmp_path / "plain")) == 1 + 2 * 10 + 1
    # And the scalars were recorded by otel_rl under `otel-rl run` (not when plain).
    assert json.loads(plain.stdout.strip().splitlines()[-1]) == []
    recorded = {(row[1], row[2], row[3]) for row in json.loads(otel.stdout.strip().splitlines()[-1])}
    assert recorded == {("reward/reward", 4.5, 4500), ("perf/_fps", 5734.5, 4500)}
