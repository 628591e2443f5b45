"""``scheduler: dra``: a GPU container's ask as a ResourceClaim with consumable capacity.

Owns the names and shapes of what the webhook attaches to a pod under
DRA, and what the cluster side makes for them:

- each GPU container (app or init) gets a claim of its own, named
  ``gpushare-<container>`` in ``spec.resourceClaims`` and in the
  container's ``resources.claims``; kube-scheduler allocates it on one
  node, and the resourceclaim controller makes it from its template when
  the pod is created and deletes it when the pod is gone, so nothing
  outlives the pod;
- the template is named by what it asks (``gpushare-4096mi-x2.gpu.nvidia.com``:
  MiB per GPU, GPUs, compute share where the driver counts it, the
  DeviceClass), one per namespace and shape, made by the webhook's node
  watch when a pod first names it (``webhook.cluster``), never at admission:
  a dry-run makes nothing, and admission stays a pure function. The name
  says the size, so the guard can hold the shim's limit to it in CEL;
- the extended resources the claim replaces are removed from the
  container, or kube-scheduler would also serve them: through a DeviceClass
  that maps them (KEP-5004) as whole GPUs, else from no node at all.

Both drivers this is read from (kubernetes-sigs/dra-driver-nvidia-gpu with
consumable shares, Project-HAMi/k8s-dra-driver) publish ``memory`` in
bytes with a request policy of 1 MiB steps; a request off a device's grid
would be rounded up by the scheduler and hold more than the shim's limit,
so ``off_grid`` names the asks no published GPU holds exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.decision import patch
from webhook.decision.asks import ContainerAsk
from webhook.decision.fields import EMPTY
from webhook.decision.patch import Op
from webhook.decision.policy import Policy
from webhook.decision.quantities import BYTES_PER_MIB
from webhook.decision.rules import Problem, Problems
from webhook.reasons import Reason

PREFIX = "gpushare-"  # of every claim and template the webhook names
DRA_LABEL = "gpushare-webhook.io/dra"  # on a pod whose GPU containers it gave claims
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpushare-webhook"}
API_VERSION = "resource.k8s.io/v1"
_INDEXED = {"containers": "c", "initContainers": "i"}
_TEMPLATE = re.compile(r"gpushare-(\d+)mi(?:-x(\d+))?(?:-c(\d+))?\.(.+)")
_LABEL_MAX = 63  # a pod's claim name is a DNS label


def claim_name(ask: ContainerAsk) -> str:
    """The pod's claim for one container: its name, or its place when the name is too long."""
    name = PREFIX + ask.name
    if len(name) <= _LABEL_MAX:
        return name
    return f"{PREFIX}{_INDEXED[ask.kind]}{ask.position}"


def claimed_compute(ask: ContainerAsk, policy: Policy) -> int | None:
    """The compute share the claim asks, where the driver counts it (0: no limit asked)."""
    if not policy.dra.compute_capacity:
        return None
    return ask.compute or 0


def template_name(ask: ContainerAsk, policy: Policy) -> str:
    """The template a container's claim is made from: named by all it asks."""
    mib = ask.memory_per_gpu * policy.mib_per_unit
    name = f"{PREFIX}{mib}mi"
    if ask.gpus > 1:
        name += f"-x{ask.gpus}"
    compute = claimed_compute(ask, policy)
    if compute is not None:
        name += f"-c{compute}"
    return f"{name}.{policy.dra.device_class}"


def template_shape(name: str) -> tuple[int, int, int | None, str] | None:
    """(MiB per GPU, GPUs, compute share or None, DeviceClass) of a template's name.

    None for a name the webhook does not give.
    """
    match = _TEMPLATE.fullmatch(name)
    if match is None:
        return None
    mib, gpus, compute, device_class = match.groups()
    return int(mib), int(gpus or 1), None if compute is None else int(compute), device_class


def template(name: str, policy: Policy) -> dict[str, Any] | None:
    """The ResourceClaimTemplate ``name`` stands for, as the API takes it; None if not ours."""
    shape = template_shape(name)
    if shape is None:
        return None
    mib, gpus, compute, device_class = shape
    requests: dict[str, str] = {policy.dra.memory_capacity: f"{mib}Mi"}
    if compute is not None and policy.dra.compute_capacity:
        requests[policy.dra.compute_capacity] = str(compute)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {
            "metadata": {"labels": dict(MANAGED_BY)},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": device_class,
                                "allocationMode": "ExactCount",
                                "count": gpus,
                                "capacity": {"requests": requests},
                            },
                        }
                    ]
                }
            },
        },
    }


def claim_ops(
    spec: Mapping[str, Any],
    metadata: Mapping[str, Any],
    asks: Sequence[ContainerAsk],
    policy: Policy,
) -> list[Op]:
    """Ops giving each asking container its claim, in place of the resources it replaces."""
    wanted = [
        {"name": claim_name(ask), "resourceClaimTemplateName": template_name(ask, policy)}
        for ask in asks
    ]
    ops = _pod_claim_ops(spec, wanted)
    names = policy.gpu_resources  # the claim stands in for all three: they leave the container
    for ask in asks:
        container = spec[ask.kind][ask.position]
        ops += _container_ops(container, f"/spec/{ask.kind}/{ask.position}", claim_name(ask), names)
    labels = metadata.get("labels")
    if not isinstance(labels, Mapping):
        base = {DRA_LABEL: "true"}
        ops.append(
            patch.add("/metadata/labels", base)
            if metadata
            else patch.add("/metadata", {"labels": base})
        )
    elif labels.get(DRA_LABEL) != "true":
        ops.append(patch.set_field(labels, DRA_LABEL, "/metadata/labels", "true"))
    return ops


