"""The ResourceClaimTemplates ``scheduler: dra`` pods name, made when a pending pod needs one.

Admission only names a template (``gpushare-4096mi.gpu.nvidia.com``); it
makes nothing, so a dry-run leaves no trace. The node watch process
follows the pods the webhook gave claims (label ``gpushare-webhook.io/dra``)
that are not bound yet, and the templates it made (label
``app.kubernetes.io/managed-by``); for each template a pod names that its
namespace lacks, it creates one at once, in the pod watch's own thread:
kube-scheduler's resourceclaim controller retries the pod with a backoff
that starts at a few milliseconds, so the sooner the template exists,
the sooner the pod's claim does.

A template known (listed, watched, or made here) is never asked for again,
so a steady state makes no calls. A create that fails (RBAC, a quota) is
one log line and a count, and is tried again ``RETRY`` seconds later while
its pod still waits (:meth:`TemplateMaker.retry`, from the watch
process's loop: a pod held back for a missing claim may never change).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.cluster import kube
from webhook.cluster.informer import RBAC, Resource, key_of
from webhook.decision import DRA_LABEL, MANAGED_BY, Policy, claim_template, template_shape

log = logging.getLogger("gpushare_webhook.templates")
RETRY = 10.0  # seconds before a failed create is tried again
TIMEOUT = 10.0

# Pods the webhook gave claims that no node holds yet: the ones whose claims may still be missing.
PENDING_PODS = Resource(
    "/api/v1/pods", "pods", "dra pod", RBAC, field_selector="spec.nodeName=", optional=True
)
TEMPLATES = Resource(
    "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    "resourceclaimtemplates",
    "claim template",
    RBAC,
    optional=True,
)
PODS_SELECTOR = f"{DRA_LABEL}=true"
TEMPLATES_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


def wanted(pod: Mapping[str, Any]) -> list[str]:
    """``namespace/name`` of each template of the webhook's that ``pod`` names, in order."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    spec = pod.get("spec") or {}
    found: list[str] = []
    for entry in spec.get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("resourceClaimTemplateName")
        if isinstance(name, str) and template_shape(name) is not None:
            key = f"{namespace}/{name}"
            if namespace and key not in found:
                found.append(key)
    return found


class TemplateMaker:
    """Makes the templates pending pods name; ``known`` tells which exist already."""

    def __init__(
        self,
        make_api: Callable[[], client.ApiClient],
        policy: Callable[[], Policy],
        known: Callable[[str], bool],
        *,
        retry_after: float = RETRY,
    ) -> None:
        self._make_api, self._policy, self._known = make_api, policy, known
        self.retry_after = retry_after
        self._api: client.ApiClient | None = None
        self._lock = threading.Lock()
        self._made: set[str] = set()  # made here, before the template watch reports them
        # key: when its last create failed (monotonic), and the pod that named it
        self._failed: dict[str, tuple[float, dict[str, Any]]] = {}
        self.created = 0
        self.failures = 0

    def pod(self, _kind: str, pod: dict[str, Any]) -> None:
        """A pending pod was listed or changed: make each template it names that is missing."""
        for key in wanted(pod):
            if key in self._made or self._known(key):
                continue
            failed = self._failed.get(key)
            if failed is not None and time.monotonic() - failed[0] < self.retry_after:
                continue
            self._create(key, pod)

    def retry(self, pending: Callable[[str], bool]) -> None:
        """Try the failed creates again, ``retry_after`` on, for pods ``pending`` still holds."""
        now = time.monotonic()
        for key, (when, pod) in list(self._failed.items()):
            if now - when < self.retry_after or key in self._made or self._known(key):
                continue
            if pending(key_of(pod)):
                self._create(key, pod)
            else:
                self._failed.pop(key, None)  # its pod is gone or bound: nothing waits for it

    def _create(self, key: str, pod: dict[str, Any]) -> None:
        namespace, _, name = key.partition("/")
        body = claim_template(name, self._policy())
        if body is None:
            return
        if self._api is None:
            self._api = self._make_api()
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        pod_name = (pod.get("metadata") or {}).get("name")
        try:
            kube.post_json(self._api, path, body, timeout=TIMEOUT).read()
        except ApiException as error:
            if error.status == 409:  # AlreadyExists: made by another replica, or just before
                self._settle(key)
                return
            self._fail(key, pod, _refusal(error))
            return
        except Exception as error:  # a network failure must not end the pod watch
            self._fail(key, pod, f"{type(error).__name__}: {error}")
            return
        self._settle(key)
        with self._lock:
            self.created += 1
        log.info("claim template %s made in namespace %s for pod %s", name, namespace, pod_name)

    def _settle(self, key: str) -> None:
        self._made.add(key)
        self._failed.pop(key, None)

    def _fail(self, key: str, pod: dict[str, Any], why: str) -> None:
        self._failed[key] = (time.monotonic(), pod)
        pod_name = (pod.get("metadata") or {}).get("name")
        with self._lock:
            self.failures += 1
        namespace, _, name = key.partition("/")
        log.error(
            "claim template %s not made in namespace %s (pod %s waits for it): %s",
            name,
            namespace,
            pod_name,
            why,
        )

    def forget(self, _kind: str, template: dict[str, Any]) -> None:
        """The template watch saw a template: the watch's own set knows it from now on."""
        self._made.discard(key_of(template))


def _refusal(error: ApiException) -> str:
    if error.status == 403:
        return (
            "forbidden: grant the service account 'create' on resourceclaimtemplates "
            f"(resource.k8s.io; {RBAC}); {error.reason}"
        )
    return f"HTTP {error.status} {error.reason}"
