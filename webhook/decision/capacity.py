"""How big the cluster's GPUs are, as far as one pod is concerned.

Owns the pure rule "which GPU size bounds this pod": the policy's
``gpuMemory`` when nothing better is known, else the largest single GPU among
the known GPU nodes, narrowed to the nodes the pod's nodeSelector and
required node affinity allow; and how a node's reported capacity becomes
a GPU size. Knows nothing of how nodes are found (``webhook.decision.nodesource``
holds what a review sees of them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.decision.affinity import SHIM_LABEL
from webhook.decision.policy import Policy
from webhook.decision.quantities import BYTES_PER_MIB, go_value


@dataclass(frozen=True)
class GpuNode:
    """A node's GPUs as the GPU-share device plugin reports them."""

    name: str
    gpu_memory: int  # memory of one GPU, in the policy's memory unit
    gpu_count: int
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeFacts:
    """What the API says of a node, before the policy decides what is a GPU."""

    name: str
    labels: Mapping[str, str]
    capacity: Mapping[str, str]


def gpu_node(facts: NodeFacts, policy: Policy) -> GpuNode | None:
    """The node's single-GPU memory, or None when it has no GPU the scheduler can use.

    The GPU-share device plugin reports the node's total memory under the
    memory resource and the number of cards under the count resource; one
    card is the total over the count (rounded down: a card never has more),
    as the scheduler divides it. A node that reports memory but no count has
    the policy's scheduler's ``countless_gpus``: none for the open-source
    extender (it makes no device there), one card for ACK's.
    """
    memory = _whole(facts.capacity.get(policy.resource_name))
    if not memory:
        return None
    count = _whole(facts.capacity.get(policy.multi_gpu.resource_name))
    count = count or policy.placed_by.countless_gpus
    if not count or memory // count < 1:
        return None
    return GpuNode(
        name=facts.name, gpu_memory=memory // count, gpu_count=count, labels=facts.labels
    )


def gpu_nodes(facts: Sequence[NodeFacts], policy: Policy) -> tuple[GpuNode, ...]:
    found = (gpu_node(f, policy) for f in facts)
    return tuple(node for node in found if node is not None)


@dataclass(frozen=True)
class Capacity:
    """One capacity of a DRA device: its value and request policy, in its own unit (bytes)."""

    value: int
    minimum: int = 0  # requestPolicy.validRange.min
    step: int = 0  # requestPolicy.validRange.step; 0: none (held as asked)


@dataclass(frozen=True)
class DeviceFacts:
    """What a ResourceSlice says of one device (resource.k8s.io/v1)."""

    driver: str
    node: str  # the slice's nodeName ("" for devices not bound to one node)
    name: str
    capacity: Mapping[str, Capacity]
    shared: bool  # allowMultipleAllocations: several claims may hold parts of it


def dra_devices(devices: Sequence[DeviceFacts], policy: Policy) -> tuple[DeviceFacts, ...]:
    """The devices of the policy's driver that publish its memory capacity on a node."""
    memory = policy.dra.memory_capacity
    return tuple(
        d
        for d in devices
        if d.driver == policy.dra.driver and d.node and d.capacity.get(memory, Capacity(0)).value
    )


