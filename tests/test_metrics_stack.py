"""The metrics half of the stack (issue 18): the compose stack's Prometheus config, checked by
the real ``promtool`` and started by the real ``prometheus`` with the compose command's flags;
the Grafana dashboard and datasources, wired to each other."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.prometheus import CONFIG, PrometheusServer
from tests.test_compose import load, mounted_config, mounts, services

DOCKER = Path(__file__).resolve().parents[1] / "docker"
PROVISIONING = DOCKER / "grafana" / "provisioning"
DASHBOARD = PROVISIONING / "dashboards" / "otel-rl.json"


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


#: Grafana's own variables the dashboard may use (filled as Grafana would at a 15 s scrape).
BUILTINS = {"$__rate_interval": "1m"}


def _fill(expr: str, values: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **values}.items():
        expr = expr.replace(name if name.startswith("$") else f"${name}", value)
    return expr


def dashboard_queries(run: str, block: str = ".*", path: str = ".*") -> dict[str, str]:
    """Every panel target's PromQL, with the dashboard's variables filled in as Grafana would
    (``.*``: the variable's "All"; or one value, which needs no regex escaping here), and each
    variable's ``label_values(SERIES, LABEL)`` as the PromQL that lists those values
    (``group by (LABEL) (SERIES)``)."""
    values = {"run": run, "block": block, "path": path}
    out = {}
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            out[f"{panel['title']} / {target['refId']}"] = _fill(target["expr"], values)
    for variable in dashboard()["templating"]["list"]:
        found = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable["query"]["query"])
        assert found, variable
        series, label = found.groups()
        out[f"variable {variable['name']}"] = _fill(f"group by ({label}) ({series})", values)
    return out


@pytest.mark.prometheus
@pytest.mark.parametrize("config", [mounted_config("prometheus", "/etc/prometheus/prometheus.yml"),
                                    None], ids=["compose", "test-fixture"])
def test_prometheus_configs_pass_promtool(promtool_binary: str, config: Path | None,
                                          tmp_path: Path) -> None:
    if config is None:
        config = tmp_path / "fixture.yml"
        config.write_text(CONFIG)
    done = subprocess.run([promtool_binary, "check", "config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.prometheus
def test_promtool_refuses_a_broken_config(promtool_binary: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(mounted_config("prometheus", "/etc/prometheus/prometheus.yml").read_text()
                      .replace("promote_resource_attributes", "promote_resource_attributez"))
    done = subprocess.run([promtool_binary, "check", "config", str(broken)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "promote_resource_attributez" in done.stdout + done.stderr


@pytest.mark.prometheus
def test_the_compose_prometheus_starts_with_its_flags(prometheus_binary: str,
                                                      tmp_path: Path) -> None:
    command = services()["prometheus"]["command"]
    flags = [f for f in command if not f.startswith(("--config.file=", "--storage.tsdb.path="))]
    assert set(flags) == {"--web.enable-otlp-receiver", "--enable-feature=exemplar-storage"}
    config = mounted_config("prometheus", "/etc/prometheus/prometheus.yml").read_text()
    server = PrometheusServer(prometheus_binary, tmp_path, config)  # the same flags, on loopback
    try:
        assert server.api("status/flags")["web.enable-otlp-receiver"] == "true"
        assert "exemplar-storage" in server.api("status/flags")["enable-feature"]
    finally:
        server.stop()


def test_dashboard_is_provisioned_and_uses_the_provisioned_datasources() -> None:
    grafana = services()["grafana"]
    assert mounts(grafana)["/etc/grafana/provisioning"] == PROVISIONING.resolve()
    provider = load(PROVISIONING / "dashboards" / "otel-rl.yaml")["providers"][0]
    assert provider["options"]["path"] == "/etc/grafana/provisioning/dashboards"
    datasources = {d["uid"]: d for d in
                   load(PROVISIONING / "datasources" / "tempo.yaml")["datasources"]}
    used = {t["datasource"]["uid"] for p in dashboard()["panels"] for t in p["targets"]}
    assert used == {"prometheus"} and datasources["prometheus"]["type"] == "prometheus"
    # Exemplars link to the trace: the label Prometheus stores OTLP exemplars' trace id under.
    links = datasources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {(link["name"], datasources[link["datasourceUid"]]["type"]) for link in links} == \
        {("trace_id", "tempo"), ("trace_id", "jaeger")}
    titles = " ".join(p["title"] for p in dashboard()["panels"]).lower()
    for wanted in ("p50", "p99", "fps", "reward", "worker spread"):
        assert wanted in titles
    assert any(t.get("exemplar") for p in dashboard()["panels"] for t in p["targets"])


def test_every_dashboard_variable_is_defined_before_it_is_used() -> None:
    # Grafana leaves an unknown `$name` in the query as is: PromQL then fails or matches
    # nothing, and the panel is empty without an error. A variable's own query may use only
    # the variables above it (Grafana resolves them in order).
    used = re.compile(r"\$(?:\{(\w+)[^}]*\}|(\w+))")
    defined: list[str] = []
    for variable in dashboard()["templating"]["list"]:
        for found in used.finditer(variable["query"]["query"]):
            name = found.group(1) or found.group(2)
            assert name in defined or f"${name}" in BUILTINS, (variable["name"], name)
        defined.append(variable["name"])
    assert len(set(defined)) == len(defined)
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            for found in used.finditer(target["expr"]):
                name = found.group(1) or found.group(2)
                assert name in defined or f"${name}" in BUILTINS, (panel["title"], name)
    # What the tests fill in is every variable there is.
    assert set(defined) == {"run", "block", "path"}


def test_dashboard_panels_tile_the_grid_and_name_their_queries_once() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["y"] >= 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]  # Grafana's grid is 24 wide
        mine = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"])
                for dy in range(grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and all(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert target["expr"].strip(), panel["title"]
