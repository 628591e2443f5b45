"""What each container of a GPU pod asks for: memory, GPUs and compute, read and checked.

Owns turning a container's ``resources`` into a :class:`ContainerAsk`:
requests must agree with limits (extended resources cannot be
overcommitted), each quantity must be a whole count in the policy's unit,
memory over several GPUs must split evenly, and an unset compute share
takes the policy's default. Every problem is a QuantityError naming the
container and the field, found for each container on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.decision.capacity import GpuBounds
from webhook.decision.fields import container_label, containers, label, mapping
from webhook.decision.policy import Policy
from webhook.decision.quantities import MemoryUnit, parse_quantity, plain_count, whole_count
from webhook.decision.rules import Problem, Problems, problem_of
from webhook.errors import PodError, QuantityError
from webhook.reasons import Reason


class ContainerAsk(NamedTuple):
    """What one container asked for, already validated.

    A NamedTuple rather than a frozen dataclass: there is one per GPU
    container of every pod, and a frozen dataclass costs three times as
    much to make.
    """

    kind: str  # "containers" or "initContainers"
    position: int  # in spec.<kind>
    name: str
    memory_per_gpu: int  # GPU memory on each of its GPUs, in the policy's unit
    gpus: int
    compute: int | None  # SM percentage to enforce, None for no limit
    compute_asked: bool = False  # the container asked it (else: the policy's default, or none)

    @property
    def label(self) -> str:
        return container_label(self.kind, self.name)


def _resources(
    container: Mapping[str, Any], kind: str, index: int
) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(limits, requests) of a container, each {} when absent."""
    path = f"spec.{kind}[{index}]"
    resources = mapping(container, "resources", path=path, optional=True)
    limits = mapping(resources, "limits", path=f"{path}.resources", optional=True)
    requests = mapping(resources, "requests", path=f"{path}.resources", optional=True)
    return limits, requests


def _resource(
    limits: Mapping[str, Any],
    requests: Mapping[str, Any],
    kind: str,
    container: Mapping[str, Any],
    resource: str,
) -> object | None:
    """The limit of ``resource``, after checking requests agree with it."""
    limit: object | None = limits.get(resource)
    request: object | None = requests.get(resource)
    if request is None:
        return limit
    who = label(kind, container)
    if limit is None:
        raise QuantityError(
            f"{who} requests {resource}: {request!r} but sets no limit for it; extended "
            f"resources must be set in resources.limits (requests may be left out): add "
            f"limits.{resource}: {request!r}",
            reason=Reason.REQUEST_WITHOUT_LIMIT,
        )
    if not _same_quantity(request, limit):
        # Advice that would itself be refused is no advice: a limit of "2Gi" is.
        fix = (
            f"set both to {limit!r}"
            if plain_count(limit)
            else "set both to one plain number, such as '4'"
        )
        raise QuantityError(
            f"{who} requests {resource}: {request!r} but limits it to {limit!r}; extended "
            f"resources cannot be overcommitted, so requests must equal limits: {fix} "
            "(or drop the request)",
            reason=Reason.REQUEST_DIFFERS,
        )
    return limit


def _same_quantity(a: object, b: object) -> bool:
    if a == b:
        return True  # the usual case, "4" and "4"; if malformed, reading the limit says so
    try:
        return parse_quantity(a).value == parse_quantity(b).value
    except QuantityError:
        return False  # one is malformed, and not the other: they differ


def collect_asks(
    spec: Mapping[str, Any],
    policy: Policy,
    bounds: GpuBounds,
    labels: Mapping[str, Any],
    found: Problems,
) -> list[ContainerAsk]:
    """The ask of every GPU container; a container whose ask cannot be read is a problem found.

    Each container is read on its own, so one run names every container
    that is wrong. When what all of them share cannot be read (the pod's
    GPU-count label, the container lists), none is.
    """
    by_label = policy.multi_gpu.count_from == "label"
    count_name = policy.multi_gpu.resource_name
    try:
        pod_gpus = _label_count(labels, count_name) if by_label else None
        every = containers(spec)
    except PodError as error:
        found.append(problem_of(error))
        return []
    if not by_label and count_name in labels:
        found.append(
            Problem(
                Reason.COUNT_AS_LABEL,
                f"the pod's label {count_name} asks for GPUs, but this cluster reads the GPU "
                f"count from each container's resources (policy multiGpu.countFrom: resource): "
                f"set limits.{count_name} in the GPU containers and remove the label",
            )
        )
    if pod_gpus is not None and pod_gpus > 1 and not policy.placed_by.spans_gpus:
        found.append(problem_of(_one_gpu_only(f"the pod's label {count_name}", pod_gpus, policy)))
        pod_gpus = None  # each container is still read, for its own problems
    asks = []
    for kind, index, container in every:
        try:
            ask = _ask(kind, index, container, policy, bounds, pod_gpus=pod_gpus)
        except PodError as error:
            found.append(problem_of(error))
            continue
        if ask is not None:
            asks.append(ask)
    return asks


