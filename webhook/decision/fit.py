"""Fit: whether a GPU pod's asks can ever be placed on the cluster's GPUs.

Owns the rules that refuse a pod no GPU can hold: a container over the
largest GPU or asking more GPUs than the largest GPU node has, the
containers together over one GPU (what the scheduler holds for the pod,
from its model), compute shares over 100%, and, under a scheduler that
holds the app containers' sum only, an init container asking more. Each
adds a ``rules.Problem`` naming the field and the fix to the problems it is
handed, as ``webhook.decision.checks`` does.
"""

from __future__ import annotations

from webhook.decision.asks import ContainerAsk
from webhook.decision.capacity import GpuBounds
from webhook.decision.model import GpuPod
from webhook.decision.policy import Policy
from webhook.decision.rules import Problem, Problems
from webhook.reasons import Reason


def check_fit(pod: GpuPod, policy: Policy, bounds: GpuBounds, found: Problems) -> None:
    """Name what of the pod's asks no GPU can hold (its model: ``webhook.decision.model``)."""
    unit = policy.memory_unit
    too_big = False  # one container over the GPU is named alone, not again in the total
    for ask in pod.asks:
        if _check_container_fits(ask, policy, bounds, found):
            too_big = True
    if not policy.placed_by.reserves_init:
        _check_init_within(pod, policy, bounds, found)
    if pod.held_per_gpu > bounds.largest_gpu and not too_big:
        parts = ", ".join(
            f"{a.name}={a.memory_per_gpu}" for a in pod.asks if a.kind == "containers"
        )
        found.append(
            Problem(
                Reason.EXCEEDS_GPU,
                f"the pod's containers together ask {pod.held_per_gpu} {unit} of "
                f"{policy.resource_name} ({parts}), and they share one GPU, but "
                f"{bounds.describe(unit)}; lower the requests or split the pod so its "
                "containers fit one GPU",
            )
        )
    if pod.compute_asked > 100:
        parts = ", ".join(
            f"{a.name}={a.compute}" for a in pod.asks if a.kind == "containers" and a.compute_asked
        )
        found.append(
            Problem(
                Reason.EXCEEDS_COMPUTE,
                f"the pod's containers together ask {pod.compute_asked}% of one GPU's compute "
                f"({policy.compute.resource_name}: {parts}), more than the 100% a GPU has; lower "
                "them so they add up to 100 or less",
            )
        )


def _check_container_fits(
    ask: ContainerAsk, policy: Policy, bounds: GpuBounds, found: Problems
) -> bool:
    """Name a container no GPU or GPU node can hold; True when its memory is over every GPU."""
    unit = policy.memory_unit
    too_big = ask.memory_per_gpu > bounds.largest_gpu
    if too_big:
        found.append(
            Problem(
                Reason.EXCEEDS_GPU,
                f"{ask.label} asks {ask.memory_per_gpu} {unit} of {policy.resource_name} per GPU, "
                "but "
                f"{bounds.describe(unit)}: the pod could never be scheduled; ask at most "
                f"{bounds.largest_gpu}{_mib_hint(ask.memory_per_gpu, unit, bounds.largest_gpu)}",
            )
        )
    if ask.gpus > bounds.max_gpus:
        found.append(
            Problem(
                Reason.TOO_MANY_GPUS,
                f"{ask.label} asks {ask.gpus} GPUs, but the largest GPU node has "
                f"{bounds.max_gpus} ({bounds.gpus_source}); ask at most {bounds.max_gpus}",
            )
        )
    return too_big


def _check_init_within(pod: GpuPod, policy: Policy, bounds: GpuBounds, found: Problems) -> None:
    """Under a scheduler that holds the app containers' sum only, no init container asks more.

    Its shim limit would reach past what is held for the pod on that GPU,
    into a neighbour's share. One over the whole GPU is already named alone.
    """
    unit, scheduler = policy.memory_unit, policy.placed_by.title
    app_total = pod.app_per_gpu
    inits = [a for a in pod.asks if a.kind == "initContainers"]
    for ask in inits:
        if ask.memory_per_gpu <= app_total or ask.memory_per_gpu > bounds.largest_gpu:
            continue  # within what is held, or named alone as too big
        held = (
            f"the pod's app containers together ask {app_total} {unit}"
            if app_total
            else "the pod's app containers ask none"
        )
        fix = (
            f"ask at most {app_total} in it, or ask more in an app container"
            if app_total
            else f"ask {policy.resource_name} in the app container that uses the GPU"
        )
        found.append(
            Problem(
                Reason.INIT_EXCEEDS_RESERVATION,
                f"{ask.label} asks {ask.memory_per_gpu} {unit} of {policy.resource_name}, "
                f"but {held}, "
                f"and {scheduler} holds only that on the GPU it picks (it does not count init "
                f"containers): the init container's limit would reach into a neighbour's share; "
                f"{fix}",
            )
        )


def _mib_hint(memory: int, unit: str, largest: int) -> str:
    """A hint for a count of MiB on a cluster that counts GiB (16276, 3500: published samples).

    Only where it fits as MiB: a count that is too big either way is just too big.
    """
    if unit != "GiB" or memory < 1000 or memory > largest * 1024:
        return ""
    return (
        f" ({memory} looks like a count of MiB: if this cluster's GPU scheduler counts MiB, "
        "set the policy's memoryUnit: MiB)"
    )
