"""``certs install`` through the real kubernetes client, against tests/kubeapi.py.

Only what the real API server (tests/apiserver/test_install.py) cannot
produce on demand: a webhook configuration of two webhooks rewritten in one
patch, and a refused create or patch in the middle of an install.
"""

from __future__ import annotations

import base64
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from tests.kubeapi import FakeApi, serve
from webhook import tls

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


@pytest.mark.parametrize(
    ("deny", "message"),
    [
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


def test_unreachable_api(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with socket.socket() as closed:  # a port nothing listens on once the block ends
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    done = install(kubeconfig)
    assert done.returncode == 1
    assert "cannot reach the Kubernetes API" in done.stderr
