"""What DRA holds for GPU pods: per node, per device, per pod, from the ResourceClaims.

Under ``scheduler: dra`` kube-scheduler writes what each claim holds into
the claim's status: ``status.allocation.devices.results[]`` names a device
(driver, pool, device), the share of it (``shareID``) and what the share
consumes (``consumedCapacity``, the policy's memory capacity in bytes); a
pod names the claim made for each entry of its ``spec.resourceClaims`` in
``status.resourceClaimStatuses`` ({name, resourceClaimName}). Owns reading
those into what ``report`` and ``top`` show:

- each device the webhook's claims (``gpushare-*``) hold a share of, its
  node and size from its ResourceSlice, and each pod's share of it;
- a container whose shim limit differs from what its claim holds on its
  device: the shim would let it take more than the scheduler counts, or
  stop it short of what it holds;
- a bound pod the webhook gave claims whose claim is missing or not
  allocated: nothing holds its GPU memory;
- a pod the webhook gave claims whose containers lack the shim's limit
  (admission reads such a pod as set up, its resources being claims now);
- the DeviceClasses that map one of the policy's resources (KEP-5004),
  and the GPU pods still asking the policy's resource without claims.

Pure: the objects as the API returns them in, rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.decision import (
    BYTES_PER_MIB,
    CLAIM_PREFIX,
    ContainerAsk,
    Policy,
    class_of,
    container_label,
    go_value,
    is_claimed,
    limit_mib,
    mapping_classes,
)
from webhook.report.objects import FINISHED, container_env

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Held:
    """One share of a device a pod's claim holds."""

    namespace: str
    pod: str
    claim: str  # the ResourceClaim's name
    device: str  # driver/pool/device
    held_bytes: int  # what the share consumes of the policy's memory capacity
    share: str  # its shareID ("" for a device not shared)


@dataclass(frozen=True)
class Device:
    """A device the webhook's claims hold shares of."""

    node: str  # from its ResourceSlice, else the node its pods are bound to
    driver: str
    pool: str
    name: str
    total_bytes: int | None  # its memory capacity; None: no ResourceSlice of it in the input
    held: tuple[Held, ...]

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"

    @property
    def held_bytes(self) -> int:
        return sum(h.held_bytes for h in self.held)


@dataclass(frozen=True)
class Claims:
    """What the webhook's claims hold, per device and per pod, and what does not add up."""

    devices: tuple[Device, ...]
    by_pod: Mapping[Key, tuple[Held, ...]]
    findings: Mapping[Key, tuple[str, ...]]

    def held_bytes(self, key: Key) -> int | None:
        """What a pod's claims hold over all of its devices; None: it holds through no claim."""
        found = self.by_pod.get(key)
        return None if found is None else sum(h.held_bytes for h in found)

    def devices_of(self, key: Key) -> tuple[str, ...]:
        """driver/pool/device of each device a pod's claims hold a share of."""
        return tuple(sorted({h.device for h in self.by_pod.get(key, ())}))


NO_CLAIMS = Claims((), {}, {})  # where the claims were not read


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        obj = obj.get(name) if isinstance(obj, Mapping) else None
    return obj


def _list(obj: Any, *path: str) -> list[Any]:
    found = _get(obj, *path)
    return found if isinstance(found, list) else []


def _key(obj: Mapping[str, Any]) -> Key:
    return str(_get(obj, "metadata", "namespace") or ""), str(_get(obj, "metadata", "name"))


Devices = tuple[dict[tuple[str, str], str], dict[tuple[str, str, str], int]]


