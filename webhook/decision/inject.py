"""Injection: the ops that schedule, mount, preload and limit a GPU pod that passed the checks.

Owns what the webhook adds to a pod: the scheduler name, the webhook's
volumes, their read-only mounts in each GPU container, the pinned
variables (``webhook.decision.contract``) and LD_PRELOAD in each GPU
container's env, and the status annotation.
Every function returns ops as data (``webhook.decision.patch.Op``) and only
what differs from the pod, so a pod the webhook already shaped gets no op
at all. The pod's shapes have been checked (``checks``) before it runs.
What repeats across the pods of a workload (the pinned variables of an
ask, LD_PRELOAD, the status text) is kept by the prepared policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from webhook.decision import contract, jsontext, patch
from webhook.decision.asks import ContainerAsk
from webhook.decision.checks import GpuContainer
from webhook.decision.contract import ACCOUNTING_VOLUME
from webhook.decision.fields import STATUS_ANNOTATION
from webhook.decision.layout import INIT_STEP, PRELOAD, Layout, Mount
from webhook.decision.model import GpuPod
from webhook.decision.patch import Op
from webhook.decision.policy import Policy
from webhook.decision.prepared import Prepared
from webhook.decision.quantities import limit_text

# The step runs one short Python process (docs/security.md, "A cleared environment":
# what it was measured to take). No GPU, no CUDA, nothing but its volume. Requests
# equal to limits, so a Guaranteed pod stays Guaranteed (its QoS class counts init
# containers too) and keeps what the CPU manager gives it.
_INIT_SIZE = {"cpu": "100m", "memory": "32Mi"}
INIT_RESOURCES = {"requests": dict(_INIT_SIZE), "limits": dict(_INIT_SIZE)}  # no YAML alias
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
INIT_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 65532,  # the image's own user (Dockerfile)
    "runAsGroup": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def scheduler_ops(spec: Mapping[str, Any], policy: Policy) -> list[Op]:
    if spec.get("schedulerName") == policy.scheduler_name:
        return []
    return [patch.set_field(spec, "schedulerName", "/spec", policy.scheduler_name)]


def volume_ops(spec: Mapping[str, Any], layout: Layout) -> list[Op]:
    volumes = spec.get("volumes")
    if volumes is None:
        return [patch.set_field(spec, "volumes", "/spec", layout.all_volumes)]
    # Checks refused other volumes of our names; a name that is no string is not ours.
    present = {name for volume in volumes if isinstance(name := volume.get("name"), str)}
    missing = [volume for volume in layout.volumes if volume["name"] not in present]
    return [patch.replace("/spec/volumes", [*volumes, *missing])] if missing else []


def mount_ops(gpu: GpuContainer, layout: Layout) -> list[Op]:
    """The webhook's mounts, each where the layout puts it; the container's others left."""
    mounts, ours, base = gpu.mounts, gpu.our_mounts, gpu.base
    wanted = layout.mounts
    whole: Any = layout.all_mounts
    if layout.init_image:
        wanted = (*wanted, layout.fallback(gpu.ask.name))
        whole = _entries(wanted)
    if mounts is None:
        return [patch.set_field(gpu.container, "volumeMounts", base, whole)]
    changed = list(mounts)
    for path, entry, _ in wanted:
        if path not in ours:
            changed.append(entry)
        elif mounts[ours[path]] != entry:
            changed[ours[path]] = entry
    return [] if changed == mounts else [patch.replace(f"{base}/volumeMounts", changed)]


def _entries(mounts: tuple[Mount, ...]) -> list[Any]:
    return [mount.entry for mount in mounts]


def init_ops(spec: Mapping[str, Any], asks: Sequence[ContainerAsk], layout: Layout) -> list[Op]:
    """The init step, first of the init containers; after every other op, which it would shift.

    A container of its name elsewhere (an older step, or one the pod brought)
    is removed: only the webhook's step may write the regions first.
    """
    if not layout.init_image:
        return []
    step = init_step(asks, layout)
    inits = spec.get("initContainers")
    if not inits:
        return [patch.set_field(spec, "initContainers", "/spec", [step])]
    names = [c.get("name") for c in inits]  # objects: the checks refused any other
    if names[0] == INIT_STEP:
        return (
            [] if _as_stored(inits[0]) == step else [patch.replace("/spec/initContainers/0", step)]
        )
    ops = [patch.remove(f"/spec/initContainers/{i}") for i, n in _named(names) if n == INIT_STEP]
    return [*ops, patch.add("/spec/initContainers/0", step)]


def _as_stored(found: Mapping[str, Any]) -> Mapping[str, Any]:
    """The step as the webhook wrote it, if ``found`` is it as the API server stores it.

    The ServiceAccount admission plugin mounts the token in every container
    (ours too, after the webhook added it); any other change stays, so a
    step with another mount, variable or argument is replaced.
    """
    mounts = found.get("volumeMounts")
    if type(mounts) is list:
        mounts = [m for m in mounts if not (type(m) is dict and m.get("mountPath") == TOKEN_PATH)]
    return {**found, "volumeMounts": mounts}


def _named(names: list[Any]) -> list[tuple[int, Any]]:
    """Index and name, from the last: removals in this order shift no later target."""
    return list(reversed(list(enumerate(names))))


def init_step(asks: Sequence[ContainerAsk], layout: Layout) -> dict[str, Any]:
    """The init container: ``node init-regions`` with each GPU container's pinned limits."""
    regions = []
    for ask in asks:
        share = "" if ask.compute is None else f",sm={ask.compute}"
        regions.append(f"{ask.name}={limit_text(ask.memory_per_gpu * layout.mib_per_unit)}{share}")
    return {
        "name": INIT_STEP,
        "image": layout.init_image,
        "command": ["gpushare-webhook", "node", "init-regions", *regions],
        # The API server's defaults, set here so the stored step reads as the webhook's.
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "resources": INIT_RESOURCES,
        "securityContext": INIT_SECURITY,
        "volumeMounts": [{"name": ACCOUNTING_VOLUME, "mountPath": contract.REGION_DIR}],
    }