def _pod_claim_ops(spec: Mapping[str, Any], wanted: list[dict[str, str]]) -> list[Op]:
    present = spec.get("resourceClaims")
    if not isinstance(present, list) or not present:
        return [patch.set_field(spec, "resourceClaims", "/spec", wanted)]
    ops: list[Op] = []
    by_name = {c.get("name"): i for i, c in enumerate(present) if isinstance(c, Mapping)}
    for entry in wanted:
        at = by_name.get(entry["name"])
        if at is None:
            ops.append(patch.add("/spec/resourceClaims/-", entry))
        elif present[at] != entry:
            ops.append(patch.replace(f"/spec/resourceClaims/{at}", entry))
    return ops


def _container_ops(
    container: Mapping[str, Any], base: str, claim: str, names: tuple[str, ...]
) -> list[Op]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return [patch.set_field(container, "resources", base, {"claims": [{"name": claim}]})]
    ops: list[Op] = []
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, Mapping):
            ops += [
                patch.remove(f"{base}/resources/{section}/{patch.escape(name)}")
                for name in names
                if name in values
            ]
    claims = resources.get("claims")
    if not isinstance(claims, list):
        ops.append(patch.add(f"{base}/resources/claims", [{"name": claim}]))
    elif not any(isinstance(c, Mapping) and c.get("name") == claim for c in claims):
        ops.append(patch.add(f"{base}/resources/claims/-", {"name": claim}))
    return ops


def is_claimed(pod: Mapping[str, Any]) -> bool:
    """Whether the webhook gave the pod's GPU containers claims (its label, as stored)."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else EMPTY
    return isinstance(labels, Mapping) and labels.get(DRA_LABEL) == "true"


def claimed_asks(spec: Mapping[str, Any], policy: Policy) -> list[ContainerAsk]:
    """The asks of a pod the webhook gave claims, read back from its claims' template names.

    The pod's spec is what the claims were made from and cannot change
    after creation, unlike its annotations; a container whose claim is
    not one of the webhook's templates asks nothing here. A template's
    MiB that is not a whole number of the policy's unit (made under
    another ``memoryUnit``) counts up: the claim holds all of it.
    """
    templates = {}
    for entry in spec.get("resourceClaims") or ():
        if isinstance(entry, Mapping) and isinstance(name := entry.get("name"), str):
            shape = template_shape(str(entry.get("resourceClaimTemplateName")))
            if shape is not None and name.startswith(PREFIX):
                templates[name] = shape
    found = []
    for kind in ("initContainers", "containers"):
        for position, container in enumerate(spec.get(kind) or ()):
            if not isinstance(container, Mapping):
                continue
            refs = (container.get("resources") or {}).get("claims") or ()
            for ref in refs:
                shape = templates.get(str(ref.get("name"))) if isinstance(ref, Mapping) else None
                if shape is None:
                    continue
                mib, gpus, compute, _ = shape
                found.append(
                    ContainerAsk(
                        kind,
                        position,
                        str(container.get("name") or ""),
                        -(-mib // policy.mib_per_unit),
                        gpus,
                        compute or None,
                        compute is not None and compute > 0,
                    )
                )
                break
    return found


def held_bytes(request_bytes: int, minimum: int, step: int) -> int:
    """What a device whose request policy is (``minimum``, ``step``) holds for a request.

    KEP-5075: a request under the valid range's minimum holds the minimum,
    one inside it is rounded up to ``minimum + n * step``; a step of 0 is
    no step (held as asked).
    """
    if not step:
        return max(request_bytes, minimum)
    return minimum + max(0, -(-(request_bytes - minimum) // step)) * step


def on_grid(request_bytes: int, minimum: int, step: int) -> bool:
    """Whether a device with request policy (``minimum``, ``step``) holds exactly the request."""
    return held_bytes(request_bytes, minimum, step) == request_bytes


def check_grid(
    asks: Sequence[ContainerAsk],
    grids: Sequence[tuple[int, int]],
    policy: Policy,
    found: Problems,
) -> None:
    """Name an ask that no published GPU would hold as asked (none published: nothing to say).

    The scheduler would round it up and the claim hold more than the
    shim's limit, which is the ask: the webhook never writes a limit that
    differs from what the claim holds, so the fix is the author's.
    """
    if not grids:
        return
    unit = policy.memory_unit
    for ask in asks:
        asked = ask.memory_per_gpu * policy.mib_per_unit * BYTES_PER_MIB
        if any(on_grid(asked, minimum, step) for minimum, step in grids):
            continue
        minimum, step = grids[0]
        held = held_bytes(asked, minimum, step)
        found.append(
            Problem(
                Reason.OFF_GRID,
                f"{ask.label} asks {ask.memory_per_gpu} {unit} of {policy.resource_name}, but "
                f"the GPUs driver {policy.dra.driver} publishes take {policy.dra.memory_capacity} "
                f"in {_grid(minimum, step)}, so its claim would hold {held // BYTES_PER_MIB} MiB, "
                "more than its limit; ask an amount on that grid",
            )
        )


def _grid(minimum: int, step: int) -> str:
    """A request policy in words, for a message."""
    return f"steps of {step // BYTES_PER_MIB} MiB from {minimum // BYTES_PER_MIB} MiB"