def dra_nodes(
    devices: Sequence[DeviceFacts], facts: Sequence[NodeFacts], policy: Policy
) -> tuple[GpuNode, ...]:
    """The nodes whose GPUs the policy's DRA driver publishes, as the fit rules read nodes.

    A node's GPU size is its largest device's memory in the policy's unit,
    rounded down (a GPU never holds more); its count is how many it has.
    """
    unit_bytes = policy.mib_per_unit * BYTES_PER_MIB
    memory = policy.dra.memory_capacity
    sizes: dict[str, list[int]] = {}
    for device in dra_devices(devices, policy):
        sizes.setdefault(device.node, []).append(device.capacity[memory].value // unit_bytes)
    labels = {f.name: f.labels for f in facts}
    return tuple(
        GpuNode(name=node, gpu_memory=max(found), gpu_count=len(found), labels=labels.get(node, {}))
        for node, found in sorted(sizes.items())
        if max(found) >= 1
    )


def uncounted(facts: Sequence[NodeFacts], policy: Policy) -> tuple[str, ...]:
    """The nodes that report GPU memory but no GPU count, where the scheduler counts no GPU."""
    if policy.placed_by.countless_gpus:
        return ()
    return tuple(
        f.name
        for f in facts
        if _whole(f.capacity.get(policy.resource_name))
        and not _whole(f.capacity.get(policy.multi_gpu.resource_name))
    )


def _whole(raw: str | None) -> int:
    """A capacity as the scheduler reads it; 0 for missing, malformed or negative."""
    return max(go_value(raw), 0)


@dataclass(frozen=True)
class GpuBounds:
    """The bounds a pod is checked against, with words saying where they came from."""

    largest_gpu: int
    max_gpus: int
    source: str
    nodes_with_largest: int | None = None
    gpus_source: str = "policy multiGpu.maxGpus"

    def describe(self, unit: str) -> str:
        where = self.source
        if self.nodes_with_largest is not None:
            plural = "s" if self.nodes_with_largest != 1 else ""
            where = f"{self.nodes_with_largest} node{plural} of {self.source}"
        return f"the largest GPU has {self.largest_gpu} {unit} ({where})"


def bounds_from_policy(policy: Policy) -> GpuBounds:
    """The bounds the policy sets, for a cluster whose GPU nodes are not known."""
    return GpuBounds(
        largest_gpu=policy.gpu_memory, max_gpus=policy.multi_gpu.max_gpus, source="policy gpuMemory"
    )


def placement_key(spec: Mapping[str, Any]) -> str:
    """What of a pod spec decides the nodes it may run on, as text ("" for anywhere)."""
    selector = spec.get("nodeSelector")
    affinity = spec.get("affinity")
    if not selector and not affinity:
        return ""
    return json.dumps([selector, _required_terms(spec)], sort_keys=True, default=repr)


UNMATCHED = "no GPU node the cluster has now matches the pod's node selector"


def bounds_over(spec: Mapping[str, Any], nodes: Sequence[GpuNode], policy: Policy) -> GpuBounds:
    """The bounds over the GPU nodes the pod may run on; the policy's when there are none.

    No GPU node matching is no reason to refuse: the pod may be meant for a
    node pool scaled to zero, which the cluster autoscaler grows when the
    pod waits. The policy's sizes bound it then, and the message says why.
    """
    # With shim.requireNodeLabel the webhook adds the shim's label to the pod's
    # required affinity, so a node without it can never run the pod.
    label = SHIM_LABEL if policy.shim.require_node_label else None
    allowed = [
        node
        for node in nodes
        if _node_allowed(spec, node.labels) and (label is None or label in node.labels)
    ]
    if not allowed:
        unmatched = UNMATCHED if label is None else f"{UNMATCHED} and carries {label}"
        return GpuBounds(
            largest_gpu=policy.gpu_memory,
            max_gpus=policy.multi_gpu.max_gpus,
            source=f"policy gpuMemory; {unmatched}",
            gpus_source=f"policy multiGpu.maxGpus; {unmatched}",
        )
    source = "the cluster's GPU nodes"
    if len(allowed) != len(nodes):
        source = "the GPU nodes this pod's node selector allows"
    largest = max(node.gpu_memory for node in allowed)
    return GpuBounds(
        largest_gpu=largest,
        max_gpus=max(node.gpu_count for node in allowed),
        source=source,
        nodes_with_largest=sum(1 for node in allowed if node.gpu_memory == largest),
        gpus_source=source,
    )


def _node_allowed(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and any(labels.get(k) != v for k, v in selector.items()):
        return False
    terms = _required_terms(spec)
    # Kubernetes ORs the terms and ANDs the expressions inside one term.
    return terms is None or any(_term_matches(term, labels) for term in terms)


def _required_terms(spec: Mapping[str, Any]) -> list[Any] | None:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    return terms if isinstance(terms, list) and terms else None


def _term_matches(term: Any, labels: Mapping[str, str]) -> bool:
    if not isinstance(term, Mapping):
        return True
    expressions = term.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return True
    for expression in expressions:
        if not isinstance(expression, Mapping):
            continue
        key, op = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        present = key in labels
        value = labels.get(str(key))
        if op == "In" and value not in values:
            return False
        if op == "NotIn" and value in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op in ("Gt", "Lt"):
            try:
                number, bound = int(value or ""), int(values[0])
            except (ValueError, IndexError, TypeError):
                return False
            if (op == "Gt" and not number > bound) or (op == "Lt" and not number < bound):
                return False
    return True