def env_ops(gpu: GpuContainer, prepared: Prepared, warnings: list[str]) -> list[Op]:
    """Ops that leave the container's env as the shim needs it, and nothing else changed.

    The limit variables and LD_PRELOAD are set where the container has them
    (its first entry of each) or appended; later duplicates, which the
    kubelet would let win, and per-device variants that would override the
    limit are removed. The env is one op, the whole list as it must be: the
    API server pays for each op of a patch more than for its bytes
    (docs/design.md, "The patch's size").
    """
    ask, env, base, layout = gpu.ask, gpu.env, gpu.base, prepared.layout
    key = (ask.name, ask.memory_per_gpu, ask.gpus, ask.compute)
    pinned = prepared.remember((Layout.pin, *key), lambda: layout.pin(*key))
    if env is None:
        return [patch.set_field(gpu.container, "env", base, pinned.env)]
    scan = _scan_env(env, pinned.values, layout, ask.label, warnings)
    replaced = scan.replaced
    preload_entry = prepared.remember(
        (_preload_entry, scan.user_preload),
        lambda: _preload_entry(scan.user_preload, layout.preload),
    )
    entries = list(env)
    for index, entry in replaced:
        entries[index] = entry
    if scan.preload_at >= 0:
        entries[scan.preload_at] = preload_entry  # anything but our entry is replaced
    for index in reversed(scan.removed):
        del entries[index]
    entries += [entry for entry in pinned.entries if entry["name"] not in scan.seen]
    if scan.preload_at < 0:
        entries.append(preload_entry)
    return [] if entries == env else [patch.replace(f"{base}/env", entries)]


class _EnvScan(NamedTuple):
    """One pass over a container's env: what to replace and remove, and where LD_PRELOAD is."""

    replaced: list[tuple[int, dict[str, str]]]  # (index, its new entry)
    removed: list[int]  # indexes, in order
    seen: set[str]  # the pinned names the container sets (its first entry of each)
    preload_at: int  # the index of its first LD_PRELOAD entry, or -1
    user_preload: str  # that entry's value, which the shim goes in front of


