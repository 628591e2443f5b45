"""The manifests and ``certs install`` against the real API server and its RBAC."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.install import GUARD, NS, ROOT, Installed, install_certs, render_manifests
from tests.helpers import eventually


def stored(
    plane: ControlPlane, kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    args = ["get", kind, name, "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    found: dict[str, Any] = json.loads(plane.kubectl(*args).stdout)
    return found


def test_every_rendered_object_is_stored(installed: Installed) -> None:
    for doc in yaml.safe_load_all(render_manifests()):
        if not doc:
            continue
        meta = doc["metadata"]
        found = stored(installed.plane, doc["kind"], meta["name"], meta.get("namespace"))
        assert found["metadata"]["name"] == meta["name"]
    mwc = stored(installed.plane, "mutatingwebhookconfiguration", "gpushare-webhook")
    assert mwc["webhooks"][0]["matchConditions"][0]["name"] == "gpu-pods"


def test_the_api_server_compiles_the_match_condition(installed: Installed) -> None:
    """A broken expression is refused by the API server: the shipped one was compiled."""
    (mwc,) = [
        doc
        for doc in yaml.safe_load_all(render_manifests())
        if doc and doc["kind"] == "MutatingWebhookConfiguration"
    ]
    mwc["webhooks"][0]["matchConditions"][0]["expression"] = "object.spec.containers.exists(c,"
    done = installed.plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(mwc), check=False
    )
    assert done.returncode != 0
    assert "compilation failed" in done.stderr


def versions(installed: Installed) -> dict[str, str]:
    plane = installed.plane
    return {
        "ca": stored(plane, "secret", "gpushare-webhook-ca", NS)["metadata"]["resourceVersion"],
        "tls": stored(plane, "secret", "gpushare-webhook-tls", NS)["metadata"]["resourceVersion"],
        "mwc": stored(plane, "mutatingwebhookconfiguration", "gpushare-webhook")["metadata"][
            "resourceVersion"
        ],
    }


def bundle(installed: Installed) -> list[x509.Certificate]:
    mwc = stored(installed.plane, "mutatingwebhookconfiguration", "gpushare-webhook")
    return x509.load_pem_x509_certificates(
        base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"])
    )


def test_certs_install_as_its_service_account_is_idempotent_and_rotates(
    installed: Installed,
) -> None:
    assert len(bundle(installed)) == 1
    before = versions(installed)
    again = install_certs(installed.certs_kubeconfig)
    assert again.returncode == 0, again.stderr
    assert versions(installed) == before  # nothing written on a second run
    # Far enough ahead that the 10-year CA is due: both CAs are trusted during the overlap.
    rotated = install_certs(installed.certs_kubeconfig, "--renew-before=3600d")
    assert rotated.returncode == 0, rotated.stderr
    after = versions(installed)
    assert len(bundle(installed)) == 2
    # resourceVersions are etcd revisions here: the CA went out before the serving pair.
    assert int(before["tls"]) < int(after["ca"]) < int(after["mwc"]) < int(after["tls"])


def test_a_missing_permission_is_named(installed: Installed) -> None:
    """The webhook's own ServiceAccount may list nodes, not touch Secrets."""
    done = install_certs(installed.webhook_kubeconfig)
    assert done.returncode == 1
    assert "forbidden to get Secret gpushare-system/gpushare-webhook-ca" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_shipped_rbac_is_no_more_than_needed(installed: Installed) -> None:
    plane = installed.plane

    def can(kubeconfig: Any, *args: str) -> bool:
        done = plane.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)
        return done.stdout.strip() == "yes"

    certs, hook = installed.certs_kubeconfig, installed.webhook_kubeconfig
    assert can(certs, "update", "secrets/gpushare-webhook-tls", "-n", NS)
    assert not can(certs, "get", "secrets/other", "-n", NS)
    assert not can(certs, "list", "secrets", "-n", NS)
    assert not can(certs, "get", "secrets/gpushare-webhook-tls", "-n", "default")
    assert can(certs, "patch", "mutatingwebhookconfigurations/gpushare-webhook")
    assert not can(certs, "patch", "mutatingwebhookconfigurations/other")
    assert can(hook, "watch", "nodes")
    assert not can(hook, "get", "secrets", "-n", NS)
    assert not can(hook, "patch", "nodes")