def _slices(slices: Iterable[Mapping[str, Any]], policy: Policy) -> Devices:
    """(driver, pool) -> node, and (driver, pool, device) -> memory capacity in bytes."""
    nodes: dict[tuple[str, str], str] = {}
    sizes: dict[tuple[str, str, str], int] = {}
    for found in slices:
        driver, pool = str(_get(found, "spec", "driver")), str(_get(found, "spec", "pool", "name"))
        if node := _get(found, "spec", "nodeName"):
            nodes[driver, pool] = str(node)
        for device in _list(found, "spec", "devices"):
            memory = _get(device, "capacity", policy.dra.memory_capacity, "value")
            if memory is not None:
                sizes[driver, pool, str(_get(device, "name"))] = go_value(memory)
    return nodes, sizes


def _live(pod: Mapping[str, Any]) -> bool:
    phase = _get(pod, "status", "phase")
    return _get(pod, "metadata", "deletionTimestamp") is None and phase not in FINISHED


def _claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's own claim entries (``gpushare-*``) -> the ResourceClaim made for each."""
    made = {
        str(_get(s, "name")): str(_get(s, "resourceClaimName") or "")
        for s in _list(pod, "status", "resourceClaimStatuses")
    }
    return {
        str(entry.get("name")): made.get(str(entry.get("name")), "")
        for entry in _list(pod, "spec", "resourceClaims")
        if isinstance(entry, Mapping) and str(entry.get("name")).startswith(CLAIM_PREFIX)
    }


def read_claims(
    pods: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    policy: Policy,
) -> Claims:
    """What the webhook's claims hold for the live pods, per device and per pod."""
    by_name = {_key(c): c for c in claims}
    slice_nodes, sizes = _slices(slices, policy)
    on: dict[tuple[str, str, str], list[Held]] = {}
    nodes: dict[tuple[str, str, str], str] = {}
    by_pod: dict[Key, tuple[Held, ...]] = {}
    findings: dict[Key, tuple[str, ...]] = {}
    for pod in pods:
        if not _live(pod):
            continue
        key, node = _key(pod), str(_get(pod, "spec", "nodeName") or "")
        held: list[Held] = []
        said: list[str] = []
        for entry, made in sorted(_claim_names(pod).items()):
            claim = by_name.get((key[0], made)) if made else None
            found = _list(claim, "status", "allocation", "devices", "results")
            results = [r for r in found if isinstance(r, Mapping)]
            if not results:
                if node and is_claimed(pod):
                    said.append(_unheld(entry, made, claim))
                continue
            shares = [_share(key, made, r, policy) for r in results]
            for share, result in zip(shares, results, strict=True):
                where = (str(result.get("driver")), str(result.get("pool")), _name(result))
                on.setdefault(where, []).append(share)
                nodes.setdefault(where, slice_nodes.get(where[:2], node))
            held += shares
            said += _limits(pod, entry, shares, policy)
        if held:
            by_pod[key] = tuple(held)
        if said:
            findings[key] = tuple(said)
    devices = tuple(
        Device(nodes[where], *where, sizes.get(where), tuple(sorted(shares, key=_by_pod)))
        for where, shares in sorted(on.items(), key=lambda item: (nodes[item[0]], item[0]))
    )
    return Claims(devices, by_pod, findings)


def _share(key: Key, claim: str, result: Mapping[str, Any], policy: Policy) -> Held:
    consumed = _get(result, "consumedCapacity", policy.dra.memory_capacity)
    return Held(
        key[0],
        key[1],
        claim,
        "/".join((str(result.get("driver")), str(result.get("pool")), _name(result))),
        go_value(consumed),
        str(result.get("shareID") or ""),
    )


def _name(result: Mapping[str, Any]) -> str:
    return str(result.get("device"))


def _by_pod(held: Held) -> tuple[str, str, str]:
    return held.namespace, held.pod, held.claim


def _unheld(entry: str, made: str, claim: Mapping[str, Any] | None) -> str:
    if not made:
        why = "no ResourceClaim was made for it (not in status.resourceClaimStatuses)"
    elif claim is None:
        why = f"its ResourceClaim {made} is not there"
    else:
        why = f"its ResourceClaim {made} is not allocated"
    return (
        f"claim {entry}: {why}, so no GPU memory is held for it on its node; the pod "
        "runs on a GPU nobody accounts for"
    )


