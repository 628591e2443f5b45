"""The cluster's nodes as a review sees them: a view of the GPU nodes, and how it travels.

Owns the seam through which node facts reach the decision: a
:class:`NodeSource` (the node watch, or :class:`NoNodes`) hands each review
a :class:`NodeView`, which carries the GPU nodes of one node list under one
policy and remembers the bounds of each placement it was asked for, so the
cache lives and dies with the list it was worked out from. Also owns the
snapshot: the node facts and the watch's status as JSON, the form in which
one node watch per server shares them with every worker. Pure: bytes and
values in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from webhook.decision.capacity import (
    GpuLimits,
    GpuNode,
    NodeFacts,
    gpu_nodes,
    limits_from_policy,
    limits_over,
    placement_key,
    uncounted,
)
from webhook.decision.policy import Policy
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


class NodeView:
    """The GPU nodes a review is checked against (None: the policy's gpuMemory).

    ``note`` says why the policy is used although nodes were asked for; it
    becomes an AdmissionResponse warning on GPU pods. The bounds of each
    placement are remembered here: pods share placements (most have none),
    and working them out passes over every GPU node (about 1 ms for 500).
    A view is made for one node list and one policy, so what it remembers
    can never outlive them.
    """

    MAX_PLACEMENTS = 512  # remembered at once; more are worked out again

    def __init__(
        self,
        nodes: Sequence[GpuNode] | None = None,
        note: str = "",
        *,
        uncounted: Sequence[str] = (),
    ) -> None:
        self.nodes: tuple[GpuNode, ...] | None = tuple(nodes) if nodes else None
        self.note = note
        # Nodes that report GPU memory but no GPU count: the scheduler counts
        # no GPU there, so they bound no pod (the node watch logs them).
        self.uncounted = tuple(uncounted)
        self._bounds: dict[str, GpuLimits] = {}

    def limits(self, spec: Mapping[str, Any], policy: Policy) -> GpuLimits:
        """The bounds for a pod with this spec: the largest GPU it may be placed on."""
        if self.nodes is None:
            return limits_from_policy(policy)
        key = placement_key(spec)
        found = self._bounds.get(key)
        if found is None:
            if len(self._bounds) >= self.MAX_PLACEMENTS:
                self._bounds.clear()
            found = self._bounds[key] = limits_over(spec, self.nodes, policy)
        return found


def view_of(facts: Iterable[NodeFacts], status: NodeStatus, policy: Policy) -> NodeView:
    """What reviews see under ``policy``, given what the watch knows of the nodes."""
    fallback = (
        f"GPU sizes come from the policy's gpuMemory ({policy.gpu_memory} {policy.memory_unit})"
    )
    if not status.synced:
        why = status.problem or "not read yet"
        return NodeView(note=f"{fallback}: the cluster's node list is not available ({why})")
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
        return NodeView(note=f"{fallback}: {why}", uncounted=missing)
    return NodeView(nodes, uncounted=missing)


class NodeSource(Protocol):
    def view(self, policy: Policy) -> NodeView:
        """The nodes to check a pod against under ``policy``."""

    def status(self) -> NodeStatus:
        """The state of the source, for readiness and metrics."""


class NoNodes:
    """Node watching is off: every pod is checked against the policy."""

    _VIEW = NodeView()

    def view(self, policy: Policy) -> NodeView:
        return self._VIEW

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
