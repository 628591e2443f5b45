"""The cluster's nodes as a review sees them, and how they travel.

Owns the seam through which node facts reach the decision: a
:class:`NodeSource` (the node watch, or :class:`NoNodes`) hands each review
the policy prepared with the GPU nodes of one node list
(``webhook.decision.prepared.Prepared``), made once per policy and list,
so what it keeps lives and dies with them. Also owns the snapshot: the
node facts and the watch's status as JSON, the form in which one node
watch per server shares them with every worker. Pure: bytes and values
in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from webhook.decision.capacity import (
    Capacity,
    DeviceFacts,
    NodeFacts,
    dra_devices,
    dra_nodes,
    gpu_nodes,
    uncounted,
)
from webhook.decision.policy import Policy
from webhook.decision.prepared import Kept, Prepared
from webhook.decision.quantities import go_value
from webhook.errors import SnapshotError

SNAPSHOT_VERSION = 2


@dataclass(frozen=True)
class DraFacts:
    """What the cluster publishes through DRA: its GPUs' devices and its DeviceClasses."""

    devices: tuple[DeviceFacts, ...] = ()
    # (DeviceClass name, its spec.extendedResourceName) of the classes that name one (KEP-5004)
    classes: tuple[tuple[str, str], ...] = ()


NO_DRA = DraFacts()


@dataclass(frozen=True)
class NodeStatus:
    """How the node watch is doing, for readiness, metrics and logs."""

    watching: bool = False
    tried: bool = False  # the first list has been answered, or has failed
    synced: bool = False  # a full list has been read at least once
    connected: bool = False  # the last call to the API succeeded
    problem: str = ""
    nodes: int = 0  # all nodes seen, GPU or not
    fatal: str = ""  # the watch cannot run at all (credentials): serve stops at start


def prepare(
    facts: Iterable[NodeFacts], status: NodeStatus, policy: Policy, dra: DraFacts = NO_DRA
) -> Prepared:
    """``policy`` prepared for reviews, given what the watch knows of the nodes."""
    mapped = mapping_classes(dra.classes, policy)
    if policy.placed_by.claims:
        return _prepare_dra(tuple(facts), status, policy, dra, mapped)
    prepared = _prepare_nodes(facts, status, policy)
    prepared.mapped = mapped
    return prepared


def _fallback(policy: Policy) -> str:
    """How a pod is sized while the cluster's own sizes are not known."""
    return f"GPU sizes come from the policy's gpuMemory ({policy.gpu_memory} {policy.memory_unit})"


def _prepare_dra(
    facts: tuple[NodeFacts, ...],
    status: NodeStatus,
    policy: Policy,
    dra: DraFacts,
    mapped: tuple[tuple[str, str], ...],
) -> Prepared:
    """Under ``scheduler: dra``: sized by the GPUs the policy's driver publishes."""
    fallback = _fallback(policy)
    if not status.synced:
        why = status.problem or "not read yet"
        return Prepared(
            policy, note=f"{fallback}: the cluster's ResourceSlices are not available ({why})"
        )
    nodes = dra_nodes(dra.devices, facts, policy)
    memory = policy.dra.memory_capacity
    grids = {
        (d.capacity[memory].minimum, d.capacity[memory].step)
        for d in dra_devices(dra.devices, policy)
    }
    if not nodes:
        why = f"no ResourceSlice of driver {policy.dra.driver} publishes a GPU with {memory}"
        prepared = Prepared(policy, note=f"{fallback}: {why}")
    else:
        prepared = Prepared(policy, nodes)
    prepared.grids = tuple(sorted(grids))
    prepared.mapped = mapped
    return prepared


def _prepare_nodes(facts: Iterable[NodeFacts], status: NodeStatus, policy: Policy) -> Prepared:
    """Under a device plugin's scheduler: sized by the nodes' extended resources."""
    fallback = _fallback(policy)
    if not status.synced:
        why = status.problem or "not read yet"
        return Prepared(
            policy, note=f"{fallback}: the cluster's node list is not available ({why})"
        )
    facts = tuple(facts)
    nodes, missing = gpu_nodes(facts, policy), uncounted(facts, policy)
    if not nodes:
        why = f"no node reports {policy.resource_name}"
        if missing:
            why = (
                f"no node reports both {policy.resource_name} and "
                f"{policy.multi_gpu.resource_name}, and {policy.placed_by.title} counts no GPU "
                "on a node without the count"
            )
        return Prepared(policy, note=f"{fallback}: {why}", uncounted=missing)
    return Prepared(policy, nodes, uncounted=missing)


class NodeSource(Protocol):
    def prepared(self, policy: Policy) -> Prepared:
        """``policy`` prepared with the nodes to check a pod against; the same object
        for as long as the policy and the node list are the same."""

    def status(self) -> NodeStatus:
        """The state of the source, for readiness and metrics."""


