"""The real-control-plane tier: one cluster for the whole run, the webhook installed into it.

The binaries are built (or found in the cache) once, after collection and
before the first test, so a cold build is not charged to any test's
timeout. Without Go the tier skips with one reason line; with CI=true a
missing or failing build fails every test of the tier instead.

``installed`` does what an operator does, as far as a cluster without
nodes allows: applies the rendered manifests server-side, runs
``certs install`` as the ServiceAccount the manifests give it, and serves
the webhook with the Secret it wrote and the policy of the ConfigMap, as
the Deployment would mount them. The one change: the webhook configuration
calls a URL on loopback, since without kube-proxy a Service cannot be
reached from the API server.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.conftest import Server, free_port, start_server, stop_server
from tests.controlplane import build
from tests.controlplane.cluster import ControlPlane, running

NS = "gpushare-system"
ROOT = Path(__file__).resolve().parents[2]
_BINARIES = pytest.StashKey[build.Binaries | str]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.apiserver)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("apiserver") for item in session.items):
        return
    try:
        session.config.stash[_BINARIES] = build.ensure()
    except build.Unavailable as error:
        session.config.stash[_BINARIES] = str(error)


@pytest.fixture(scope="session")
def binaries(pytestconfig: pytest.Config) -> build.Binaries:
    found = pytestconfig.stash.get(_BINARIES, "the build did not run")
    if isinstance(found, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"real control plane unavailable in CI: {found}", pytrace=False)
        pytest.skip(f"real control plane unavailable: {found}")
    return found


@pytest.fixture(scope="session")
def plane(
    binaries: build.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with running(tmp_path_factory.mktemp("control-plane"), binaries) as started:
        yield started


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and "plane" in getattr(item, "fixturenames", ()):
        plane: ControlPlane | None = item.funcargs.get("plane")  # type: ignore[attr-defined]
        if plane is not None:
            for name in ("kube-apiserver", "kube-controller-manager", "etcd"):
                report.sections.append((f"{name} log (tail)", plane.log_tail(name, 40)))
            report.sections.append(("control plane files", str(plane.root)))
    return report


def api_client(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def webhook_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def render_manifests() -> str:
    """``kubectl kustomize manifests``: what an operator applies."""
    return subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "manifests")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def service_account_kubeconfig(plane: ControlPlane, name: str, folder: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of ServiceAccount ``gpushare-system/name``."""
    token = plane.kubectl("create", "token", name, "-n", NS, "--duration=2h").stdout.strip()
    return plane.token_kubeconfig(folder / f"{name}.kubeconfig", token, namespace=NS)


@dataclass
class Installed:
    plane: ControlPlane
    api: client.ApiClient
    server: Server
    certs_kubeconfig: Path
    webhook_kubeconfig: Path
    folder: Path
    first_install: subprocess.CompletedProcess[str]
    args: list[str]

    def stop_webhook(self) -> None:
        stop_server(self.server)

    def start_webhook(self) -> None:
        """The same ``serve`` again, on the same port: the webhook configuration still fits."""
        self.server = start_server(
            self.args,
            ca=self.server.ca,
            log=self.server.log,
            port=self.server.port,
            host=self.server.host,
        )

    def webhook_timeout(self) -> float:
        stored = json.loads(
            self.plane.kubectl(
                "get", "mutatingwebhookconfiguration", "gpushare-webhook", "-o", "json"
            ).stdout
        )
        return float(stored["webhooks"][0]["timeoutSeconds"])

    def reviews(self) -> float:
        """Reviews the webhook has answered; one worker, so a scrape is exact."""
        metrics = self.server.metrics()
        return sum(
            v for k, v in metrics.items() if k.startswith("gpushare_admission_reviews_total")
        )


def install_certs(kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return webhook_cli(
        "certs",
        "install",
        f"--kubeconfig={kubeconfig}",
        "--namespace=gpushare-system",
        "--ip=127.0.0.1",
        *extra,
    )


def mounted_files(api: client.ApiClient, folder: Path) -> tuple[Path, Path, Path]:
    """The serving Secret and the policy ConfigMap as the Deployment would mount them."""
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret("gpushare-webhook-tls", NS).data
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for key in ("tls.crt", "tls.key"):
        path = folder / key
        path.write_bytes(base64.b64decode(secret[key]))
        paths.append(path)
    policy = core.read_namespaced_config_map("gpushare-webhook-policy", NS).data["policy.yaml"]
    (folder / "policy.yaml").write_text(policy)
    return paths[0], paths[1], folder / "policy.yaml"


def point_webhook_at(plane: ControlPlane, url: str, name: str = "gpushare-webhook") -> None:
    """Call ``url`` instead of the Service: nothing on loopback routes a ClusterIP."""
    stored = json.loads(
        plane.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout
    )
    ops: list[dict[str, Any]] = []
    for index, hook in enumerate(stored["webhooks"]):
        if "service" in hook["clientConfig"]:
            ops.append({"op": "remove", "path": f"/webhooks/{index}/clientConfig/service"})
        ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/url", "value": url})
    plane.kubectl(
        "patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(ops)
    )


@pytest.fixture(scope="session")
def installed(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    folder = tmp_path_factory.mktemp("installed")
    plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=gpushare-tests",
        "-f",
        "-",
        stdin=render_manifests(),
    )
    certs_kubeconfig = service_account_kubeconfig(plane, "gpushare-webhook-certs", folder)
    first = install_certs(certs_kubeconfig)
    assert first.returncode == 0, first.stderr
    api = api_client(plane.kubeconfig)
    cert, key, policy = mounted_files(api, folder / "mounted")
    webhook_kubeconfig = service_account_kubeconfig(plane, "gpushare-webhook", folder)
    ca = client.CoreV1Api(api).read_namespaced_secret("gpushare-webhook-tls", NS).data["ca.crt"]
    (folder / "ca.crt").write_bytes(base64.b64decode(ca))
    port = free_port()
    args = [
        *("--cert", str(cert), "--key", str(key), "--policy", str(policy)),
        *("--workers", "1", "--watch-nodes", "--kubeconfig", str(webhook_kubeconfig)),
    ]
    server = start_server(
        args,
        ca=folder / "ca.crt",
        log=folder / "webhook.log",
        port=port,
        host="127.0.0.1",  # the name the API server calls and the certificate holds
    )
    installed = Installed(
        plane, api, server, certs_kubeconfig, webhook_kubeconfig, folder, first, args
    )
    try:
        point_webhook_at(plane, f"https://127.0.0.1:{port}/mutate")
        yield installed
    finally:
        stop_server(installed.server)
