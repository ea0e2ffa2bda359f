"""docker/compose.yaml holds together: files exist, names and ports line up, configs validate.

Docker is not needed: the compose file is read as YAML, and the configs it mounts are checked
by the real Jaeger binary (the collector's with Jaeger stand-ins, as in
test_collector_configs.py). Where ``docker compose`` exists, it checks the file too.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.test_collector_configs import (
    jaeger_components,
    jaeger_variant,
    load,
    substitute_for_jaeger,
    validate,
)

DOCKER = Path(__file__).resolve().parents[1] / "docker"
COMPOSE = DOCKER / "compose.yaml"


def compose() -> dict[str, Any]:
    return load(COMPOSE)


def services() -> dict[str, Any]:
    result: dict[str, Any] = compose()["services"]
    return result


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """container path -> host path for the service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")):
            out[target] = (DOCKER / source).resolve()
    return out


def mounted_config(name: str, container_path: str) -> Path:
    return mounts(services()[name])[container_path]


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) for each published port."""
    out = []
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"port {spec!r} is not bound to an explicit host address"
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def test_stack_has_the_five_services_with_pinned_images() -> None:
    assert set(services()) == {"otel-collector", "jaeger", "tempo", "prometheus", "grafana"}
    for name, service in services().items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned {image}"
    assert services()["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services()["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")


def test_every_mounted_file_exists() -> None:
    for name, service in services().items():
        for target, source in mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
            assert source.is_relative_to(DOCKER), f"{name}: mounts {source} from outside docker/"


def test_only_loopback_ports_and_only_the_collector_takes_otlp() -> None:
    expected = {
        "otel-collector": {4317, 4318},
        "jaeger": {16686},
        "grafana": {3000},
        "tempo": set(),
        "prometheus": {9090},
    }
    for name, service in services().items():
        ports = published(service)
        assert all(ip == "127.0.0.1" for ip, _, _ in ports), f"{name}: {ports}"
        assert {host for _, host, _ in ports} == expected[name], name


def test_collector_listens_where_compose_publishes() -> None:
    config = load(mounted_config("otel-collector", "/etc/otelcol-contrib/config.yaml"))
    protocols = config["receivers"]["otlp"]["protocols"]
    listening = {port_of(p["endpoint"]) for p in protocols.values()}
    container_ports = {c for _, _, c in published(services()["otel-collector"])}
    assert listening == container_ports == {4317, 4318}
    # Inside the container it must listen on all interfaces to be reachable at all.
    assert all(p["endpoint"].startswith("0.0.0.0:") for p in protocols.values())


def test_collector_exports_to_the_backends_otlp_grpc_ports() -> None:
    collector = load(mounted_config("otel-collector", "/etc/otelcol-contrib/config.yaml"))
    jaeger = load(mounted_config("jaeger", "/etc/jaeger/config.yaml"))
    tempo = load(mounted_config("tempo", "/etc/tempo.yaml"))
    backend_grpc_ports = {
        "jaeger": port_of(jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]),
        "tempo": port_of(
            tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
        ),
    }
    exported = {}
    for name, exporter in collector["exporters"].items():
        if name.startswith("otlphttp/"):
            continue  # metrics (test_collector_sends_metrics_to_prometheus_otlp)
        host, port = exporter["endpoint"].rsplit(":", 1)
        assert host in services(), f"{name} exports to {host}, not a compose service"
        assert exporter["tls"]["insecure"] is True
        exported[host] = int(port)
    assert exported == backend_grpc_ports
    assert set(collector["service"]["pipelines"]["traces"]["exporters"]) == {
        name for name in collector["exporters"] if not name.startswith("otlphttp/")}


def test_collector_sends_metrics_to_prometheus_otlp() -> None:
    collector = load(mounted_config("otel-collector", "/etc/otelcol-contrib/config.yaml"))
    pipeline = collector["service"]["pipelines"]["metrics"]
    assert pipeline["receivers"] == ["otlp"] and pipeline["processors"][0] == "memory_limiter"
    (name,) = pipeline["exporters"]
    url = urlsplit(collector["exporters"][name]["endpoint"])
    assert (url.hostname, url.port, url.path) == ("prometheus", 9090, "/api/v1/otlp")
    command = services()["prometheus"]["command"]
    assert "--web.enable-otlp-receiver" in command
    assert "--enable-feature=exemplar-storage" in command
    config = command[0].split("=", 1)[1]
    assert config in mounts(services()["prometheus"])


def test_commands_point_at_the_mounted_configs() -> None:
    for name, flag in (
        ("otel-collector", "--config="),
        ("jaeger", "--config="),
        ("tempo", "-config.file="),
    ):
        args = [a for a in services()[name]["command"] if a.startswith(flag)]
        assert len(args) == 1, name
        assert args[0][len(flag) :] in mounts(services()[name]), name


def test_grafana_datasources_reach_tempo_and_jaeger() -> None:
    grafana = services()["grafana"]
    provisioning = mounts(grafana)["/etc/grafana/provisioning"]
    datasources = load(provisioning / "datasources" / "tempo.yaml")["datasources"]
    by_type = {d["type"]: urlsplit(d["url"]) for d in datasources}
    assert (by_type["prometheus"].hostname, by_type["prometheus"].port) == ("prometheus", 9090)
    tempo = load(mounted_config("tempo", "/etc/tempo.yaml"))
    jaeger = load(mounted_config("jaeger", "/etc/jaeger/config.yaml"))
    assert (by_type["tempo"].hostname, by_type["tempo"].port) == (
        "tempo",
        tempo["server"]["http_listen_port"],
    )
    assert by_type["tempo"].port == 3200
    jaeger_query_port = port_of(jaeger["extensions"]["jaeger_query"]["http"]["endpoint"])
    assert (by_type["jaeger"].hostname, by_type["jaeger"].port) == ("jaeger", jaeger_query_port)
    assert {host for _, _, host in published(services()["jaeger"])} == {jaeger_query_port}
    assert set(grafana["depends_on"]) == {"tempo", "jaeger", "prometheus"}


def test_tempo_runs_single_binary_with_local_storage() -> None:
    tempo = load(mounted_config("tempo", "/etc/tempo.yaml"))
    assert "-target=all" in services()["tempo"]["command"]
    assert tempo["storage"]["trace"]["backend"] == "local"
    assert tempo["storage"]["trace"]["wal"]["path"]
    assert tempo["storage"]["trace"]["local"]["path"]


@pytest.mark.jaeger
def test_mounted_collector_config_validates(jaeger_binary: str, tmp_path: Path) -> None:
    path = mounted_config("otel-collector", "/etc/otelcol-contrib/config.yaml")
    config = load(path)
    missing = {
        f"{section}/{name.split('/')[0]}"
        for section in ("receivers", "processors", "exporters", "extensions")
        for name in config.get(section) or {}
    } - jaeger_components(jaeger_binary)
    assert missing == {"extensions/health_check"}  # the contrib extension; swapped for the check
    assert substitute_for_jaeger(config)["extensions"]["healthcheckv2"]["use_v2"] is True
    validate(jaeger_binary, jaeger_variant(path, tmp_path))


@pytest.mark.jaeger
def test_mounted_jaeger_config_validates_as_written(jaeger_binary: str) -> None:
    validate(jaeger_binary, mounted_config("jaeger", "/etc/jaeger/config.yaml"))


def test_docker_compose_accepts_the_file() -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "compose", "version"], capture_output=True).returncode
    ):
        pytest.skip("docker compose is not installed")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
