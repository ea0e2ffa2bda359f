"""The Collector configs in collector-config/ are checked by a real collector binary.

Jaeger v2 *is* an OpenTelemetry Collector distribution, so ``jaeger validate`` runs the real
config resolution (``${env:VAR:-default}``), component factories and config validation. It
lacks a few contrib components; the test asks the binary which (``jaeger components``),
checks that only the expected ones are missing, and validates a variant with those swapped
for a Jaeger equivalent:

- ``health_check`` (contrib extension)  -> ``healthcheckv2`` with ``use_v2: true``
- ``file`` (contrib exporter)           -> ``debug``

Everything else — receivers, memory_limiter, batch, tail_sampling and its policies, the
otlp exporters — is validated as written.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.jaeger import free_port, on_a_port_still_free, start_jaeger

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "collector-config"
CONTRIB_CONFIGS = sorted(
    p for p in CONFIG_DIR.glob("*.yaml") if p.name != "jaeger-tail-sampling.yaml"
)
JAEGER_CONFIG = CONFIG_DIR / "jaeger-tail-sampling.yaml"

#: Components of otelcol-contrib these configs may use (all in the contrib distribution).
CONTRIB_COMPONENTS = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "batch", "tail_sampling"},
    "exporters": {"otlp", "otlphttp", "file", "debug"},
    "extensions": {"health_check"},
}
#: What each config needs that Jaeger's distribution does not have.
EXPECTED_MISSING_IN_JAEGER = {
    "to-jaeger.yaml": {"extensions/health_check"},
    "to-tempo.yaml": {"extensions/health_check"},
    "tail-sampling.yaml": {"extensions/health_check"},
    "to-jaeger-and-tempo-with-file.yaml": {"extensions/health_check", "exporters/file"},
}
SECTIONS = ("receivers", "processors", "exporters", "extensions", "connectors")


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def component_types(config: dict[str, Any]) -> set[str]:
    """``section/type`` for every component the config defines (``otlp/jaeger`` -> ``otlp``)."""
    return {
        f"{section}/{name.split('/')[0]}"
        for section in SECTIONS
        for name in (config.get(section) or {})
    }


def jaeger_components(binary: str) -> set[str]:
    out = subprocess.run([binary, "components"], capture_output=True, text=True, check=True).stdout
    listing = yaml.safe_load(out)
    return {
        f"{section}/{item['name']}" for section in SECTIONS for item in listing.get(section) or []
    }


def substitute_for_jaeger(config: dict[str, Any]) -> dict[str, Any]:
    """Swap contrib-only components for Jaeger-distribution equivalents (see module doc)."""
    config = copy.deepcopy(config)
    service = config["service"]
    extensions = config.get("extensions") or {}
    for name in list(extensions):
        if name.split("/")[0] == "health_check":
            endpoint = extensions.pop(name)["endpoint"]
            new = "healthcheckv2" + name[len("health_check") :]
            extensions[new] = {"use_v2": True, "http": {"endpoint": endpoint}}
            service["extensions"] = [new if e == name else e for e in service["extensions"]]
    exporters = config.get("exporters") or {}
    for name in list(exporters):
        if name.split("/")[0] == "file":
            exporters.pop(name)
            new = "debug" + name[len("file") :]
            exporters[new] = {"verbosity": "basic"}
            for pipeline in service["pipelines"].values():
                pipeline["exporters"] = [new if e == name else e for e in pipeline["exporters"]]
    return config


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_RL_")}
    env.update(extra)
    return env


def validate(binary: str, path: Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        [binary, "validate", f"--config={path}"],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=60,
    )
    assert result.returncode == 0, f"{path.name} does not validate:\n{result.stderr[-3000:]}"


def resolved(binary: str, path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The config after the binary resolved ``${env:...}`` references."""
    result = subprocess.run(
        [binary, "print-config", "--mode=unredacted", "--format=json", f"--config={path}"],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def jaeger_variant(path: Path, tmp_path: Path) -> Path:
    out = tmp_path / f"jaeger-variant-{path.name}"
    out.write_text(yaml.safe_dump(substitute_for_jaeger(load(path)), sort_keys=False))
    return out


def listen_endpoints(config: dict[str, Any]) -> list[str]:
    """Every address a config listens on (receivers and extensions)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "endpoint" and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(config.get("receivers"))
    walk(config.get("extensions"))
    return found


# Static checks -----------------------------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = sorted(CONFIG_DIR.glob("*.yaml")) + sorted((REPO / "docker").rglob("*.yaml"))
    assert len(files) >= 9
    for path in files:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("path", CONTRIB_CONFIGS, ids=lambda p: p.name)
def test_contrib_configs_use_only_contrib_components(path: Path) -> None:
    config = load(path)
    for item in component_types(config):
        section, kind = item.split("/")
        assert kind in CONTRIB_COMPONENTS[section], f"{path.name}: {item} is not in contrib"
    for pipeline in config["service"]["pipelines"].values():
        for section in ("receivers", "processors", "exporters"):
            for name in pipeline.get(section, []):
                assert name in config[section], f"{path.name}: {name} used but not defined"


@pytest.mark.parametrize("path", [*CONTRIB_CONFIGS, JAEGER_CONFIG], ids=lambda p: p.name)
def test_memory_limiter_comes_first_and_batches_stay_under_the_grpc_limit(path: Path) -> None:
    config = load(path)
    processors = config["service"]["pipelines"]["traces"]["processors"]
    assert processors[0] == "memory_limiter"
    assert processors[-1] == "batch"  # after sampling, so batches hold only kept spans
    # A few hundred bytes per otel_rl span: 4096 spans stay far below 4 MiB.
    assert config["processors"]["batch"]["send_batch_max_size"] <= 4096
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["max_recv_msg_size_mib"] >= 4


def test_tail_sampling_policies_are_the_same_for_contrib_and_jaeger() -> None:
    contrib = load(CONFIG_DIR / "tail-sampling.yaml")["processors"]["tail_sampling"]
    jaeger = load(JAEGER_CONFIG)["processors"]["tail_sampling"]
    assert contrib == jaeger
    kinds = {policy["type"]: policy for policy in contrib["policies"]}
    assert kinds["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert "latency" in kinds and "probabilistic" in kinds


# Checked by the real binary ----------------------------------------------------------------


@pytest.mark.jaeger
@pytest.mark.parametrize("path", CONTRIB_CONFIGS, ids=lambda p: p.name)
def test_contrib_config_validates_with_jaeger_standins(
    jaeger_binary: str, path: Path, tmp_path: Path
) -> None:
    config = load(path)
    missing = component_types(config) - jaeger_components(jaeger_binary)
    assert missing == EXPECTED_MISSING_IN_JAEGER[path.name]
    variant = jaeger_variant(path, tmp_path)
    assert component_types(load(variant)) <= jaeger_components(jaeger_binary)
    validate(jaeger_binary, variant)


@pytest.mark.jaeger
def test_jaeger_tail_sampling_config_validates_as_written(jaeger_binary: str) -> None:
    assert component_types(load(JAEGER_CONFIG)) <= jaeger_components(jaeger_binary)
    validate(jaeger_binary, JAEGER_CONFIG)


@pytest.mark.jaeger
def test_validation_catches_a_mistyped_value(jaeger_binary: str, tmp_path: Path) -> None:
    # The negative control: validate really decodes values, not just YAML.
    broken = tmp_path / "broken.yaml"
    broken.write_text(JAEGER_CONFIG.read_text().replace("${env:OTEL_RL_SLOW_MS:-1000}", "fast"))
    result = subprocess.run(
        [jaeger_binary, "validate", f"--config={broken}"], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "threshold_ms" in result.stderr


def on_free_ports(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The config with every listening endpoint moved to a free 127.0.0.1 port, and its
    health URL."""
    config = copy.deepcopy(config)
    config.setdefault("service", {})["telemetry"] = {
        "metrics": {"level": "none"},
        "logs": {"level": "warn"},
    }
    protocols = config["receivers"]["otlp"]["protocols"]
    for protocol in protocols.values():
        protocol["endpoint"] = f"127.0.0.1:{free_port()}"
    health_port = free_port()
    for name, extension in config["extensions"].items():
        if name.startswith("healthcheckv2"):
            extension["http"]["endpoint"] = f"127.0.0.1:{health_port}"
    return config, f"http://127.0.0.1:{health_port}/status"


@pytest.mark.jaeger
@pytest.mark.parametrize("path", [*CONTRIB_CONFIGS, JAEGER_CONFIG], ids=lambda p: p.name)
def test_config_starts_and_becomes_healthy(jaeger_binary: str, path: Path, tmp_path: Path) -> None:
    # `validate` does not build everything: tail_sampling checks its policy types only when
    # it starts. So each config (with Jaeger stand-ins, on free ports) is started for real.
    def start() -> Any:
        config, health_url = on_free_ports(substitute_for_jaeger(load(path)))
        return start_jaeger(jaeger_binary, config, health_url, tmp_path, env=clean_env())

    process = on_a_port_still_free(start)
    try:
        assert process.process.poll() is None
    finally:
        process.stop()


@pytest.mark.jaeger
def test_start_catches_an_unknown_sampling_policy(jaeger_binary: str, tmp_path: Path) -> None:
    def start() -> Any:
        config, health_url = on_free_ports(load(JAEGER_CONFIG))
        config["processors"]["tail_sampling"]["policies"][1]["type"] = "latencyy"
        return start_jaeger(jaeger_binary, config, health_url, tmp_path, env=clean_env())

    with pytest.raises(RuntimeError, match="latencyy"):
        on_a_port_still_free(start)


@pytest.mark.jaeger
@pytest.mark.parametrize("path", [*CONTRIB_CONFIGS, JAEGER_CONFIG], ids=lambda p: p.name)
def test_everything_listens_on_loopback_by_default(
    jaeger_binary: str, path: Path, tmp_path: Path
) -> None:
    source = path if path == JAEGER_CONFIG else jaeger_variant(path, tmp_path)
    endpoints = listen_endpoints(resolved(jaeger_binary, source))
    assert endpoints
    assert all(e.startswith("127.0.0.1:") for e in endpoints), endpoints


@pytest.mark.jaeger
@pytest.mark.parametrize("path", CONTRIB_CONFIGS, ids=lambda p: p.name)
def test_environment_overrides_bind_address_and_backends(
    jaeger_binary: str, path: Path, tmp_path: Path
) -> None:
    env = clean_env(
        OTEL_RL_BIND="0.0.0.0",
        OTEL_RL_JAEGER_ENDPOINT="jaeger.example:4317",
        OTEL_RL_TEMPO_ENDPOINT="tempo.example:4317",
        OTEL_RL_SPANS_FILE="/data/spans.jsonl",
    )
    config = resolved(jaeger_binary, jaeger_variant(path, tmp_path), env)
    endpoints = listen_endpoints(config)
    assert endpoints and all(e.startswith("0.0.0.0:") for e in endpoints), endpoints
    exporters = load(path)["exporters"]
    for name in exporters:
        if name == "otlp/jaeger":
            assert config["exporters"][name]["endpoint"] == "jaeger.example:4317"
        if name == "otlp/tempo":
            assert config["exporters"][name]["endpoint"] == "tempo.example:4317"
    validate(jaeger_binary, jaeger_variant(path, tmp_path), env)


@pytest.mark.jaeger
def test_tail_sampling_knobs_resolve_to_typed_values(jaeger_binary: str) -> None:
    env = clean_env(OTEL_RL_SLOW_MS="250", OTEL_RL_KEEP_PERCENT="12.5", OTEL_RL_DECISION_WAIT="3s")
    config = resolved(jaeger_binary, JAEGER_CONFIG, env)["processors"]["tail_sampling"]
    policies = {p["type"]: p for p in config["policies"]}
    assert policies["latency"]["latency"]["threshold_ms"] == 250
    assert policies["probabilistic"]["probabilistic"]["sampling_percentage"] == 12.5
    assert config["decision_wait"] == "3s"
    validate(jaeger_binary, JAEGER_CONFIG, env)
