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

from webhook.decision.capacity import NodeFacts, gpu_nodes, uncounted
from webhook.decision.policy import Policy
from webhook.decision.prepared import Kept, Prepared
from webhook.errors import SnapshotError

SNAPSHOT_VERSION = 1


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


def prepare(facts: Iterable[NodeFacts], status: NodeStatus, policy: Policy) -> Prepared:
    """``policy`` prepared for reviews, given what the watch knows of the nodes."""
    fallback = (
        f"GPU sizes come from the policy's gpuMemory ({policy.gpu_memory} {policy.memory_unit})"
    )
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


def encode_snapshot(status: NodeStatus, facts: Iterable[NodeFacts]) -> bytes:
    """The snapshot one node watch writes for every worker: status and facts, as JSON."""
    document = {
        "version": SNAPSHOT_VERSION,
        "status": asdict(status),
        "nodes": [[f.name, dict(f.labels), dict(f.capacity)] for f in facts],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> tuple[NodeStatus, tuple[NodeFacts, ...]]:
    """The status and facts of a snapshot; a SnapshotError for one this code did not write."""
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
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise SnapshotError(f"node snapshot unreadable: {type(error).__name__}: {error}") from None
    return status, facts
