"""The decision for one pod, as a pure function of (pod, prepared policy, GPU bounds).

Owns the order of the rules: which pods are GPU-memory pods, then every
check (``checks``; ``fit``, on the pod's model made from what ``asks``
read), and only once the pod has passed them all, the injection
(``inject``). It never reads files, the clock,
the network or an HTTP request; the callers (``admission`` for the webhook,
``webhook.preview`` for the offline CLI) hand it a pod and get back a
:class:`Decision`, whose patch is data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.decision import affinity, checks, claims, fit, inject, model
from webhook.decision.asks import ContainerAsk, collect_asks
from webhook.decision.capacity import GpuBounds
from webhook.decision.fields import (
    CONTAINER_KINDS,
    STATUS_ANNOTATION,
    asks_resource,
    each_container,
    mapping,
)
from webhook.decision.model import NO_GPU_POD, GpuPod
from webhook.decision.patch import Op, plain
from webhook.decision.policy import Policy
from webhook.decision.prepared import Prepared
from webhook.decision.rules import NOT_INJECTABLE, Problem, Problems, first, problem_of
from webhook.errors import PodError, ShapeError
from webhook.reasons import Reason

__all__ = [
    "STATUS_ANNOTATION",
    "Decision",
    "Problem",
    "is_gpu_pod",
    "plan",
    "plan_ephemeral",
    "untouched",
]

Outcome = Literal["untouched", "mutated", "unchanged", "rejected", "warned"]
MAX_PROBLEMS = 10  # named in a refusal; a pod with more hears how many more
WOULD_REFUSE = "gpushare-webhook would refuse this pod: "  # a warning's start, under warn


@dataclass(frozen=True)
class Decision:
    """What the webhook answers for one pod."""

    outcome: Outcome
    reason: Reason
    message: str = ""
    code: int = 200
    ops: tuple[Op, ...] = ()  # the JSON Patch, as data (encoded by responses.patched)
    notes: tuple[str, ...] = ()  # what its set-up changed or could not, for the user to know
    gpu_pod: GpuPod = NO_GPU_POD  # what it asks, and what its scheduler holds for it
    problems: tuple[Problem, ...] = ()  # every reason it is (or, warned, would be) refused

    @property
    def allowed(self) -> bool:
        return self.outcome != "rejected"

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the answer warns of: under warn each refusal it would have had, then the notes."""
        if self.outcome != "warned":
            return self.notes
        return (*(f"{WOULD_REFUSE}{p.message}" for p in self.problems), *self.notes)

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """The reason of every problem, each once, in order (empty unless refused or warned)."""
        return tuple(dict.fromkeys(problem.reason for problem in self.problems))

    @property
    def asks(self) -> tuple[ContainerAsk, ...]:
        """The asks of its GPU containers (none unless it was set up, or is to be)."""
        return self.gpu_pod.asks

    @property
    def patch(self) -> tuple[dict[str, Any], ...]:
        """The ops as plain JSON data (for tests, the CLI and JSON Patch libraries)."""
        return plain(self.ops)


def untouched(reason: Reason) -> Decision:
    return Decision(outcome="untouched", reason=reason)


def _refused(found: Problems) -> Decision:
    """Refused for every problem found, in the pod's order; the reason and code of the one
    first in the registry's order (``rules.RULES``) stand for them all."""
    named = first(found)
    problems = tuple(found)
    return Decision(
        outcome="rejected",
        reason=named.reason,
        message=_joined(problems),
        code=named.code,
        problems=problems,
    )


_NOTHING_DONE = Decision(outcome="unchanged", reason=Reason.UNCHANGED)  # outcome, reason replaced


def _warned(found: Problems, done: Decision | None = None) -> Decision:
    """Admitted under ``enforcement: warn``, with a warning for each refusal it would have had.

    ``done`` is what the webhook set up anyway (its ops, model and notes),
    None when it set up nothing.
    """
    refused = _refused(found)
    return dataclasses.replace(
        done or _NOTHING_DONE,
        outcome="warned",
        reason=refused.reason,
        message=refused.message,
        problems=refused.problems,
    )


def _judged(found: Problems, warn: bool) -> Decision:
    """The pod's problems, as a refusal or (under warn) as warnings on an untouched pod."""
    return _warned(found) if warn else _refused(found)


def _joined(problems: tuple[Problem, ...]) -> str:
    """One problem as it is; several numbered in one line (kubectl prints the message whole)."""
    if len(problems) == 1:
        return problems[0].message
    shown = problems[:MAX_PROBLEMS]
    text = "; ".join(f"({n}) {p.message}" for n, p in enumerate(shown, start=1))
    more = len(problems) - len(shown)
    return f"the pod has {len(problems)} problems: {text}" + (f"; and {more} more" if more else "")


