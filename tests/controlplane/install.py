"""Install the webhook into a running control plane, as an operator would, and serve it.

As far as a cluster without nodes allows: the rendered manifests applied
server-side, ``certs install`` run as the ServiceAccount the manifests give
it, and ``serve`` run with the Secret it wrote and the policy of the
ConfigMap, as the Deployment would mount them. The one change: the webhook
configuration calls a URL on loopback, since without kube-proxy a Service
cannot be reached from the API server.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.conftest import Server, free_port, start_server, stop_server
from tests.controlplane.cluster import ControlPlane

NS = "gpushare-system"
ROOT = Path(__file__).resolve().parents[2]


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


GUARD = "gpushare-webhook-guard"


def render_manifests(*, guard: bool = False) -> str:
    """``kubectl kustomize manifests``: what an operator applies.

    Without ``guard``, less the guard's ValidatingAdmissionPolicy and its
    bindings: the tier serves many policies (scheduler names, resource
    names), and the guard holds pods to the one it was made from.
    tests/apiserver/test_guard.py applies it for the policy being served.
    """
    text = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "manifests")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    if guard:
        return text
    kept = [
        doc
        for doc in yaml.safe_load_all(text)
        if doc and not doc["metadata"]["name"].startswith(GUARD)
    ]
    return yaml.safe_dump_all(kept)


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

    def set_policy(self, text: str) -> None:
        """Serve with policy ``text`` from now on: the ConfigMap and the mounted file changed,
        the webhook restarted on its port (so the next review is decided by it)."""
        write_policy(self.plane, text)
        self.stop_webhook()
        policy = Path(self.args[self.args.index("--policy") + 1])
        policy.write_text(text)
        self.start_webhook()

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
    """The serving Secret (its CA too) and the policy ConfigMap, as the Deployment mounts them."""
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret("gpushare-webhook-tls", NS).data
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for key in ("tls.crt", "tls.key", "ca.crt"):
        path = folder / key
        path.write_bytes(base64.b64decode(secret[key]))
        paths.append(path)
    policy = core.read_namespaced_config_map("gpushare-webhook-policy", NS).data["policy.yaml"]
    (folder / "policy.yaml").write_text(policy)
    return paths[0], paths[1], folder / "policy.yaml"


def write_policy(plane: ControlPlane, text: str) -> None:
    """Put ``text`` in the policy ConfigMap, as an operator would edit it."""
    plane.kubectl(
        "patch",
        "configmap",
        "gpushare-webhook-policy",
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"data": {"policy.yaml": text}}),
    )


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


def install(
    plane: ControlPlane, folder: Path, *, workers: int | None = 1, policy: str | None = None
) -> Installed:
    """Apply, issue certificates, serve; stop ``installed.server`` when done.

    One worker by default, so that a scrape of /metrics counts every review
    at once; ``workers=None`` serves with the default of ``serve``. With
    ``policy``, that text replaces the shipped policy in the ConfigMap.
    """
    folder.mkdir(parents=True, exist_ok=True)
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
    if first.returncode != 0:
        raise RuntimeError(f"certs install failed: {first.stderr.strip()}")
    if policy is not None:
        write_policy(plane, policy)
    api = api_client(plane.kubeconfig)
    cert, key, policy_file = mounted_files(api, folder / "mounted")
    webhook_kubeconfig = service_account_kubeconfig(plane, "gpushare-webhook", folder)
    port = free_port()
    args = [
        *("--cert", str(cert), "--key", str(key), "--policy", str(policy_file)),
        *(("--workers", str(workers)) if workers else ()),
        *("--watch-nodes", "--kubeconfig", str(webhook_kubeconfig)),
    ]
    server = start_server(
        args,
        ca=folder / "mounted" / "ca.crt",
        log=folder / "webhook.log",
        port=port,
        host="127.0.0.1",  # the name the API server calls and the certificate holds
    )
    installed = Installed(
        plane, api, server, certs_kubeconfig, webhook_kubeconfig, folder, first, args
    )
    point_webhook_at(plane, f"https://127.0.0.1:{port}/mutate")
    return installed
