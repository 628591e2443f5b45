"""The objects a report reads: what a cluster's API (or a saved ``kubectl get -o json``) holds.

Owns sorting a list of objects into pods, workloads, nodes, events and the
DRA objects (ResourceClaims, ResourceSlices, DeviceClasses), checking each
has the shape a report relies on (a kind, a name, a namespace for the
namespaced ones), and leaving out workloads another listed workload
controls (a Deployment's ReplicaSets, a CronJob's Jobs), whose pod template
is that owner's. A malformed item is an InputError that names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.errors import InputError

# The workload kinds a report judges by their pod templates, by API group.
WORKLOAD_KINDS = {
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("apps", "ReplicaSet"),
    ("batch", "Job"),
    ("batch", "CronJob"),
}
FINISHED = ("Succeeded", "Failed")  # pod phases that hold no GPU any more
DRA_GROUP = "resource.k8s.io"  # ResourceClaims, ResourceSlices, DeviceClasses


@dataclass
class Objects:
    """A cluster's objects, sorted for a report."""

    pods: list[Mapping[str, Any]] = field(default_factory=list)
    workloads: list[Mapping[str, Any]] = field(default_factory=list)
    nodes: list[Mapping[str, Any]] = field(default_factory=list)
    events: list[Mapping[str, Any]] = field(default_factory=list)  # core v1 Events
    claims: list[Mapping[str, Any]] = field(default_factory=list)  # ResourceClaims
    slices: list[Mapping[str, Any]] = field(default_factory=list)  # ResourceSlices
    classes: list[Mapping[str, Any]] = field(default_factory=list)  # DeviceClasses
    # Whether the input holds what the cluster's claims are: some ResourceClaim, or,
    # read from the cluster, a list of them that was answered (empty or not).
    claims_listed: bool = False
    finished: int = 0  # pods that ran to an end: not judged, they hold nothing
    owned: int = 0  # workloads left out: their owner's template is judged instead
    other: int = 0  # objects of other kinds, ignored


_DRA = {"ResourceClaim": "claims", "ResourceSlice": "slices", "DeviceClass": "classes"}


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def sort_objects(items: Iterable[Any], source: str) -> Objects:
    """Sort ``items`` (each an object as the API returns it); InputError names a bad one."""
    found = Objects()
    listed: set[tuple[str, str, str]] = set()  # (kind, namespace, name) of workloads
    candidates: list[Mapping[str, Any]] = []
    for index, item in enumerate(items, start=1):
        kind, api_version, meta = _shape(item, index, source)
        if kind == "Node" and api_version == "v1":
            found.nodes.append(item)
            continue
        if kind == "Event" and api_version == "v1":
            found.events.append(item)
            continue
        if kind == "Pod" and api_version == "v1":
            _namespace(meta, index, source)
            status = item.get("status")
            phase = status.get("phase") if isinstance(status, Mapping) else None
            if phase in FINISHED:
                found.finished += 1
            else:
                found.pods.append(item)
            continue
        if _group(api_version) == DRA_GROUP and kind in _DRA:
            if kind == "ResourceClaim":
                _namespace(meta, index, source)
                found.claims_listed = True
            getattr(found, _DRA[kind]).append(item)
            continue
        if (_group(api_version), kind) in WORKLOAD_KINDS:
            namespace = _namespace(meta, index, source)
            listed.add((kind, namespace, str(meta["name"])))
            candidates.append(item)
            continue
        found.other += 1
    for item in candidates:
        meta = item["metadata"]
        if _controller(meta) in listed:
            found.owned += 1
        else:
            found.workloads.append(item)
    return found


def _shape(item: Any, index: int, source: str) -> tuple[str, str, Mapping[str, Any]]:
    where = f"{source}: item {index}"
    if not isinstance(item, Mapping):
        raise InputError(f"{where} is not an object (a {type(item).__name__})")
    kind, api_version, meta = item.get("kind"), item.get("apiVersion"), item.get("metadata")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        raise InputError(
            f"{where} has no kind or apiVersion; save the list with kubectl get ... -o json, "
            "which writes them"
        )
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise InputError(f"{where} ({kind}) has no metadata.name")
    return kind, api_version, meta


def _namespace(meta: Mapping[str, Any], index: int, source: str) -> str:
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise InputError(f"{source}: item {index} ({meta.get('name')}) has no metadata.namespace")
    return namespace


def _controller(meta: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of the object's controller, if it names one."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind")), str(meta.get("namespace")), str(ref.get("name"))
    return None


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's variables as the kubelet sets them: the last entry of a name wins."""
    env = container.get("env")
    found: dict[str, str] = {}
    for entry in env if isinstance(env, list) else ():
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            value = entry.get("value")
            found[entry["name"]] = "(valueFrom)" if "valueFrom" in entry else str(value or "")
    return found