def plan(
    pod: object,
    prepared: Prepared,
    *,
    namespace: str = "",
    bounds: GpuBounds | None = None,
) -> Decision:
    """Decide what to do with ``pod`` (a decoded Pod object) under ``prepared.policy``.

    ``bounds`` are the GPU bounds of the pod's placement (None: the policy's).

    Under ``enforcement: warn`` (the policy's, or its namespace's) a pod that
    breaks a rule is admitted, with a warning for each refusal, and set up
    as far as that stays well defined (see ``NOT_INJECTABLE``).
    """
    warn = prepared.policy.enforcement_for(namespace) == "warn"
    try:
        return _plan(pod, prepared, namespace=namespace, bounds=bounds, warn=warn)
    except PodError as error:
        return _judged([problem_of(error)], warn)


def is_gpu_pod(pod: Mapping[str, Any], policy: Policy) -> bool:
    """True when any container or init container names a GPU-sharing resource.

    Memory, compute share or GPU count: a pod that asks a share of a GPU in
    any form is the webhook's to confine (one without memory is refused:
    the device plugin would hand it a GPU with no memory limit). The
    MutatingWebhookConfiguration's matchConditions send exactly these pods.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return False
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if isinstance(containers, list):
            for container in containers:
                if asks_resource(container, policy.gpu_resources):
                    return True
    return False


def _plan(
    pod: object, prepared: Prepared, *, namespace: str, bounds: GpuBounds | None, warn: bool
) -> Decision:
    policy = prepared.policy
    if not isinstance(pod, dict):
        raise ShapeError("object", "a Pod object", pod)
    if namespace and namespace in policy.exclude_namespaces:
        return untouched(Reason.EXCLUDED_NAMESPACE)
    if not is_gpu_pod(pod, policy):
        # Not ours to shape, but a pod that names GPUs itself would get them unconfined.
        spec = pod.get("spec")
        found: Problems = []
        if isinstance(spec, dict):
            for kind, container in each_container(spec, CONTAINER_KINDS):
                checks.check_visible_devices(container, kind, policy, found)
        return _judged(found, warn) if found else untouched(Reason.NO_GPU_REQUEST)
    spec = pod["spec"]  # an object: is_gpu_pod found GPUs in it
    metadata = mapping(pod, "metadata", path="", optional=True)
    bounds = bounds or prepared.policy_bounds
    shape = prepared.layout

    # Every refusal first, all of them: no op is built for a pod that is refused.
    found = []
    checks.check_placement(spec, policy, found)
    checks.check_confinement(spec, policy, found)
    try:
        labels = mapping(metadata, "labels", path="metadata", optional=True)
    except ShapeError as error:
        found.append(problem_of(error))
        labels = {}
    asks = collect_asks(spec, policy, bounds, labels, found)
    gpu_pod = model.gpu_pod(asks, policy)
    fit.check_fit(gpu_pod, policy, bounds, found)
    if policy.placed_by.claims:
        claims.check_grid(asks, prepared.grids, policy, found)
    checks.check_volumes(spec, policy, shape, found)
    seen = [checks.check_gpu_container(spec, ask, shape, found) for ask in asks]
    checks.check_annotations(metadata, found)
    if found and (not warn or not asks or NOT_INJECTABLE & {e.reason for e in found}):
        return _judged(found, warn)

    # Under warn, a pod with problems gets here too: its readable asks are set
    # up, and the scheduler it named, which enforce would refuse, is kept.
    keep_scheduler = any(e.reason == Reason.SCHEDULER_NAME for e in found)
    warnings = _claim_warnings(spec, policy) + _device_plugin_warnings(asks, policy)
    warnings += _mapped_warnings(spec, prepared)
    ops = [] if keep_scheduler else inject.scheduler_ops(spec, policy)
    ops += _setup_ops(
        spec, metadata, seen=seen, gpu_pod=gpu_pod, prepared=prepared, warnings=warnings
    )
    done = Decision(
        outcome="mutated" if ops else "unchanged",
        reason=Reason.MUTATED if ops else Reason.UNCHANGED,
        ops=tuple(ops),
        notes=tuple(warnings),
        gpu_pod=gpu_pod,
    )
    return _warned(found, done) if found else done


def _setup_ops(
    spec: Mapping[str, Any],
    metadata: Mapping[str, Any],
    *,
    seen: list[checks.GpuContainer],
    gpu_pod: GpuPod,
    prepared: Prepared,
    warnings: list[str],
) -> list[Op]:
    """What a GPU pod gets after its scheduler's name: the placement, the claims under DRA,
    the shim's volume, each GPU container's env and mounts, the init step, the status."""
    policy, shape = prepared.policy, prepared.layout
    ops = affinity.affinity_ops(spec, policy)
    if policy.placed_by.claims:
        ops += claims.claim_ops(spec, metadata, gpu_pod.asks, policy)
    if not (policy.placed_by.claims and policy.dra.driver_sets_limits):
        ops += inject.volume_ops(spec, shape)
        for gpu in seen:
            ops += inject.env_ops(gpu, prepared, warnings)
            ops += inject.mount_ops(gpu, shape)
        ops += inject.init_ops(spec, gpu_pod.asks, shape)  # last: it shifts initContainers
    ops += inject.annotation_ops(metadata, gpu_pod, prepared)
    return ops


def _mapped_warnings(spec: Mapping[str, Any], prepared: Prepared) -> list[str]:
    """A note for each DeviceClass that maps a GPU resource the pod asks to whole GPUs.

    Under the extender or ACK the pod keeps its extended resources, and on
    a node whose device plugin reports none of them kube-scheduler serves
    them from that class (KEP-5004): a count of whole GPUs, not memory.
    A class mapping a resource no container asks never sees the pod.
    Under ``scheduler: dra`` the resources are gone from the pod, so no
    class sees it.
    """
    if not prepared.mapped or prepared.policy.placed_by.claims:
        return []
    containers = [c for _, c in each_container(spec, CONTAINER_KINDS)]
    return [
        f"DeviceClass {name} maps {resource} to devices: on a node without the GPU-share "
        f"device plugin, kube-scheduler would give this pod {resource} whole GPUs, one per "
        "unit, not a share of one; remove the class's extendedResourceName, or use the "
        "policy's scheduler: dra"
        for name, resource in prepared.mapped
        if any(asks_resource(c, (resource,)) for c in containers)
    ]


def _claim_warnings(spec: Mapping[str, Any], policy: Policy) -> list[str]:
    """A note for a pod that also claims devices through DRA, which the shim knows nothing of.

    Passed through, not refused: a claim is as often a NIC (RDMA for
    training across nodes) as a GPU, and the pod cannot say which.
    """
    claims = spec.get("resourceClaims")
    if not isinstance(claims, list) or not claims:
        return []
    names = ", ".join(str(c.get("name")) for c in claims if isinstance(c, dict)) or "unnamed"
    return [
        f"the pod also claims devices through Dynamic Resource Allocation "
        f"(spec.resourceClaims: {names}); the GPU shim limits the memory asked with "
        f"{policy.resource_name} only, not a GPU a claim allocates"
    ]


def _device_plugin_warnings(asks: list[ContainerAsk], policy: Policy) -> list[str]:
    """A note for a pod whose GPU memory is asked in more than one container, open-source stack.

    The gpushare device plugin, asked for one container's devices, looks for
    a pod bound by the extender whose app containers' sum equals that one
    container's ask (pkg/gpu/nvidia/allocate.go), and marks it served: the
    pod's other GPU containers find no match and, on a node with more than
    one GPU, start without one. Their limits still hold, so this is a
    warning, not a refusal.
    """
    if len(asks) < 2 or not policy.placed_by.one_gpu_container:
        return []
    names = ", ".join(repr(ask.name) for ask in asks)
    return [
        f"containers {names} each ask {policy.resource_name}: the GPU-share device plugin "
        "hands the GPU the extender picked to one container whose own ask equals the pod's "
        "app containers' sum, so on a node with more than one GPU the others start without a "
        f"GPU; ask the pod's {policy.resource_name} in one container"
    ]


def plan_ephemeral(pod: object, policy: Policy, *, namespace: str = "") -> Decision:
    """Decide on ephemeral containers added to a running pod (``kubectl debug``).

    They get no GPU from the device plugin and no shim, so they are only
    checked for the ways they could reach the GPUs anyway.
    """
    warn = policy.enforcement_for(namespace) == "warn"
    try:
        if not isinstance(pod, dict):
            raise ShapeError("object", "a Pod object", pod)
        if namespace and namespace in policy.exclude_namespaces:
            return untouched(Reason.EXCLUDED_NAMESPACE)
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return untouched(Reason.NO_GPU_REQUEST)
        gpu_pod = is_gpu_pod(pod, policy)
        found: Problems = []
        for kind, container in each_container(spec, ("ephemeralContainers",)):
            checks.check_visible_devices(container, kind, policy, found)
            if gpu_pod:
                checks.check_privilege(container, kind, policy, found)
    except PodError as error:
        return _judged([problem_of(error)], warn)
    return _judged(found, warn) if found else untouched(Reason.EPHEMERAL_ALLOWED)
