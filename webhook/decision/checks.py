"""Confinement: every reason a GPU pod is refused, checked before any op is built.

Owns the rules that keep a GPU-memory pod inside its share: where it may be
placed (the GPU-share scheduler, no nodeName), what it may not do because
it would reach past the shim (hostPID, privileged, admin capabilities,
NVIDIA_VISIBLE_DEVICES), and what of the pod the webhook's own volume,
mounts and LD_PRELOAD must not meet (whether its asks can fit a GPU at
all is ``webhook.decision.fit``).
Each check adds a ``rules.Problem``, whose message names the field and the
fix, to the list of problems it is handed, and goes on: a pod's author
hears every problem of the pod in one answer, not one per try.
None returns a patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.decision.asks import ContainerAsk
from webhook.decision.fields import CONTAINER_KINDS, asks_resource, each_container, label, mapping
from webhook.decision.layout import PRELOAD, Layout
from webhook.decision.policy import Policy, folder, overlaps
from webhook.decision.rules import Problem, Problems, misshapen, problem_of
from webhook.errors import ShapeError
from webhook.reasons import Reason

DEFAULT_SCHEDULER = "default-scheduler"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# NVIDIA's container runtime hides every GPU for these values.
_NO_DEVICES = {"", "none", "void"}
_ADMIN_CAPABILITIES = {"SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"}


def check_placement(spec: Mapping[str, Any], policy: Policy, found: Problems) -> None:
    node_name = spec.get("nodeName")
    if node_name:
        found.append(
            Problem(
                Reason.NODE_NAME,
                f"spec.nodeName is set to {node_name!r}: a pod bound to a node skips "
                f"{policy.scheduler_name}, so no GPU would be assigned to it; remove spec.nodeName "
                "and use a nodeSelector or node affinity to choose the node",
            )
        )
    scheduler = spec.get("schedulerName")
    if scheduler not in (None, "", DEFAULT_SCHEDULER, policy.scheduler_name):
        found.append(
            Problem(
                Reason.SCHEDULER_NAME,
                f"spec.schedulerName is {scheduler!r}, but pods that ask for "
                f"{policy.resource_name} must be placed by {policy.scheduler_name!r}, where "
                f"{policy.placed_by.title} tracks GPU memory per card; remove "
                f"spec.schedulerName or set it to {policy.scheduler_name!r} (a cluster whose "
                "scheduler serves GPU pods under another profile names it in the policy's "
                "schedulerName)",
            )
        )


def check_confinement(spec: Mapping[str, Any], policy: Policy, found: Problems) -> None:
    if policy.security.reject_privileged and spec.get("hostPID") is True:
        found.append(
            Problem(
                Reason.HOST_PID,
                "spec.hostPID is true: a GPU-memory pod that shares the node's process namespace "
                "can reach other pods' GPU processes and memory; remove hostPID",
            )
        )
    for kind, container in each_container(spec, CONTAINER_KINDS):
        check_privilege(container, kind, policy, found)
        check_visible_devices(container, kind, policy, found)


def check_privilege(
    container: Mapping[str, Any], kind: str, policy: Policy, found: Problems
) -> None:
    if not policy.security.reject_privileged:
        return
    context = container.get("securityContext")
    if not isinstance(context, dict):
        return
    if context.get("privileged") is True:
        found.append(
            Problem(
                Reason.PRIVILEGED,
                f"{label(kind, container)} sets securityContext.privileged: true; a privileged "
                "container sees every GPU of the node, past the device cgroup and the GPU shim's "
                "limit, in a GPU-memory pod: remove privileged",
            )
        )
    capabilities = context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    if isinstance(added, list):
        bad = sorted({str(c) for c in added} & _ADMIN_CAPABILITIES)
        if bad:
            found.append(
                Problem(
                    Reason.SYS_ADMIN,
                    f"{label(kind, container)} adds capability {bad[0]} "
                    "(securityContext.capabilities.add); with it a process can remount the GPU "
                    f"shim away or reach other GPUs in a GPU-memory pod: remove {bad[0]}",
                )
            )


def check_visible_devices(
    container: Mapping[str, Any], kind: str, policy: Policy, found: Problems
) -> None:
    if not policy.security.reject_visible_devices:
        return
    env = container.get("env")
    if not isinstance(env, list):
        return
    for index, entry in enumerate(env):
        if not isinstance(entry, dict) or entry.get("name") != VISIBLE_DEVICES:
            continue
        value = entry.get("value")
        if "valueFrom" not in entry and (value is None or str(value).strip() in _NO_DEVICES):
            continue
        shown = "(valueFrom)" if "valueFrom" in entry else repr(value)
        fix = f"remove the variable and ask for {policy.resource_name}"
        if asks_resource(container, (policy.resource_name,), ("limits",)):
            fix = f"remove the variable: its {policy.resource_name} already gets it a GPU"
        found.append(
            Problem(
                Reason.VISIBLE_DEVICES,
                f"{label(kind, container)} sets {VISIBLE_DEVICES} to {shown} (env[{index}]); the "
                "NVIDIA runtime would hand it those GPUs with no memory limit. GPUs come from the "
                f"device plugin: {fix}",
            )
        )
        return  # one per container: the fix is the same for a second entry


def check_volumes(spec: Mapping[str, Any], policy: Policy, layout: Layout, found: Problems) -> None:
    """The pod's own volumes: none may take a name of ours or mount the shim's host path."""
    ours = {volume["name"]: volume for volume in layout.volumes}
    for index, volume in enumerate(_listed(spec, "volumes", None, found)):
        if not isinstance(volume, dict):
            found.append(misshapen(f"spec.volumes[{index}]", "a volume object", volume))
            continue
        name = volume.get("name")
        if isinstance(name, str) and name in ours:
            if volume == ours[name]:
                continue  # ours, from an earlier review
            found.append(
                Problem(
                    Reason.RESERVED_VOLUME,
                    f"spec.volumes[{index}] is named {name!r}, a name the webhook reserves for "
                    "the GPU shim; rename the volume",
                )
            )
        host = volume.get("hostPath")
        path = host.get("path") if isinstance(host, dict) else None
        # A hostPath without a path is refused by the API server's validation.
        if isinstance(path, str) and overlaps(path, policy.shim.host_path):
            found.append(
                Problem(
                    Reason.SHIM_HOST_PATH,
                    f"spec.volumes[{index}] ({volume.get('name')!r}) mounts host path "
                    f"{path!r}, which holds the GPU shim; a GPU pod may not mount it "
                    "itself: remove the volume",
                )
            )


class GpuContainer(NamedTuple):
    """One GPU container as the checks read it, once: what the injection builds its ops from.

    ``env`` and ``mounts`` are None where the container has none (the
    injection then adds the whole list); ``our_mounts`` is where each of the
    webhook's mounts the container already has stands (its path, with one
    trailing slash, to its index), found by the same walk that checks them.
    """

    ask: ContainerAsk
    container: Mapping[str, Any]
    base: str  # its JSON Pointer: /spec/containers/0
    env: list[Any] | None
    mounts: list[Any] | None
    our_mounts: dict[str, int]


def check_gpu_container(
    spec: Mapping[str, Any], ask: ContainerAsk, layout: Layout, found: Problems
) -> GpuContainer:
    """The env and mounts of one GPU container, each read once: what the webhook can read, and
    no mount that would replace, hide or move what it mounts."""
    container = spec[ask.kind][ask.position]
    env = _listed(container, "env", ask, found)
    for index, entry in enumerate(env):
        name = entry.get("name") if isinstance(entry, dict) else None
        if type(name) is not str:
            found.append(
                misshapen(f"{ask.label} env[{index}]", "an object with a string name", entry)
            )
        if name == PRELOAD and "valueFrom" in entry:
            found.append(
                Problem(
                    Reason.PRELOAD_VALUE_FROM,
                    f"{ask.label} sets {PRELOAD} with valueFrom; the webhook must know its value "
                    "to put the GPU shim first: set it with a plain value",
                )
            )
    mounts = _listed(container, "volumeMounts", ask, found)
    ours = _check_mounts(mounts, ask, layout, found)
    return GpuContainer(
        ask,
        container,
        f"/spec/{ask.kind}/{ask.position}",  # no token of it needs JSON-Pointer escaping
        env if container.get("env") is not None else None,
        mounts if container.get("volumeMounts") is not None else None,
        ours,
    )


def _check_mounts(
    mounts: list[Any], ask: ContainerAsk, layout: Layout, found: Problems
) -> dict[str, int]:
    """Where the webhook's own mounts stand; every other mount that would meet them is refused."""
    placed, holds = layout.placed, layout.holds
    shim_dir = layout.mount_dir
    ours: dict[str, int] = {}
    for index, mount in enumerate(mounts):
        if not isinstance(mount, dict):
            found.append(
                misshapen(f"{ask.label} volumeMounts[{index}]", "a volume mount object", mount)
            )
            continue
        # A mount without a string mountPath is refused by the API server's
        # validation; read as "/", it is no path of the webhook's.
        raw = mount.get("mountPath")
        path = folder(raw if type(raw) is str else "")
        name = mount.get("name")
        name = name if isinstance(name, str) else repr(name)  # a name the API server refuses
        if (name, path) in placed and path not in ours:
            ours[path] = index
        elif name in layout.volume_names:
            found.append(
                Problem(
                    Reason.SHIM_MOUNT,
                    f"{ask.label} mounts the webhook's volume {name!r} at "
                    f"{mount.get('mountPath')!r}; it may only be mounted where the webhook puts "
                    "it: remove that mount",
                )
            )
        elif path.startswith(shim_dir):
            found.append(
                Problem(
                    Reason.SHIM_MOUNT,
                    f"{ask.label} mounts volume {name!r} at {mount.get('mountPath')!r}, where the "
                    "webhook mounts the GPU shim; it would replace the shim and escape its limit: "
                    f"mount it somewhere outside {shim_dir[:-1]}",
                )
            )
        elif path in holds:
            found.append(
                Problem(
                    Reason.SHIM_MOUNT,
                    f"{ask.label} mounts volume {name!r} at {mount.get('mountPath')!r}, where the "
                    f"webhook puts {holds[path]}; it would loosen the GPU shim's limits: "
                    "remove that mount",
                )
            )
        elif path.startswith(layout.region_dir):
            found.append(
                Problem(
                    Reason.SHIM_MOUNT,
                    f"{ask.label} mounts volume {name!r} at {mount.get('mountPath')!r}, inside "
                    "the folder of the GPU shim's accounting; it could hand the shim a prepared "
                    f"region: mount it somewhere outside {layout.region_dir[:-1]}",
                )
            )
    return ours


def check_annotations(metadata: Mapping[str, Any], found: Problems) -> None:
    try:
        mapping(metadata, "annotations", path="metadata", optional=True)
    except ShapeError as error:
        found.append(problem_of(error))


def _listed(
    parent: Mapping[str, Any], key: str, owner: ContainerAsk | None, found: Problems
) -> list[Any]:
    """A list field as ``fields.listed`` reads it; one of another shape is a problem, read as [].

    ``owner`` is the container the field is in (None: the spec), for the
    path the message names: spec.initContainers[0].env.
    """
    value = parent.get(key)
    if type(value) is list:
        return value
    if value is not None:
        path = "spec" if owner is None else f"spec.{owner.kind}[{owner.position}]"
        found.append(misshapen(f"{path}.{key}", "a list", value))
    return []
