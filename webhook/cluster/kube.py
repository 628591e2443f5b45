"""Talking to the Kubernetes API: the only module that imports ``kubernetes``.

Owns the client set-up (in-cluster, or a kubeconfig), installing the
serving certificate (a ``kubernetes.io/tls`` Secret, the CA in its own
Secret, and ``caBundle`` of every webhook of the
MutatingWebhookConfiguration), watching Nodes for their GPU capacity, and
turning API failures into messages that say which permission or object is
missing. The ``kubernetes`` import
costs about 19 MiB per process, so callers import this module only when
they need the API.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from webhook import tls
from webhook.decision.capacity import NodeFacts, NodeStatus, NodeView, gpu_nodes
from webhook.decision.policy import Policy
from webhook.errors import WebhookError

log = logging.getLogger("gpushare_webhook.nodes")

T = TypeVar("T")


class KubeError(WebhookError):
    """The Kubernetes API refused or could not be reached; the message says what to fix."""


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig."""
    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()
                return client.ApiClient()
            except config.ConfigException:
                pass
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError) as error:
        raise KubeError(f"no usable Kubernetes credentials: {error}") from None


def call(what: str, verb: str, resource: str, fn: Callable[[], T]) -> T:
    """Run one API call; explain RBAC denials and unreachable servers."""
    try:
        return fn()
    except ApiException as error:
        if error.status == 403:
            raise KubeError(
                f"forbidden to {verb} {what}: grant the service account '{verb}' on {resource} "
                "(see the Role in manifests/base/rbac.yaml)"
            ) from None
        if error.status == 401:
            raise KubeError(
                f"unauthorized to {verb} {what}: the credentials were refused"
            ) from None
        raise KubeError(f"cannot {verb} {what}: HTTP {error.status} {error.reason}") from None
    except urllib3.exceptions.HTTPError as error:
        raise KubeError(f"cannot reach the Kubernetes API to {verb} {what}: {error}") from None