def _ask(
    kind: str,
    index: int,
    container: Mapping[str, Any],
    policy: Policy,
    bounds: GpuBounds,
    *,
    pod_gpus: int | None,
) -> ContainerAsk | None:
    """One container's ask (None when it asks for no GPU memory), or the QuantityError why not."""
    memory_name = policy.resource_name
    compute_name = policy.compute.resource_name
    count_name = policy.multi_gpu.resource_name
    limits, requests = _resources(container, kind, index)
    memory_raw = _resource(limits, requests, kind, container, memory_name)
    compute_raw = _resource(limits, requests, kind, container, compute_name)
    count_raw = _resource(limits, requests, kind, container, count_name)
    if count_raw is not None and not policy.placed_by.spans_gpus:
        raise _one_gpu_only(
            f"{label(kind, container)} limit {count_name}", str(count_raw), policy, label_too=False
        )
    if count_raw is not None and policy.multi_gpu.count_from == "label":
        raise QuantityError(
            f"{label(kind, container)} asks {count_name} as a resource, but the GPU "
            f"count is the pod's label, as ACK reads it: set metadata.labels"
            f"['{count_name}']: {str(count_raw)!r} (in a workload, the pod template's "
            "labels) and remove it from resources",
            reason=Reason.COUNT_AS_RESOURCE,
        )
    if memory_raw is None:
        extra = compute_name if compute_raw is not None else None
        extra = extra or (count_name if count_raw is not None else None)
        if extra:
            raise QuantityError(
                f"{label(kind, container)} asks {extra} but no {memory_name}; a GPU share "
                f"needs its memory too: add limits.{memory_name}",
                reason=Reason.SHARE_WITHOUT_MEMORY,
            )
        return None
    unit = policy.memory_unit
    memory = _count(memory_raw, kind, container, memory_name, unit_word=unit, byte_unit=unit)
    gpus = pod_gpus or 1
    if count_raw is not None:
        gpus = _count(count_raw, kind, container, count_name, unit_word="GPUs")
    if gpus > 1:
        memory = _per_device_memory(memory, gpus, label(kind, container), policy)
    compute: int | None
    if compute_raw is not None:
        compute = _count(
            compute_raw, kind, container, compute_name, unit_word="percent", maximum=100
        )
    else:
        compute = _default_compute(memory, policy, bounds)
    asked = compute_raw is not None
    name = str(container.get("name"))
    return ContainerAsk(kind, index, name, memory, gpus, compute, asked)


def _one_gpu_only(
    where: str, gpus: object, policy: Policy, *, label_too: bool = True
) -> QuantityError:
    """A count of GPUs that a scheduler placing each pod on one GPU would not read."""
    drop = "remove the label" if label_too else f"remove {policy.multi_gpu.resource_name}"
    return QuantityError(
        f"{where} asks {gpus} GPUs, but {policy.placed_by.title} places a pod on one GPU "
        f"and does not read the count: the pod would get one GPU with limits for {gpus}; "
        f"{drop} and ask what one GPU holds (split the work over several pods), or, where "
        "ACK's scheduler places pods, set the policy's scheduler: ack",
        reason=Reason.MULTI_GPU_UNSUPPORTED,
    )


def _label_count(labels: Mapping[str, Any], name: str) -> int | None:
    """The GPUs every GPU container of the pod spans, from the pod's label (ACK's form)."""
    raw = labels.get(name)
    if raw is None:
        return None
    return plain_count(raw) or whole_count(raw, what=f"the pod's label {name}", unit_word="GPUs")


def _count(
    raw: object,
    kind: str,
    container: Mapping[str, Any],
    resource: str,
    *,
    unit_word: str,
    maximum: int | None = None,
    byte_unit: MemoryUnit | None = None,
) -> int:
    """A container's limit as a whole count (see whole_count).

    The usual plain "4" is taken as it is, before the container's label
    for a message is built: on the accepted path the label would cost more
    than the check.
    """
    return plain_count(raw, maximum) or whole_count(
        raw,
        what=f"{label(kind, container)} limit {resource}",
        unit_word=unit_word,
        maximum=maximum,
        byte_unit=byte_unit,
    )


def _per_device_memory(memory: int, gpus: int, who: str, policy: Policy) -> int:
    if policy.multi_gpu.memory == "perDevice":
        return memory
    if memory % gpus:
        low = memory - memory % gpus
        near = f"{low} or {low + gpus}" if low else str(gpus)
        raise QuantityError(
            f"{who} asks {memory} {policy.memory_unit} of {policy.resource_name} over {gpus} "
            f"GPUs, which does not split evenly (each GPU gives the same share); ask a multiple "
            f"of {gpus}, such as {near}",
            reason=Reason.UNEVEN_SPLIT,
        )
    return memory // gpus


def _default_compute(memory: int, policy: Policy, bounds: GpuBounds) -> int | None:
    default = policy.compute.default
    if default == "none":
        return None
    if default == "proportional":
        # At least 1 (a GPU of 1 unit); at most 100, for a container asking
        # more than the GPU (refused, or under warn set up anyway).
        return min(100, max(1, -(-memory * 100 // bounds.largest_gpu)))
    return default