def _scan_env(
    env: list[Any],
    wanted: Mapping[str, str],
    layout: Layout,
    label: str,
    warnings: list[str],
) -> _EnvScan:
    """Read the container's env once, warning of each entry the webhook changes or removes."""
    prefixes = (layout.memory_limit, layout.sm_limit)
    replaced: list[tuple[int, dict[str, str]]] = []
    removed: list[int] = []
    seen: set[str] = set()
    preload_at = -1
    user_preload = ""
    for index, entry in enumerate(env):
        name = entry["name"]
        if name == PRELOAD:
            # The kubelet keeps the last entry; the shim goes first in its value,
            # at the place of the first entry, the only one left.
            user_preload = str(entry.get("value") or "")
            if preload_at >= 0:
                warnings.append(f"{label}: removed a second {name} entry")
                removed.append(index)
            else:
                preload_at = index
        elif name in wanted:
            if name in seen:
                # A later duplicate would win over ours: the kubelet keeps the last one.
                warnings.append(f"{label}: removed a second {name} entry")
                removed.append(index)
                continue
            seen.add(name)
            value = wanted[name]
            if entry.get("value") != value or "valueFrom" in entry:
                warnings.append(
                    f"{label}: {name} was set to {entry.get('value', '(valueFrom)')!r}; "
                    f"the webhook set it to {value!r}, as the GPU shim's limits require"
                )
            replaced.append((index, _entry(name, value)))  # if equal, the env compares unchanged
        elif name.startswith(prefixes) and layout.shadow.fullmatch(name):
            warnings.append(
                f"{label}: removed {name}, which would override the limit the webhook sets"
            )
            removed.append(index)
    return _EnvScan(replaced, removed, seen, preload_at, user_preload)


def _entry(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def _preload_entry(user_value: str, shim: str) -> dict[str, str]:
    """The LD_PRELOAD entry: the shim first, then the user's libraries."""
    return _entry(PRELOAD, _preloaded(user_value, shim))


def _preloaded(user_value: str, shim: str) -> str:
    """LD_PRELOAD with the shim first, then the user's libraries (the shim once)."""
    # ld.so splits LD_PRELOAD on spaces and colons alike.
    others = [item for item in re.split(r"[:\s]+", user_value) if item and item != shim]
    return ":".join([shim, *others])


def annotation_ops(metadata: Mapping[str, Any], pod: GpuPod, prepared: Prepared) -> list[Op]:
    """The status annotation: what the webhook set, for people and for ``report``-like tools."""
    # The pods of one workload ask alike, so their status reads alike:
    # its JSON costs more than all the rest of the pod's annotation ops.
    value = prepared.remember((status_text, pod), lambda: status_text(pod, prepared.policy))
    annotations = metadata.get("annotations")
    if annotations is None:
        ours = {STATUS_ANNOTATION: value}
        if not metadata:
            return [patch.add("/metadata", {"annotations": ours})]
        return [patch.add("/metadata/annotations", ours)]
    if annotations.get(STATUS_ANNOTATION) == value:
        return []
    return [patch.set_field(annotations, STATUS_ANNOTATION, "/metadata/annotations", value)]


def status_text(pod: GpuPod, policy: Policy) -> str:
    """The annotation's value: a string of JSON, its keys sorted."""
    mib_per_unit = policy.mib_per_unit
    containers: dict[str, dict[str, Any]] = {}
    for ask in pod.asks:
        entry: dict[str, Any] = {"memory": limit_text(ask.memory_per_gpu * mib_per_unit)}
        if ask.gpus > 1:
            entry["gpus"] = ask.gpus
        if ask.compute is not None:
            entry["compute"] = ask.compute
        containers[ask.name] = entry
    record = {
        "scheduler": policy.scheduler_name,
        "shim": policy.shim.preload,
        "demand": f"{pod.held_per_gpu}{policy.memory_unit}",
        "containers": containers,
    }
    return jsontext.sorted_compact(record)
