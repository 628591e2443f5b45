"""Reading what ``gpushare-webhook report`` judges from the cluster: read-only lists.

Owns listing pods, nodes, the workload kinds and the FailedCreate events
(all namespaces, or one),
page by page, as the plain JSON the API sends (the items of a list carry no
kind, so each is given its list's), and reading the policy's ConfigMap.
It needs ``list`` on those kinds and ``get`` on that ConfigMap, nothing more
(manifests/components/report holds that RBAC). A denied list names the
permission; Nodes or events that may not be read leave their part out,
with a note, rather than failing the report. The DRA objects
(``read_dra``: DeviceClasses always, ResourceClaims and ResourceSlices
under ``scheduler: dra``) are left out alike, with a note, where the
resource.k8s.io/v1 API is absent or forbidden.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.cluster import kube
from webhook.errors import KubeError

# (group/version, kind, resource) of what a report reads.
KINDS = (
    ("v1", "Pod", "pods"),
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("apps/v1", "DaemonSet", "daemonsets"),
    ("apps/v1", "ReplicaSet", "replicasets"),
    ("batch/v1", "Job", "jobs"),
    ("batch/v1", "CronJob", "cronjobs"),
)
EVENTS = ("v1", "Event", "events")
DRA = "resource.k8s.io/v1"
CLAIMS = (DRA, "ResourceClaim", "resourceclaims")
SLICES = (DRA, "ResourceSlice", "resourceslices")
CLASSES = (DRA, "DeviceClass", "deviceclasses")
FAILED_CREATE = "reason=FailedCreate"  # a controller's refused pod create
RBAC = "the ClusterRole in manifests/components/report"
PAGE = 500  # items per list call: a large cluster is read in pages, not in one answer
TIMEOUT = 60.0


def _path(api_version: str, resource: str, namespace: str = "") -> str:
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{resource}" if namespace else f"{root}/{resource}"


def _list(
    api: client.ApiClient, api_version: str, kind: str, path: str, selector: str = ""
) -> list[Any]:
    items: list[Any] = []
    cursor = ""
    while True:
        query = {"limit": str(PAGE), "continue": cursor}
        if selector:
            query["fieldSelector"] = selector
        page = json.loads(kube.get_json(api, path, query, timeout=TIMEOUT).read())
        for item in page.get("items") or ():
            items.append({"apiVersion": api_version, "kind": kind, **item})
        cursor = (page.get("metadata") or {}).get("continue") or ""
        if not cursor:
            return items


def read_objects(api: client.ApiClient, *, namespace: str = "") -> tuple[list[Any], list[str]]:
    """Every pod, workload and node (of ``namespace``, or all); notes on what could not be read."""
    objects: list[Any] = []
    where = f"in namespace {namespace}" if namespace else "in all namespaces"
    for kind in KINDS:
        objects += _read(api, kind, namespace, f"{kind[2]} {where}")
    notes: list[str] = []
    objects += _unless_forbidden(
        lambda: _read(api, ("v1", "Node", "nodes"), "", "nodes"),
        notes,
        "nodes could not be read (forbidden to list nodes): no per-node part, and GPU "
        "sizes come from the policy's gpuMemory",
    )
    # The controllers' refused creates: what the guard refused (webhook.report.refused).
    objects += _unless_forbidden(
        lambda: _read(api, EVENTS, namespace, f"events {where}", selector=FAILED_CREATE),
        notes,
        "events could not be read (forbidden to list events): no guard refusals",
    )
    return objects, notes


def read_dra(
    api: client.ApiClient, *, namespace: str = "", claims: bool = False
) -> tuple[list[Any], list[str], bool]:
    """The DeviceClasses, and with ``claims`` the ResourceClaims and ResourceSlices; notes on
    what could not be read; whether the claims were listed."""
    where = f"in namespace {namespace}" if namespace else "in all namespaces"
    notes: list[str] = []
    classes = _unless_unserved(
        lambda: _read(api, CLASSES, "", "deviceclasses"),
        notes,
        "DeviceClasses could not be read ({why}): no check for one mapping the policy's resources",
    )
    if not claims:
        return classes or [], notes, False
    listed = _unless_unserved(
        lambda: _read(api, CLAIMS, namespace, f"resourceclaims {where}"),
        notes,
        "ResourceClaims could not be read ({why}): what DRA holds for each pod is not shown",
    )
    slices = _unless_unserved(
        lambda: _read(api, SLICES, "", "resourceslices"),
        notes,
        "ResourceSlices could not be read ({why}): no device sizes or nodes from them",
    )
    found = [*(classes or []), *(listed or []), *(slices or [])]
    return found, notes, listed is not None


def _unless_unserved(
    read: Callable[[], list[Any]], notes: list[str], note: str
) -> list[Any] | None:
    """What ``read`` lists; None, and ``note`` in ``notes``, when the API server does not
    serve that list (an older one) or forbids it."""
    try:
        return read()
    except KubeError as error:
        said = str(error)
        if said.startswith("forbidden"):
            notes.append(note.format(why="forbidden"))
        elif "HTTP 404" in said:
            notes.append(note.format(why=f"the API server serves no {DRA}"))
        else:
            raise
        return None


def _unless_forbidden(read: Callable[[], list[Any]], notes: list[str], note: str) -> list[Any]:
    """What ``read`` lists; nothing, and ``note`` in ``notes``, when that list is forbidden."""
    try:
        return read()
    except KubeError as error:
        if not str(error).startswith("forbidden"):
            raise
        notes.append(note)
        return []


def _read(
    api: client.ApiClient,
    kind: tuple[str, str, str],
    namespace: str,
    what: str,
    *,
    selector: str = "",
) -> list[Any]:
    api_version, name, resource = kind
    path = _path(api_version, resource, namespace)
    return kube.call(
        what, "list", resource, lambda: _list(api, api_version, name, path, selector), rbac=RBAC
    )


def read_policy_text(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """The ``policy.yaml`` of ConfigMap ``namespace/name``; None when there is none to read."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    try:
        found = json.loads(kube.get_json(api, path, {}, timeout=TIMEOUT).read())
    except ApiException as error:
        if error.status in (403, 404):
            return None
        raise KubeError(f"cannot read ConfigMap {namespace}/{name}: HTTP {error.status}") from None
    text = (found.get("data") or {}).get("policy.yaml")
    return text if isinstance(text, str) else None