def test_a_missing_webhook_configuration_says_to_apply_the_manifests(installed: Installed) -> None:
    done = install_certs(installed.certs_kubeconfig, "--webhook-config=absent")
    assert done.returncode == 1
    # RBAC names the one configuration certs install may read: another is forbidden.
    assert "forbidden to get MutatingWebhookConfiguration absent" in done.stderr
    admin = install_certs(installed.plane.kubeconfig, "--webhook-config=absent")
    assert admin.returncode == 1
    assert "MutatingWebhookConfiguration 'absent' not found: apply the manifests" in admin.stderr


def _certs_jobs(plane: ControlPlane) -> list[dict[str, Any]]:
    listed = plane.kubectl(
        "get", "jobs", "-n", NS, "-l", "app.kubernetes.io/name=gpushare-webhook-certs", "-o", "json"
    )
    jobs: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return jobs


def _apply(plane: ControlPlane, manifests: Path) -> None:
    """``kubectl apply -k manifests``, but for the webhook configuration and the guard.

    The install points that configuration at a URL on loopback (see
    tests/controlplane/install.py); applying it again would put the Service back.
    The guard holds pods to the shipped policy, where the tier serves many
    (``render_manifests``): left bound, it would refuse the pods of a test
    that serves another.
    """
    rendered = plane.kubectl("kustomize", str(manifests)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kept = [
        d
        for d in docs
        if d["kind"] != "MutatingWebhookConfiguration"
        and not d["metadata"]["name"].startswith(GUARD)
    ]
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(kept))


def test_an_upgrade_applies_over_a_running_install(installed: Installed, tmp_path: Path) -> None:
    """``kubectl apply -k`` with a new image tag, while the first certs Job is still there.

    A Job's pod template is immutable, so a Job of a fixed name would refuse
    the new image ("field is immutable"); its name carries a hash of its
    image, and the upgrade makes a new Job beside the old one.
    """
    plane = installed.plane
    copy = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", copy)
    _apply(plane, copy)  # as an operator installs; changes nothing here
    before = {job["metadata"]["name"] for job in _certs_jobs(plane)}
    assert len(before) == 1
    base = copy / "base" / "kustomization.yaml"
    kustomization = yaml.safe_load(base.read_text())
    kustomization["images"][0]["newTag"] = "0.2.0-rc.1"
    base.write_text(yaml.safe_dump(kustomization))
    try:
        _apply(plane, copy)
        images = {
            job["metadata"]["name"]: job["spec"]["template"]["spec"]["containers"][0]["image"]
            for job in _certs_jobs(plane)
        }
        assert before < images.keys()
        assert sorted(images.values()) == ["gpushare-webhook:0.1.0", "gpushare-webhook:0.2.0-rc.1"]
        deployment = stored(plane, "deployment", "gpushare-webhook", NS)
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "gpushare-webhook:0.2.0-rc.1"
    finally:
        _apply(plane, ROOT / "manifests")  # back to the image of the install


def test_the_webhook_pods_are_critical_and_admitted_by_their_quota(installed: Installed) -> None:
    """The API server here admits critical pods only under a quota naming their class (GKE's rule).

    The Deployment's pods are created by the real ReplicaSet controller with
    the system-cluster-critical priority; the same pod in a namespace
    without the manifests' quota is refused.
    """
    plane = installed.plane

    def webhook_pods() -> list[dict[str, Any]]:
        listed = plane.kubectl(
            "get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=gpushare-webhook", "-o", "json"
        )
        pods: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
        return pods

    replicas = stored(plane, "deployment", "gpushare-webhook", NS)["spec"]["replicas"]
    eventually(lambda: len(webhook_pods()) >= replicas)
    for pod in webhook_pods():
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
        assert pod["spec"]["priority"] == 2000000000
    elsewhere = plane.kubectl(
        "run",
        "critical",
        "-n",
        "default",
        "--image=gpushare-webhook:0.1.0",
        "--restart=Never",
        '--overrides={"spec":{"priorityClassName":"system-cluster-critical"}}',
        check=False,
    )
    assert elsewhere.returncode != 0
    assert "insufficient quota to match these scopes" in elsewhere.stderr
