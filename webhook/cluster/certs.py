"""Publishing the serving certificate: ``certs install``.

Owns the ``kubernetes.io/tls`` Secret of the serving pair, the CA in a
Secret of its own, and the ``caBundle`` of every webhook of the
MutatingWebhookConfiguration: made when missing, renewed when close to
expiry, the CA kept (and trusted alongside its successor) across rotations.
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from webhook import tls
from webhook.cluster.kube import call, not_found
from webhook.errors import KubeError


@dataclass(frozen=True)
class InstallReport:
    ca_rotated: bool
    serving_renewed: bool
    webhooks_patched: int
    not_after: dt.datetime
    ca_not_after: dt.datetime


def _decode(data: dict[str, str] | None, key: str) -> bytes | None:
    value = (data or {}).get(key)
    return base64.b64decode(value) if value else None


def _encode(values: dict[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode("ascii") for key, value in values.items()}


def install_certificates(
    api: client.ApiClient,
    *,
    namespace: str,
    secret: str,
    ca_secret: str,
    webhook_config: str,
    dns_names: list[str],
    ips: list[str] | None = None,
    days: int = 365,
    renew_before: dt.timedelta = dt.timedelta(days=30),
    key_type: tls.KeyType = "ecdsa",
    now: dt.datetime | None = None,
) -> InstallReport:
    """Make or renew the webhook's certificates and publish them; idempotent.

    Order matters for a rotation without failed requests: the new CA goes
    into caBundle (next to the old one) before the serving Secret changes,
    so the apiserver trusts the new certificate before any pod serves it.
    """
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    ca_where, tls_where = f"Secret {namespace}/{ca_secret}", f"Secret {namespace}/{secret}"
    ca_obj = call(
        ca_where,
        "get",
        "secrets",
        lambda: not_found(lambda: core.read_namespaced_secret(ca_secret, namespace)),
    )
    tls_obj = call(
        tls_where,
        "get",
        "secrets",
        lambda: not_found(lambda: core.read_namespaced_secret(secret, namespace)),
    )
    mwc = call(
        f"MutatingWebhookConfiguration {webhook_config}",
        "get",
        "mutatingwebhookconfigurations",
        lambda: not_found(lambda: admission.read_mutating_webhook_configuration(webhook_config)),
    )
    if mwc is None:
        raise KubeError(
            f"MutatingWebhookConfiguration {webhook_config!r} not found: apply the manifests "
            "(kubectl apply -k manifests/) before installing certificates"
        )
    ca_data = ca_obj.data if ca_obj is not None else None
    tls_data = tls_obj.data if tls_obj is not None else None
    rotation = tls.rotate(
        ca_certs=_pem_certs(_decode(ca_data, "ca.crt")),
        ca_key=_pem_key(_decode(ca_data, "ca.key")),
        cert=next(iter(_pem_certs(_decode(tls_data, "tls.crt"))), None),
        key=_pem_key(_decode(tls_data, "tls.key")),
        dns_names=dns_names,
        ips=ips or (),
        days=days,
        renew_before=renew_before,
        key_type=key_type,
        now=now,
    )
    bundle = rotation.bundle_pem()
    # NB: the Secrets belong to the webhook configuration they serve: deleting
    # it (kubectl delete -k, helm uninstall) lets the garbage collector take
    # them too, so an uninstall leaves nothing behind.
    owner = client.V1OwnerReference(
        api_version="admissionregistration.k8s.io/v1",
        kind="MutatingWebhookConfiguration",
        name=mwc.metadata.name,
        uid=mwc.metadata.uid,
    )
    if rotation.ca_rotated or _decode(ca_data, "ca.crt") != bundle or not _owned_by(ca_obj, owner):
        _put_secret(
            core,
            namespace=namespace,
            name=ca_secret,
            existing=ca_obj,
            kind="Opaque",
            values={"ca.crt": bundle, "ca.key": tls.pem_key(rotation.ca_key)},
            owner=owner,
        )
    ops = [
        {
            "op": "add",
            "path": f"/webhooks/{index}/clientConfig/caBundle",
            "value": base64.b64encode(bundle).decode("ascii"),
        }
        for index, hook in enumerate(mwc.webhooks or [])
        if (hook.client_config.ca_bundle or "") != base64.b64encode(bundle).decode("ascii")
    ]
    if ops:
        # NB: a JSON patch with a test of resourceVersion would fail on a
        # concurrent edit; the indexes come from the object just read.
        ops.insert(
            0,
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": mwc.metadata.resource_version,
            },
        )
        call(
            f"MutatingWebhookConfiguration {webhook_config}",
            "patch",
            "mutatingwebhookconfigurations",
            lambda: admission.patch_mutating_webhook_configuration(webhook_config, ops),
        )
    serving = {
        "tls.crt": tls.pem_cert(rotation.cert),
        "tls.key": tls.pem_key(rotation.key),
        "ca.crt": bundle,
    }
    if (
        rotation.serving_renewed
        or any(_decode(tls_data, k) != v for k, v in serving.items())
        or not _owned_by(tls_obj, owner)
    ):
        _put_secret(
            core,
            namespace=namespace,
            name=secret,
            existing=tls_obj,
            kind="kubernetes.io/tls",
            values=serving,
            owner=owner,
        )
    return InstallReport(
        ca_rotated=rotation.ca_rotated,
        serving_renewed=rotation.serving_renewed,
        webhooks_patched=len(ops) - 1 if ops else 0,
        not_after=rotation.cert.not_valid_after_utc,
        ca_not_after=rotation.ca_cert.not_valid_after_utc,
    )


def _pem_certs(data: bytes | None) -> list[Any]:
    if not data:
        return []
    try:
        return tls.parse_certs(data)
    except tls.CertificateError:
        return []


def _pem_key(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return tls.parse_key(data)
    except tls.CertificateError:
        return None


def _owned_by(secret: Any, owner: client.V1OwnerReference) -> bool:
    refs = (secret.metadata.owner_references or []) if secret is not None else []
    return any(ref.uid == owner.uid for ref in refs)


def _put_secret(
    core: client.CoreV1Api,
    *,
    namespace: str,
    name: str,
    existing: Any,
    kind: str,
    values: dict[str, bytes],
    owner: client.V1OwnerReference,
) -> None:
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels={
                "app.kubernetes.io/name": "gpushare-webhook",
                "app.kubernetes.io/managed-by": "gpushare-webhook",
            },
            owner_references=[owner],
            resource_version=existing.metadata.resource_version if existing is not None else None,
        ),
        type=kind,
        data=_encode(values),
    )
    where = f"Secret {namespace}/{name}"
    if existing is None:
        call(where, "create", "secrets", lambda: core.create_namespaced_secret(namespace, body))
    elif existing.type != kind:
        raise KubeError(f"{where} has type {existing.type!r}, expected {kind!r}: delete it first")
    else:
        call(
            where,
            "update",
            "secrets",
            lambda: core.replace_namespaced_secret(name, namespace, body),
        )
