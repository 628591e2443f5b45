"""The monitoring the chart ships: alerts that fire when they should, a dashboard of real metrics.

The alerts (charts/gpushare-webhook/files/alerts.yaml) pass ``promtool check
rules`` and the unit tests of tests/monitoring/alerts_test.yaml (``promtool
test rules``: each fires on the series that should fire it and not
otherwise); promtool is built from Prometheus's Go module by the test run.
Every query of the alerts and the Grafana dashboard names only metrics a
running webhook or node agent exports (scraped from the real server and
agent), and every metric docs/operations.md lists is used by one of them.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import gotools
from tests.conftest import Server
from tests.helpers import container, eventually, pod, unavailable
from tests.test_chart import CHART, helm, template  # noqa: F401 - helm: a fixture
from tests.test_node_metrics import Agent, plant_node

ROOT = Path(__file__).parent.parent
ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
METRIC = re.compile(r"\bgpushare_[a-z_]+\b")


@pytest.fixture(scope="session")
def promtool() -> str:
    try:
        return str(gotools.tool("promtool"))
    except gotools.Unavailable as error:
        unavailable("promtool", error)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)


def test_the_alerts_are_valid_rules(promtool: str) -> None:
    done = run(promtool, "check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 13 rules found" in done.stdout


def test_each_alert_fires_when_it_should_and_only_then(promtool: str) -> None:
    done = run(promtool, "test", "rules", str(ROOT / "tests" / "monitoring" / "alerts_test.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(
        re.findall(r"alertname: (\w+)", (ROOT / "tests/monitoring/alerts_test.yaml").read_text())
    )
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert tested == {rule["alert"] for rule in rules}


def test_the_prometheus_rule_is_the_alerts_file(helm: str) -> None:  # noqa: F811
    docs = template(helm, "--set", "monitoring.prometheusRule.enabled=true")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def queries() -> dict[str, str]:
    """Every PromQL expression the alerts and the dashboard hold, by where it is."""
    found = {
        f"alert {rule['alert']}": rule["expr"]
        for rule in yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    }
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    return found


def exported(server: Server) -> set[str]:
    """The metric names a running webhook exports, once it has done what each one counts."""
    server.ask(pod(container(gpu="4")))  # admitted: the per-namespace counters
    server.ask(pod(container(gpu="99")))
    server.request("POST", "/mutate", b"{", {"Content-Type": "application/json"})
    with socket.create_connection(("127.0.0.1", server.port)) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # cut: plain HTTP
        plain.recv(1024)
    names: set[str] = set()

    def scraped() -> bool:  # each worker adds its tally within a second
        names.update(name.partition("{")[0] for name in server.metrics())
        return {"gpushare_connections_cut_total", "gpushare_admitted_gpu_pods_total"} <= names

    eventually(scraped)
    return names


def agent_exported(tmp: Path) -> set[str]:
    """The metric names a node agent serves over a node with regions of every kind."""
    pods_dir, pods = plant_node(tmp)
    agent = Agent(tmp, "--pods-dir", str(pods_dir), "--pods-from", str(pods))
    try:
        text = agent.scrape()
    finally:
        agent.stop()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_every_query_names_only_metrics_the_webhook_or_agent_exports(
    server: Server, tmp_path: Path
) -> None:
    names = exported(server) | agent_exported(tmp_path)
    unknown = {
        where: sorted(set(METRIC.findall(expr)) - names) for where, expr in queries().items()
    }
    assert {where: missing for where, missing in unknown.items() if missing} == {}


def test_every_documented_metric_is_watched(server: Server) -> None:
    table = [
        line
        for line in (ROOT / "docs" / "operations.md").read_text().splitlines()
        if line.startswith("| `gpushare_")
    ]
    documented = set(METRIC.findall("\n".join(table)))
    used = {name for expr in queries().values() for name in METRIC.findall(expr)}
    # A histogram is queried by its buckets; the doc names the family.
    used |= {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    assert documented, "docs/operations.md lists the metrics"
    assert sorted(documented - used) == []
    assert documented <= {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported(server)}


def test_the_dashboard_answers_an_operators_questions() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    for wanted in (
        "Reviews per second, by decision",
        "Refused or warned, by reason",
        "Latency",
        "Policy stale",
        "Node watch connected",
        "GPU memory admitted per namespace",
        "Certificate expires in",
        "GPU memory used against limit, per container",
        "Tampered regions",
    ):
        assert wanted in titles
    datasources = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert datasources == {"${datasource}"}  # whichever Prometheus the viewer picks
