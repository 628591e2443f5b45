"""``certs install`` through the real kubernetes client, against a local API server."""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from tests.kubeapi import FakeApi, serve
from webhook import kube, tls

NS = "gpushare-system"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApi, Path]]:
    with serve(tmp_path) as (api, kubeconfig):
        api.add_webhook_config("gpushare-webhook", hooks=2)
        yield api, kubeconfig


def install(kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "certs",
            "install",
            "--namespace",
            NS,
            "--kubeconfig",
            str(kubeconfig),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def secret_bytes(api: FakeApi, name: str, key: str) -> bytes:
    return base64.b64decode(api.secrets[(NS, name)]["data"][key])


def test_install_writes_the_secret_and_every_ca_bundle(cluster: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = cluster
    done = install(kubeconfig)
    assert done.returncode == 0, done.stderr
    secret = api.secrets[(NS, "gpushare-webhook-tls")]
    assert secret["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(secret_bytes(api, "gpushare-webhook-tls", "tls.crt"))
    assert "gpushare-webhook.gpushare-system.svc" in tls.subject_names(cert)
    bundle = secret_bytes(api, "gpushare-webhook-ca", "ca.crt")
    for hook in api.mwcs["gpushare-webhook"]["webhooks"]:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == bundle
    cert.verify_directly_issued_by(x509.load_pem_x509_certificates(bundle)[0])
    assert "caBundle updated in 2 webhook(s)" in done.stdout


def test_install_is_idempotent(cluster: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = cluster
    assert install(kubeconfig).returncode == 0
    versions = {k: v["metadata"]["resourceVersion"] for k, v in api.secrets.items()}
    mwc_version = api.mwcs["gpushare-webhook"]["metadata"]["resourceVersion"]
    api.requests.clear()
    done = install(kubeconfig, "--renew-before", "30d")
    assert done.returncode == 0, done.stderr
    assert "kept serving certificate" in done.stdout
    assert {k: v["metadata"]["resourceVersion"] for k, v in api.secrets.items()} == versions
    assert api.mwcs["gpushare-webhook"]["metadata"]["resourceVersion"] == mwc_version
    assert all(verb == "get" for verb, _ in api.requests)


def test_renewal_publishes_the_new_ca_before_the_new_certificate(
    cluster: tuple[FakeApi, Path],
) -> None:
    api, kubeconfig = cluster
    client = kube.api_client(str(kubeconfig))
    common = {
        "namespace": NS,
        "secret": "s",
        "ca_secret": "ca",
        "webhook_config": "gpushare-webhook",
        "dns_names": ["svc"],
        "days": 30,
    }
    start = dt.datetime.now(dt.UTC)
    kube.install_certificates(client, **common, now=start)
    old_ca = secret_bytes(api, "ca", "ca.crt")
    # Far enough on that the 10-year CA is due for rotation.
    report = kube.install_certificates(
        client, **common, renew_before=dt.timedelta(days=30), now=start + dt.timedelta(days=3600)
    )
    assert report.ca_rotated
    assert report.serving_renewed
    bundle = x509.load_pem_x509_certificates(secret_bytes(api, "ca", "ca.crt"))
    assert x509.load_pem_x509_certificate(old_ca) in bundle  # both trusted during the overlap
    order = [path for verb, path in api.requests if verb in ("put", "patch", "post")]
    assert order[-3:] == [
        f"/api/v1/namespaces/{NS}/secrets/ca",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpushare-webhook",
        f"/api/v1/namespaces/{NS}/secrets/s",
    ]


@pytest.mark.parametrize(
    ("deny", "message"),
    [
        (("get", "secrets"), "forbidden to get Secret gpushare-system/gpushare-webhook-ca"),
        (("post", "secrets"), "forbidden to create Secret"),
        (
            ("patch", "mutatingwebhookconfigurations"),
            "forbidden to patch MutatingWebhookConfiguration",
        ),
    ],
)
def test_rbac_denial_is_a_clear_error(
    cluster: tuple[FakeApi, Path], deny: tuple[str, str], message: str
) -> None:
    api, kubeconfig = cluster
    api.deny.add(deny)
    done = install(kubeconfig)
    assert done.returncode == 1
    assert message in done.stderr
    assert "rbac.yaml" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_webhook_configuration(cluster: tuple[FakeApi, Path]) -> None:
    _, kubeconfig = cluster
    done = install(kubeconfig, "--webhook-config", "absent")
    assert done.returncode == 1
    assert "MutatingWebhookConfiguration 'absent' not found: apply the manifests" in done.stderr


def test_unreachable_api(tmp_path: Path) -> None:
    with serve(tmp_path) as (_, kubeconfig):
        pass  # the server is gone once the block ends
    done = install(kubeconfig)
    assert done.returncode == 1
    assert "cannot reach the Kubernetes API" in done.stderr