def _limits(pod: Mapping[str, Any], entry: str, shares: list[Held], policy: Policy) -> list[str]:
    """The containers using claim ``entry`` whose shim limit is not what the claim holds."""
    said = []
    for kind in ("initContainers", "containers"):
        for container in _list(pod, "spec", kind):
            refs = _list(container, "resources", "claims")
            if not any(_get(ref, "name") == entry for ref in refs):
                continue
            limit = limit_mib(container_env(container).get(policy.env.memory_limit))
            if limit is None:
                continue  # none, or not the webhook's form: the pod's own judgement says so
            for share in shares:
                if share.held_bytes != limit * BYTES_PER_MIB:
                    said.append(
                        f"{container_label(kind, str(_get(container, 'name')))}: "
                        f"{policy.env.memory_limit} is "
                        f"{limit} MiB, but its claim {share.claim} holds "
                        f"{share.held_bytes // BYTES_PER_MIB} MiB of {share.device}: the shim "
                        "and the scheduler disagree on what it may use"
                    )
    return said


def missing_setup(
    pod: Mapping[str, Any], asks: Iterable[ContainerAsk], policy: Policy
) -> list[str]:
    """What a pod the webhook gave claims lacks of its set-up: each claimed container's shim
    limit, the claim's size (unless the driver sets limits, ``dra.driverSetsLimits``)."""
    if policy.dra.driver_sets_limits:
        return []
    said = []
    for ask in asks:
        container = _list(pod, "spec", ask.kind)[ask.position]
        want = ask.memory_per_gpu * policy.mib_per_unit
        have = container_env(container).get(policy.env.memory_limit)
        if have is None:
            said.append(
                f"{container_label(ask.kind, ask.name)}: no {policy.env.memory_limit}: the shim "
                f"does not hold it to the {want} MiB its claim holds"
            )
        elif limit_mib(have) != want:
            said.append(
                f"{container_label(ask.kind, ask.name)}: {policy.env.memory_limit} is {have!r}, "
                f"its claim holds {want} MiB"
            )
    return said


def mapped_classes(classes: Iterable[Mapping[str, Any]], policy: Policy) -> list[str]:
    """A finding per DeviceClass that maps one of the policy's resources (KEP-5004).

    Under the extender or ACK's scheduler, kube-scheduler then serves a pod
    asking that resource from the class's devices as whole GPUs, wherever
    a DRA driver publishes them; under DRA the webhook takes the resources
    out of the pods it sets up.
    """
    if policy.placed_by.claims:
        return []
    pairs = [pair for pair in map(class_of, classes) if pair is not None]
    return [
        f"DeviceClass {name} maps {resource} (spec.extendedResourceName): on nodes a DRA "
        f"driver publishes GPUs on, kube-scheduler may give a pod asking {resource} whole "
        f"GPUs, past {policy.placed_by.title}; remove the mapping, or move to scheduler: dra"
        for name, resource in mapping_classes(pairs, policy)
    ]


def left_to_migrate(pods: Iterable[Mapping[str, Any]], policy: Policy) -> list[str]:
    """Under DRA: the live GPU pods that still ask the policy's resource, without claims."""
    if not policy.placed_by.claims:
        return []
    left = []
    for pod in pods:
        if not _live(pod) or is_claimed(pod):
            continue
        for kind in ("initContainers", "containers"):
            asks = [
                c
                for c in _list(pod, "spec", kind)
                if policy.resource_name in (_get(c, "resources", "limits") or {})
            ]
            if asks:
                left.append("/".join(_key(pod)))
                break
    if not left:
        return []
    many = len(left) != 1
    return [
        f"{len(left)} GPU pod{'s' if many else ''} still ask{'' if many else 's'} "
        f"{policy.resource_name} without claims, placed by a scheduler other than DRA's "
        f"(left to move to DRA): {', '.join(sorted(left))}"
    ]
