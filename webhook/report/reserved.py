"""The GPU memory the GPU Share Scheduler Extender reserves: per node, per GPU, per pod.

Owns the extender's own record, read as it reads it, so the report gives
the answer its inspect endpoint (``kubectl inspect gpushare``) gives:

- a node's GPUs are its capacity of the count resource (``aliyun.com/gpu-count``),
  each of the capacity of the memory resource over the count, rounded down; a
  node without a count has no GPUs at all (nothing can be placed there); the
  node's total is the memory capacity itself, not the count times one GPU;
- on binding a pod, the extender writes which GPU (``ALIYUN_COM_GPU_MEM_IDX``)
  and how much memory of it (``ALIYUN_COM_GPU_MEM_POD``: its app containers'
  limits, init containers never counted) into the pod's annotations; what
  the scheduler in use holds for the pod there is the pod's model
  (``webhook.decision.model``), so under ACK's scheduler it counts the
  larger init container as the pod row does;
- it counts a GPU-sharing pod (its app containers' memory limits add up to
  more than 0) on GPU ``i`` of the node it is bound to when that annotation
  names ``i`` (a whole number below the node's count), the pod is not being
  deleted and has not ended (``Succeeded``, ``Failed``); it counts the
  memory annotation's number (not a number, or negative: 0).

A GPU pod bound to a node without that index was placed past the extender
(``nodeName`` set by hand, another scheduler): no GPU memory is reserved for
it, and it uses a GPU nobody accounts for. And a GPU pod that no scheduler
ever looked at (no ``PodScheduled`` condition) a minute after it was made
waits for a scheduler name nobody answers. Pure: the clock is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from webhook.decision import Policy, go_value, is_gpu_pod, stored_gpu_pod
from webhook.report.objects import FINISHED

INDEX = "ALIYUN_COM_GPU_MEM_IDX"  # the GPU of the node the extender placed the pod on
RESERVED = "ALIYUN_COM_GPU_MEM_POD"  # the memory it reserved for the pod there
UNANSWERED_AFTER = timedelta(seconds=60)
NOT_RESERVED = (
    "bound to {node} without the scheduler extender's {index} annotation: the scheduler did "
    "not reserve GPU memory for it (a pod placed past the extender), so it uses a GPU nobody "
    "accounts for"
)
NO_SUCH_GPU = (
    "its {index} annotation {value!r} names no GPU of {node} ({count}): the scheduler extender "
    "counts its GPU memory nowhere, so it uses a GPU nobody accounts for"
)


@dataclass(frozen=True)
class Capacity:
    """A node's GPUs as the extender sees them."""

    name: str
    total: int  # the capacity of the memory resource, as the node reports it
    count: int  # GPUs: 0 when the node reports no count
    per_gpu: int  # one GPU: total // count (0 without GPUs)


@dataclass(frozen=True)
class Reservation:
    """A pod the extender counts on one GPU."""

    namespace: str
    name: str
    reserved: int  # its memory annotation: what the GPU's used amount adds up
    held_per_gpu: int  # what the scheduler in use holds for it on a GPU, from its model


@dataclass(frozen=True)
class Gpu:
    index: int
    total: int
    pods: tuple[Reservation, ...]

    @property
    def used(self) -> int:
        return sum(p.reserved for p in self.pods)

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass(frozen=True)
class Unaccounted:
    """A GPU pod bound to a node whose GPU memory the extender does not count."""

    namespace: str
    name: str
    node: str
    finding: str


@dataclass(frozen=True)
class NodeGpus:
    """One GPU node: its GPUs, what the extender reserved on each, the pods it did not count."""

    capacity: Capacity
    gpus: tuple[Gpu, ...]
    unaccounted: tuple[Unaccounted, ...]

    @property
    def name(self) -> str:
        return self.capacity.name

    @property
    def used(self) -> int:
        return sum(gpu.used for gpu in self.gpus)

    @property
    def free(self) -> int:
        """What the extender can still place: its GPUs' free memory (none without GPUs)."""
        return sum(gpu.free for gpu in self.gpus)


@dataclass(frozen=True)
class Waiting:
    """GPU pods that wait for a scheduler name no scheduler answers."""

    scheduler: str
    pods: tuple[str, ...]  # namespace/name

    @property
    def message(self) -> str:
        many = len(self.pods) != 1
        return (
            f"{len(self.pods)} GPU pod{'s' if many else ''} wait{'' if many else 's'} for "
            f"scheduler {self.scheduler!r}, which no scheduler answers (no scheduling event in "
            f"over a minute): {', '.join(self.pods)}"
        )


@dataclass(frozen=True)
class Accounts:
    """The extender's record of a cluster's objects."""

    nodes: tuple[NodeGpus, ...]
    placed: Mapping[tuple[str, str], int]  # (namespace, name) -> GPU index, for counted pods
    reserved: Mapping[tuple[str, str], int]  # (namespace, name) -> memory reserved
    unaccounted: Mapping[tuple[str, str], str]  # (namespace, name) -> why it is not counted
    elsewhere: int  # GPU pods bound to nodes not in the input or with no GPU memory