class NoNodes:
    """Node watching is off: every pod is checked against the policy."""

    def __init__(self) -> None:
        self._kept = Kept()

    def prepared(self, policy: Policy) -> Prepared:
        return self._kept.get(policy, None, lambda: Prepared(policy))

    def status(self) -> NodeStatus:
        return NodeStatus()


def capacity_kept(name: str) -> bool:
    """Whether a capacity entry can matter: extended resources only (``vendor/name``).

    The GPU-sharing resources a policy may name are extended resources, which
    Kubernetes requires to carry a domain; cpu, memory, pods, hugepages and
    storage never bound a pod here, and leaving them out keeps the snapshot
    small on large clusters.
    """
    return "/" in name


def facts_of(node: Mapping[str, Any]) -> NodeFacts:
    """A Node object, as the API sends it (JSON), as the facts the decision reads."""
    meta = node.get("metadata") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    return NodeFacts(
        name=str(meta.get("name") or ""),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        capacity={str(k): str(v) for k, v in capacity.items() if capacity_kept(str(k))},
    )


def devices_of(resource_slice: Mapping[str, Any]) -> list[DeviceFacts]:
    """A ResourceSlice (resource.k8s.io/v1, as JSON) as the facts of its devices.

    Capacities are read as Go reads a Quantity (rounded up); one that cannot
    be read is 0, which no request fits.
    """
    spec = resource_slice.get("spec") or {}
    driver, node = str(spec.get("driver") or ""), str(spec.get("nodeName") or "")
    found = []
    for device in spec.get("devices") or ():
        if not isinstance(device, Mapping):
            continue
        capacity = {}
        for name, entry in (device.get("capacity") or {}).items():
            if not isinstance(entry, Mapping):
                continue
            valid = ((entry.get("requestPolicy") or {}).get("validRange")) or {}
            capacity[str(name)] = Capacity(
                go_value(entry.get("value")),
                go_value(valid.get("min")),
                go_value(valid.get("step")),
            )
        found.append(
            DeviceFacts(
                driver=driver,
                node=node,
                name=str(device.get("name") or ""),
                capacity=capacity,
                shared=device.get("allowMultipleAllocations") is True,
            )
        )
    return found


def mapping_classes(
    classes: Iterable[tuple[str, str]], policy: Policy
) -> tuple[tuple[str, str], ...]:
    """Of (class, resource) pairs, by name, those that map one of the policy's resources.

    kube-scheduler serves such a resource from the class's devices as whole
    GPUs (KEP-5004) on nodes whose device plugin reports none of it.
    """
    return tuple(sorted(c for c in classes if c[1] in policy.gpu_resources))


def class_of(device_class: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, extendedResourceName) of a DeviceClass that maps an extended resource (KEP-5004)."""
    resource = (device_class.get("spec") or {}).get("extendedResourceName")
    if not resource:
        return None
    return str((device_class.get("metadata") or {}).get("name") or ""), str(resource)


def encode_snapshot(
    status: NodeStatus, facts: Iterable[NodeFacts], dra: DraFacts = NO_DRA
) -> bytes:
    """The snapshot one node watch writes for every worker: status and facts, as JSON."""
    document = {
        "version": SNAPSHOT_VERSION,
        "status": asdict(status),
        "nodes": [[f.name, dict(f.labels), dict(f.capacity)] for f in facts],
        "devices": [
            [
                d.driver,
                d.node,
                d.name,
                {k: [c.value, c.minimum, c.step] for k, c in d.capacity.items()},
                d.shared,
            ]
            for d in dra.devices
        ],
        "classes": [list(c) for c in dra.classes],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> tuple[NodeStatus, tuple[NodeFacts, ...], DraFacts]:
    """The status, facts and DRA facts of a snapshot; a SnapshotError for one this code did
    not write."""
    try:
        document = json.loads(data)
        if document["version"] != SNAPSHOT_VERSION:
            raise SnapshotError(
                f"node snapshot version {document['version']!r}, expected {SNAPSHOT_VERSION}"
            )
        known = {field.name for field in fields(NodeStatus)}
        status = NodeStatus(**{k: v for k, v in document["status"].items() if k in known})
        facts = tuple(
            NodeFacts(str(name), dict(labels), dict(capacity))
            for name, labels, capacity in document["nodes"]
        )
        dra = DraFacts(
            devices=tuple(
                DeviceFacts(
                    str(driver),
                    str(node),
                    str(name),
                    {str(k): Capacity(int(v), int(m), int(s)) for k, (v, m, s) in caps.items()},
                    bool(shared),
                )
                for driver, node, name, caps, shared in document["devices"]
            ),
            classes=tuple((str(n), str(r)) for n, r in document["classes"]),
        )
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise SnapshotError(f"node snapshot unreadable: {type(error).__name__}: {error}") from None
    return status, facts, dra
