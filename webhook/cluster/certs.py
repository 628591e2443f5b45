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


@dataclass(frozen=True)
class _Found:
    """The objects as read before any write; a Secret not made yet is ``None``.

    Every later step decides against this one reading, so the writes and the
    caBundle patch's resourceVersion test all refer to the same state.
    """

    ca_obj: Any
    tls_obj: Any
    mwc: Any

    @property
    def ca_data(self) -> dict[str, str] | None:
        data: dict[str, str] | None = self.ca_obj.data if self.ca_obj is not None else None
        return data

    @property
    def tls_data(self) -> dict[str, str] | None:
        data: dict[str, str] | None = self.tls_obj.data if self.tls_obj is not None else None
        return data


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
    found = _read(
        core,
        admission,
        namespace=namespace,
        secret=secret,
        ca_secret=ca_secret,
        webhook_config=webhook_config,
    )
    rotation = tls.rotate(
        ca_certs=_pem_certs(_decode(found.ca_data, "ca.crt")),
        ca_key=_pem_key(_decode(found.ca_data, "ca.key")),
        cert=next(iter(_pem_certs(_decode(found.tls_data, "tls.crt"))), None),
        key=_pem_key(_decode(found.tls_data, "tls.key")),
        dns_names=dns_names,
        ips=ips or (),
        days=days,
        renew_before=renew_before,
        key_type=key_type,
        now=now,
    )
    bundle = rotation.bundle_pem()
    owner = _owner(found.mwc)
    _put_ca_secret(
        core, found, rotation, bundle=bundle, namespace=namespace, name=ca_secret, owner=owner
    )
    patched = _patch_ca_bundles(admission, found.mwc, name=webhook_config, bundle=bundle)
    _put_serving_secret(
        core, found, rotation, bundle=bundle, namespace=namespace, name=secret, owner=owner
    )
    return InstallReport(
        ca_rotated=rotation.ca_rotated,
        serving_renewed=rotation.serving_renewed,
        webhooks_patched=patched,
        not_after=rotation.cert.not_valid_after_utc,
        ca_not_after=rotation.ca_cert.not_valid_after_utc,
    )


def _read(
    core: client.CoreV1Api,
    admission: client.AdmissionregistrationV1Api,
    *,
    namespace: str,
    secret: str,
    ca_secret: str,
    webhook_config: str,
) -> _Found:
    """Read both Secrets and the configuration; only the configuration must exist."""
    ca_obj = call(
        f"Secret {namespace}/{ca_secret}",
        "get",
        "secrets",
        lambda: not_found(lambda: core.read_namespaced_secret(ca_secret, namespace)),
    )
    tls_obj = call(
        f"Secret {namespace}/{secret}",
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
    return _Found(ca_obj=ca_obj, tls_obj=tls_obj, mwc=mwc)


def _owner(mwc: Any) -> client.V1OwnerReference:
    # The Secrets belong to the webhook configuration they serve: deleting
    # it (kubectl delete -k, helm uninstall) lets the garbage collector take
    # them too, so an uninstall leaves nothing behind.
    return client.V1OwnerReference(
        api_version="admissionregistration.k8s.io/v1",
        kind="MutatingWebhookConfiguration",
        name=mwc.metadata.name,
        uid=mwc.metadata.uid,
    )


def _put_ca_secret(
    core: client.CoreV1Api,
    found: _Found,
    rotation: tls.Rotation,
    *,
    bundle: bytes,
    namespace: str,
    name: str,
    owner: client.V1OwnerReference,
) -> None:
    """Write the CA Secret unless it already holds this bundle, key and owner."""
    if (
        rotation.ca_rotated
        or _decode(found.ca_data, "ca.crt") != bundle
        or not _owned_by(found.ca_obj, owner)
    ):
        _put_secret(
            core,
            namespace=namespace,
            name=name,
            existing=found.ca_obj,
            kind="Opaque",
            values={"ca.crt": bundle, "ca.key": tls.pem_key(rotation.ca_key)},
            owner=owner,
        )


def _patch_ca_bundles(
    admission: client.AdmissionregistrationV1Api, mwc: Any, *, name: str, bundle: bytes
) -> int:
    """Put ``bundle`` into every webhook that lacks it; return how many were patched."""
    encoded = base64.b64encode(bundle).decode("ascii")
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}
        for index, hook in enumerate(mwc.webhooks or [])
        if (hook.client_config.ca_bundle or "") != encoded
    ]
    if not ops:
        return 0
    # A JSON patch with a test of resourceVersion would fail on a
    # concurrent edit; the indexes come from the object just read.
    guard = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": mwc.metadata.resource_version,
    }
    call(
        f"MutatingWebhookConfiguration {name}",
        "patch",
        "mutatingwebhookconfigurations",
        lambda: admission.patch_mutating_webhook_configuration(name, [guard, *ops]),
    )
    return len(ops)


def _put_serving_secret(
    core: client.CoreV1Api,
    found: _Found,
    rotation: tls.Rotation,
    *,
    bundle: bytes,
    namespace: str,
    name: str,
    owner: client.V1OwnerReference,
) -> None:
    """Write the serving Secret unless it already holds this pair, bundle and owner."""
    serving = {
        "tls.crt": tls.pem_cert(rotation.cert),
        "tls.key": tls.pem_key(rotation.key),
        "ca.crt": bundle,
    }
    if (
        rotation.serving_renewed
        or any(_decode(found.tls_data, k) != v for k, v in serving.items())
        or not _owned_by(found.tls_obj, owner)
    ):
        _put_secret(
            core,
            namespace=namespace,
            name=name,
            existing=found.tls_obj,
            kind="kubernetes.io/tls",
            values=serving,
            owner=owner,
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