def _not_found(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except ApiException as error:
        if error.status == 404:
            return None
        raise


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
        lambda: _not_found(lambda: core.read_namespaced_secret(ca_secret, namespace)),
    )
    tls_obj = call(
        tls_where,
        "get",
        "secrets",
        lambda: _not_found(lambda: core.read_namespaced_secret(secret, namespace)),
    )
    mwc = call(
        f"MutatingWebhookConfiguration {webhook_config}",
        "get",
        "mutatingwebhookconfigurations",
        lambda: _not_found(lambda: admission.read_mutating_webhook_configuration(webhook_config)),
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
    if rotation.ca_rotated or _decode(ca_data, "ca.crt") != bundle:
        _put_secret(
            core,
            namespace=namespace,
            name=ca_secret,
            existing=ca_obj,
            kind="Opaque",
            values={"ca.crt": bundle, "ca.key": tls.pem_key(rotation.ca_key)},
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
    if rotation.serving_renewed or any(_decode(tls_data, k) != v for k, v in serving.items()):
        _put_secret(
            core,
            namespace=namespace,
            name=secret,
            existing=tls_obj,
            kind="kubernetes.io/tls",
            values=serving,
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


def _put_secret(
    core: client.CoreV1Api,
    *,
    namespace: str,
    name: str,
    existing: Any,
    kind: str,
    values: dict[str, bytes],
) -> None:
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels={
                "app.kubernetes.io/name": "gpushare-webhook",
                "app.kubernetes.io/managed-by": "gpushare-webhook",
            },
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


# --- nodes -----------------------------------------------------------------


def _facts(node: Any) -> NodeFacts:
    meta, status = node.metadata, node.status
    return NodeFacts(
        name=meta.name or "",
        labels=dict(meta.labels or {}),
        capacity=dict((status.capacity if status is not None else None) or {}),
    )


class NodeWatcher:
    """A list-then-watch of Nodes in a background thread, as an informer does.

    The watch resumes from the last resourceVersion after a broken stream,
    and lists again after 410 Gone. While the API is unreachable the last
    known nodes stay in force; until a first list succeeds (or when no node
    reports GPU memory) reviews fall back to the policy's ``gpuMemory``, and
    the view says so. Start it in each serving process (threads do not
    survive a fork).
    """

    def __init__(
        self,
        make_api: Callable[[], client.ApiClient],
        *,
        watch_timeout: int = 300,
        request_timeout: float = 15.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self._make_api = make_api
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.backoff = backoff
        self._lock = threading.Lock()
        self._facts: dict[str, NodeFacts] = {}
        self._version = 0  # bumps on every change of _facts
        self._cache: tuple[int, Policy, NodeView] | None = None
        self._status = NodeStatus(watching=True, problem="node list not read yet")
        self._stop = threading.Event()
        self._tried = threading.Event()  # set once the first list has been answered or failed
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.lists = 0
        self.watches = 0

    # -- reading (request threads) --

    def status(self) -> NodeStatus:
        return self._status

    def view(self, policy: Policy) -> NodeView:
        cache = self._cache
        if cache is not None and cache[0] == self._version and cache[1] is policy:
            return cache[2]
        with self._lock:
            version, facts, status = self._version, tuple(self._facts.values()), self._status
        fallback = (
            f"GPU sizes come from the policy's gpuMemory ({policy.gpu_memory} {policy.memory_unit})"
        )
        if not status.synced:
            why = status.problem or "not read yet"
            result = NodeView(note=f"{fallback}: the cluster's node list is not available ({why})")
        else:
            nodes = gpu_nodes(facts, policy)
            result = (
                NodeView(nodes=nodes)
                if nodes
                else NodeView(note=f"{fallback}: no node reports {policy.resource_name}")
            )
        self._cache = (version, policy, result)
        return result

    # -- the watch (its own thread) --

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)
        self._thread.start()

    def start_and_wait(self, timeout: float = 5.0) -> None:
        """Start, and give the first list up to ``timeout`` to arrive.

        Each worker runs its own watch; waiting here (after fork, before the
        worker takes connections) keeps a new worker from bounding pods by
        the policy's guess while the cluster's answer is a few ms away. An
        API that does not answer in time only delays the worker, which then
        falls back as usual.
        """
        self.start()
        self._tried.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def _set(self, **changes: Any) -> None:
        old = self._status
        self._status = dataclasses.replace(old, **changes)
        if self._status.tried:
            self._tried.set()
        if self._status.problem and self._status.problem != old.problem:
            log.warning("node watch: %s", self._status.problem)
        elif old.problem and not self._status.problem:
            log.info("node watch: connected again, %d nodes known", self._status.nodes)

    def _replace(self, facts: dict[str, NodeFacts]) -> None:
        with self._lock:
            self._facts = facts
            self._version += 1

    def _apply(self, kind: str, node: Any) -> None:
        facts = _facts(node)
        with self._lock:
            if kind == "DELETED":
                self._facts.pop(facts.name, None)
            else:
                self._facts[facts.name] = facts
            self._version += 1
            count = len(self._facts)
        self._status = dataclasses.replace(self._status, nodes=count)

    def _run(self) -> None:
        core = client.CoreV1Api(self._make_api())
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            streamed = 0
            try:
                if version is None:
                    listed = core.list_node(_request_timeout=self.request_timeout)
                    self.lists += 1
                    self._replace({n.metadata.name: _facts(n) for n in listed.items})
                    version = listed.metadata.resource_version
                    self._set(
                        tried=True, synced=True, connected=True, problem="", nodes=len(listed.items)
                    )
                self.watches += 1
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    core.list_node,
                    resource_version=version,
                    timeout_seconds=self.watch_timeout,
                    allow_watch_bookmarks=True,
                    _request_timeout=(self.request_timeout, self.watch_timeout + 30),
                ):
                    streamed += 1
                    node = event["object"]
                    if event["type"] != "BOOKMARK":
                        self._apply(event["type"], node)
                    version = node.metadata.resource_version or version
                failures = 0
                continue
            except ApiException as error:
                if error.status == 410:
                    # The resourceVersion is older than the apiserver keeps: list again.
                    version = None
                    continue
                problem = (
                    "forbidden to list or watch nodes: grant the service account 'list' and "
                    "'watch' on nodes (see the ClusterRole in manifests/base/rbac.yaml)"
                    if error.status == 403
                    else f"HTTP {error.status} {error.reason}"
                )
            except (urllib3.exceptions.HTTPError, OSError) as error:
                if streamed:
                    # A stream cut after it delivered events: resume where it stopped.
                    continue
                problem = f"cannot reach the Kubernetes API: {error}"
            except Exception as error:  # the thread must outlive any surprise from the API
                log.exception("node watch failed")
                problem = f"{type(error).__name__}: {error}"
            failures += 1
            self._set(tried=True, connected=False, problem=problem)
            # After a failure, list again once the API answers: that both proves
            # the connection and catches up on whatever the watch missed.
            version = None
            low, high = self.backoff
            self._stop.wait(random.uniform(0.5, 1.0) * min(high, low * 2 ** (failures - 1)))