def capacity_of(node: Mapping[str, Any], policy: Policy) -> Capacity:
    meta = node.get("metadata")
    status = node.get("status")
    raw = status.get("capacity") if isinstance(status, Mapping) else None
    capacity: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    total = go_value(capacity[policy.resource_name]) if policy.resource_name in capacity else 0
    count_name = policy.multi_gpu.resource_name
    count = max(go_value(capacity[count_name]), 0) if count_name in capacity else 0
    name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
    return Capacity(name, total, count, total // count if count else 0)


def shares_gpu(pod: Mapping[str, Any], policy: Policy) -> bool:
    """Whether the extender counts the pod as GPU-sharing (its ``IsGPUSharingPod``).

    Its own reading of the app containers' memory limits (each rounded up,
    malformed as 0) added up, over 0; what it holds is the pod's model.
    """
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    total = 0
    for container in containers if isinstance(containers, list) else ():
        resources = container.get("resources") if isinstance(container, Mapping) else None
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        if isinstance(limits, Mapping) and policy.resource_name in limits:
            total += go_value(limits[policy.resource_name])
    return total > 0


def annotated(raw: object) -> int | None:
    """An annotation as Go's ``strconv.Atoi`` reads it: a whole decimal number, else None."""
    if not isinstance(raw, str):
        return None
    text = raw[1:] if raw[:1] in "+-" else raw
    if not text or not text.isascii() or not text.isdigit():
        return None
    return int(raw)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


def _live(pod: Mapping[str, Any]) -> bool:
    """Neither being deleted nor ended: what the extender still counts."""
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return pod["metadata"].get("deletionTimestamp") is None and phase not in FINISHED


def _node_name(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""


def account(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], policy: Policy
) -> Accounts:
    """What the extender counts on each GPU of each GPU node, and the GPU pods it does not."""
    capacities = {c.name: c for c in (capacity_of(n, policy) for n in nodes)}
    gpu_nodes = {name: c for name, c in capacities.items() if c.total > 0 or c.count > 0}
    on: dict[tuple[str, int], list[Reservation]] = {}
    missed: dict[str, list[Unaccounted]] = {}
    placed: dict[tuple[str, str], int] = {}
    reserved: dict[tuple[str, str], int] = {}
    unaccounted: dict[tuple[str, str], str] = {}
    elsewhere = 0
    for pod in pods:
        node = _node_name(pod)
        if not node or not shares_gpu(pod, policy) or not _live(pod):
            continue
        key = _key(pod)
        found = gpu_nodes.get(node)
        if found is None:
            elsewhere += 1
            continue
        raw = _annotations(pod).get(INDEX)
        index = annotated(raw)
        if index is not None and 0 <= index < found.count:
            amount = max(annotated(_annotations(pod).get(RESERVED)) or 0, 0)
            held = stored_gpu_pod(pod, policy).held_per_gpu
            on.setdefault((node, index), []).append(Reservation(*key, amount, held))
            placed[key], reserved[key] = index, amount
            continue
        if raw is None:
            why = NOT_RESERVED.format(node=node, index=INDEX)
        else:
            count = f"{found.count} GPU{'s' if found.count != 1 else ''}"
            why = NO_SUCH_GPU.format(index=INDEX, value=raw, node=node, count=count)
        unaccounted[key] = why
        missed.setdefault(node, []).append(Unaccounted(*key, node, why))
    found_nodes = []
    for name in sorted(gpu_nodes):
        capacity = gpu_nodes[name]
        gpus = tuple(
            Gpu(i, capacity.per_gpu, tuple(sorted(on.get((name, i), ()), key=_by_name)))
            for i in range(capacity.count)
        )
        left = tuple(sorted(missed.get(name, ()), key=_by_name))
        found_nodes.append(NodeGpus(capacity, gpus, left))
    return Accounts(tuple(found_nodes), placed, reserved, unaccounted, elsewhere)


def _by_name(item: Reservation | Unaccounted) -> tuple[str, str]:
    return item.namespace, item.name


def unanswered(
    pods: Iterable[Mapping[str, Any]], policy: Policy, now: datetime
) -> tuple[Waiting, ...]:
    """GPU pods no scheduler looked at in over a minute, by the scheduler name they wait for.

    Pending, not bound, no ``PodScheduled`` condition at all (a scheduler that
    tried and failed sets one, ``False``), made more than a minute before
    ``now``: the scheduler the pod names is not running, or does not answer.
    """
    waiting: dict[str, list[str]] = {}
    for pod in pods:
        made = _created(pod)
        if made is None or now - made <= UNANSWERED_AFTER or not _never_looked_at(pod):
            continue
        if _node_name(pod) or not _live(pod) or not is_gpu_pod(pod, policy):
            continue
        spec = pod.get("spec")
        scheduler = spec.get("schedulerName") if isinstance(spec, Mapping) else None
        namespace, name = _key(pod)
        waiting.setdefault(str(scheduler or "default-scheduler"), []).append(f"{namespace}/{name}")
    return tuple(Waiting(name, tuple(sorted(pods))) for name, pods in sorted(waiting.items()))


def _never_looked_at(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    if status.get("phase", "Pending") != "Pending":
        return False
    conditions = status.get("conditions")
    found = conditions if isinstance(conditions, list) else ()
    return not any(isinstance(c, Mapping) and c.get("type") == "PodScheduled" for c in found)


def _created(pod: Mapping[str, Any]) -> datetime | None:
    raw = pod["metadata"].get("creationTimestamp")
    if not isinstance(raw, str):
        return None
    try:
        made = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return made if made.tzinfo is not None else None
