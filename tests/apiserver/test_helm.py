"""The Helm chart against the real API server: install, upgrade, uninstall, and its custom objects.

A release of its own (``gpu`` in namespace ``gpushare-helm``) beside the
kustomize install of the tier. Nothing here runs pods (no kubelet), so the
release's certificate Job is run the way the Job would run it: its
container's command, as its ServiceAccount. The release's webhook calls
its Service, which has no endpoints here: it is installed with
``failurePolicy: Ignore`` so that the tier's other GPU pods are not held up
by it. cert-manager's and the Prometheus Operator's CRDs, as their Go
modules ship them, are applied first, so the API server itself validates
the Issuers, Certificates, ServiceMonitor, PodMonitor and PrometheusRule.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import gotools
from tests.apiserver.helpers import delete_namespaces
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.install import ROOT, Installed
from tests.helpers import eventually

CHART = ROOT / "charts" / "gpushare-webhook"
RELEASE, NAMESPACE = "gpu", "gpushare-helm"
NAME = "gpu-gpushare-webhook"  # the release's objects: <release>-<chart>
SAFE = ["--set", "webhook.failurePolicy=Ignore"]  # see the module's docstring


@pytest.fixture(scope="module")
def helm(installed: Installed) -> Iterator[tuple[str, ControlPlane]]:
    try:
        binary = str(gotools.tool("helm"))
        crds = gotools.crd_files()
    except gotools.Unavailable as error:
        pytest.fail(str(error), pytrace=False)
    plane = installed.plane
    for crd in crds:
        plane.kubectl("apply", "--server-side", "-f", str(crd), timeout=120)
    plane.kubectl("wait", "--for=condition=Established", "crd", "--all", timeout=120)
    yield binary, plane
    delete_namespaces(installed.api, NAMESPACE)  # made by --create-namespace


def run_helm(helm: tuple[str, ControlPlane], *args: str) -> subprocess.CompletedProcess[str]:
    binary, plane = helm
    done = subprocess.run(
        [binary, "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


def objects(helm: tuple[str, ControlPlane]) -> list[dict[str, Any]]:
    manifest = run_helm(helm, "get", "manifest", RELEASE, "-n", NAMESPACE).stdout
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def run_certs_job(helm: tuple[str, ControlPlane], folder: Path) -> None:
    """What the release's certificate Job would do: its command, as its ServiceAccount."""
    _, plane = helm
    (job,) = [d for d in objects(helm) if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    token = plane.kubectl(
        "create", "token", pod["serviceAccountName"], "-n", NAMESPACE, "--duration=1h"
    ).stdout.strip()
    kubeconfig = plane.token_kubeconfig(folder / "certs.kubeconfig", token, namespace=NAMESPACE)
    done = subprocess.run(
        [sys.executable, "-m", "webhook", *container["command"][1:], *container["args"],
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def ca_bundle(plane: ControlPlane) -> str:
    found = json.loads(
        plane.kubectl("get", "mutatingwebhookconfiguration", NAME, "-o", "json").stdout
    )
    return str(found["webhooks"][0]["clientConfig"].get("caBundle", ""))


def test_custom_objects_are_valid_to_the_api_server(helm: tuple[str, ControlPlane]) -> None:
    """The cert-manager overlay and the chart's monitoring, dry-run against the CRDs."""
    _, plane = helm
    overlay = plane.kubectl("kustomize", str(ROOT / "manifests/overlays/cert-manager")).stdout
    custom = [d for d in yaml.safe_load_all(overlay) if d and "cert-manager.io" in d["apiVersion"]]
    rendered = run_helm(
        helm, "template", RELEASE, str(CHART), "-n", "gpushare-system",
        "--set", "certificates.mode=cert-manager,monitoring.serviceMonitor.enabled=true",
        "--set", "monitoring.prometheusRule.enabled=true",
    ).stdout  # fmt: skip
    custom += [
        d for d in yaml.safe_load_all(rendered) if d and d["apiVersion"].startswith(("cert", "mon"))
    ]
    assert {d["kind"] for d in custom} == {
        "Issuer",
        "Certificate",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
    }
    done = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(custom), check=False
    )
    assert done.returncode == 0, done.stderr
    # The API server does check them: a rule file that is no list of groups is refused.
    broken = next(d for d in custom if d["kind"] == "PrometheusRule")
    broken = {**broken, "spec": {"groups": "not a list"}}
    done = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(broken), check=False
    )
    assert done.returncode != 0
    assert "spec.groups" in done.stderr


def test_install_upgrade_and_uninstall(helm: tuple[str, ControlPlane], tmp_path: Path) -> None:
    _, plane = helm
    run_helm(helm, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *SAFE)
    run_certs_job(helm, tmp_path)
    bundle = ca_bundle(plane)
    assert bundle, "certs install wrote caBundle"
    first_job = {d["metadata"]["name"] for d in objects(helm) if d["kind"] == "Job"}

    # An upgrade: a new image and a new policy. The Job of the new image is a
    # new Job (the old one, not in the release any more, goes); caBundle stays.
    run_helm(
        helm, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
        "--set", "image.tag=0.2.0,policy.gpuMemory=24",
    )  # fmt: skip
    jobs = json.loads(plane.kubectl("get", "jobs", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    names = {job["metadata"]["name"] for job in jobs}
    assert names
    assert names.isdisjoint(first_job)
    assert jobs[0]["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.2.0")
    assert ca_bundle(plane) == bundle
    policy = json.loads(
        plane.kubectl("get", "configmap", f"{NAME}-policy", "-n", NAMESPACE, "-o", "json").stdout
    )
    assert yaml.safe_load(policy["data"]["policy.yaml"])["gpuMemory"] == 24
    secrets = json.loads(plane.kubectl("get", "secrets", "-n", NAMESPACE, "-o", "json").stdout)
    made = {s["metadata"]["name"] for s in secrets["items"]}
    assert {f"{NAME}-tls", f"{NAME}-ca"} <= made
    tls = next(s for s in secrets["items"] if s["metadata"]["name"] == f"{NAME}-tls")
    assert base64.b64decode(tls["data"]["ca.crt"]).decode() in base64.b64decode(bundle).decode()

    run_helm(helm, "uninstall", RELEASE, "-n", NAMESPACE)

    def left() -> list[str]:
        kinds = "all,cm,secret,sa,role,rolebinding,networkpolicy,pdb,resourcequota"
        found = plane.kubectl("get", kinds, "-n", NAMESPACE, "-o", "name").stdout.split()
        found += plane.kubectl(
            "get", "clusterrole,clusterrolebinding,mutatingwebhookconfiguration,"
            "validatingadmissionpolicy,validatingadmissionpolicybinding", "-o", "name",
            "-l", f"app.kubernetes.io/instance={RELEASE}",
        ).stdout.split()  # fmt: skip
        # What every namespace has of its own is not the release's.
        return [
            f for f in found if f not in ("configmap/kube-root-ca.crt", "serviceaccount/default")
        ]

    eventually(lambda: left() == [], timeout=60)  # the Secrets: the garbage collector's
    deleted = deletions(plane)
    assert deleted.index(("mutatingwebhookconfigurations", NAME)) < min(
        deleted.index(("deployments", NAME)), deleted.index(("services", NAME))
    )


def deletions(plane: ControlPlane) -> list[tuple[str, str]]:
    """(resource, name) of every delete the audit log holds, in the order they were made."""
    found = []
    for line in plane.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef", {})
        if event.get("verb") == "delete" and event.get("stage") == "ResponseComplete":
            found.append((event["requestReceivedTimestamp"], ref.get("resource"), ref.get("name")))
    return [(resource, name) for _, resource, name in sorted(found)]
