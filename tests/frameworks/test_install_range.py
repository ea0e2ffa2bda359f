"""The supported range of OpenTelemetry and protobuf: otel_rl with its ``otlp`` extra, installed
by a plain ``pip install`` into small venvs holding the oldest (1.25.0, protobuf 3.20.3) and the
newest (1.45.2, protobuf 7.36.2) releases it supports. In each: spans over OTLP/gRPC (otel_rl's
own transport) and over OTLP/HTTP through the standard SDK exporter reach a real receiver,
forked workers join the run, ``otel-rl tree`` rebuilds timers.json and ``otel-rl replay`` sends
the spans file again."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import counts, load

VERSIONS = {"otel-oldest": ("1.25.0", "3.20.3"), "otel-newest": ("1.45.2", "7.36.2")}

PROGRAM = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys

    import otel_rl
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from otel_rl.timers import hierarchical_timer


    def work(i):
        with hierarchical_timer("worker_step"):
            pass


    if __name__ == "__main__":
        out, grpc_endpoint, http_endpoint = sys.argv[1:4]
        otel_rl.configure(spans="all", output_dir=out, endpoint=grpc_endpoint, protocol="grpc",
                          exporters=[OTLPSpanExporter(endpoint=http_endpoint + "/v1/traces")])
        with hierarchical_timer("start_workers"):
            workers = [mp.get_context("fork").Process(target=work, args=(i,)) for i in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        otel_rl.shutdown()
    """
)


@pytest.mark.parametrize("target", sorted(VERSIONS))
def test_oldest_and_newest_opentelemetry_and_protobuf(
    target: str, venvs: Any, otlp_receiver: Any, tmp_path: Path
) -> None:
    venv = venvs(target)
    versions = venv.run(venv.python, "-c", (
        "import google.protobuf, opentelemetry.sdk.version as v;"
        "print(v.__version__, google.protobuf.__version__)"), cwd=tmp_path)
    assert versions.stdout.split() == list(VERSIONS[target]), versions.stderr
    (tmp_path / "program.py").write_text(PROGRAM)
    out = tmp_path / "out"
    done = venv.run(venv.python, "program.py", out, otlp_receiver.grpc_endpoint,
                    otlp_receiver.http_endpoint, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # Each block twice: once from otel_rl's own gRPC transport, once from the SDK exporter.
    spans = otlp_receiver.wait_for(2 * 3)
    assert sorted(s.name for s in spans if s.name in ("start_workers", "worker_step")) == \
        ["start_workers"] * 2 + ["worker_step"] * 4
    assert len({s.resource["process.pid"] for s in spans if s.name == "worker_step"}) == 2

    tree = load(out / "timers.json")
    assert tree["children"]["start_workers"]["children"]["worker_step"]["count"] == 2
    rebuilt = tmp_path / "rebuilt.json"
    again = venv.run(venv.bin / "otel-rl", "tree", out / "spans.otlp.jsonl", "-o", rebuilt,
                     cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert counts(load(rebuilt)) == counts(tree)

    otlp_receiver.clear()
    replayed = venv.run(venv.bin / "otel-rl", "replay", out / "spans.otlp.jsonl", "--endpoint",
                        otlp_receiver.http_endpoint, "--protocol", "http/protobuf", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert sum(s.name == "worker_step" for s in otlp_receiver.wait_for(4)) == 2
