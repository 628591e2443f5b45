"""The decision: what to do with one pod, as a pure function of (pod, policy, limits).

Owns the rules of gpushare-webhook — which pods are GPU-memory pods, what
they may ask, and the JSON Patch that schedules, preloads and confines them.
It never reads files, the clock, the network or an HTTP request; the
callers (``admission`` for the webhook, ``workloads`` for the offline CLI)
hand it a pod and get back a :class:`Decision`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from webhook.decision import patch as patching
from webhook.decision.capacity import GpuLimits, limits_from_policy
from webhook.decision.patch import Op
from webhook.decision.policy import LD_SO_PRELOAD, EnvNames, Policy, Shim, overlaps
from webhook.decision.quantities import MemoryUnit, parse_quantity, plain_count, whole_count
from webhook.errors import PodError, QuantityError, ShapeError

VOLUME_NAME = "gpushare-shim"
STATUS_ANNOTATION = "gpushare-webhook.io/status"
DEFAULT_SCHEDULER = "default-scheduler"
PRELOAD = "LD_PRELOAD"
CONTAINER_KINDS = ("initContainers", "containers")

Outcome = Literal["untouched", "mutated", "unchanged", "rejected"]


class ContainerAsk(NamedTuple):
    """What one container asked for, already validated.

    A NamedTuple rather than a frozen dataclass: there is one per GPU
    container of every pod, and a frozen dataclass costs three times as
    much to make.
    """

    kind: str  # "containers" or "initContainers"
    position: int  # in spec.<kind>
    name: str
    memory: int  # GPU memory per device, in the policy's unit
    gpus: int
    compute: int | None  # SM percentage to enforce, None for no limit

    @property
    def label(self) -> str:
        return container_label(self.kind, self.name)


@dataclass(frozen=True)
class Decision:
    """What the webhook answers for one pod."""

    outcome: Outcome
    reason: str
    message: str = ""
    code: int = 200
    patch_json: str = ""  # the JSON Patch as JSON text, "" for none (see webhook.decision.patch)
    warnings: tuple[str, ...] = ()
    demand: int = 0  # GPU memory the pod holds on its GPU, in the policy's unit
    asks: tuple[ContainerAsk, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.outcome != "rejected"

    @property
    def patch(self) -> tuple[Op, ...]:
        """The ops of the patch (read back from its text: for tests and the CLI)."""
        return patching.decode(self.patch_json)


_KIND_WORDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


def container_label(kind: str, name: object) -> str:
    """How messages name a container: "container 'main'" or "init container 'fetch'"."""
    return f"{_KIND_WORDS.get(kind, 'container')} {name!r}"


def _label(kind: str, container: Mapping[str, Any]) -> str:
    # NB: labels and field paths are built only when a message needs them:
    # on the accepted path they would cost more than the checks themselves.
    return container_label(kind, container.get("name"))


def untouched(reason: str) -> Decision:
    return Decision(outcome="untouched", reason=reason)


def plan(
    pod: object,
    policy: Policy,
    *,
    namespace: str = "",
    limits: GpuLimits | None = None,
) -> Decision:
    """Decide what to do with ``pod`` (a decoded Pod object) under ``policy``."""
    try:
        return _plan(pod, policy, namespace=namespace, limits=limits)
    except PodError as error:
        return Decision(
            outcome="rejected", reason=error.reason, message=str(error), code=error.code
        )


def is_gpu_pod(pod: Mapping[str, Any], policy: Policy) -> bool:
    """True when any container or init container names the GPU-memory resource."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return False
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for container in containers:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            for section in ("limits", "requests"):
                values = resources.get(section)
                if isinstance(values, dict) and policy.resource_name in values:
                    return True
    return False


def _plan(pod: object, policy: Policy, *, namespace: str, limits: GpuLimits | None) -> Decision:
    if not isinstance(pod, dict):
        raise ShapeError("object", "a Pod object", pod)
    if namespace and namespace in policy.exclude_namespaces:
        return untouched("excluded-namespace")
    if not is_gpu_pod(pod, policy):
        # Not ours to shape, but a pod that names GPUs itself would get them unconfined.
        spec = pod.get("spec")
        if isinstance(spec, dict):
            for kind, container in _each_container(spec, CONTAINER_KINDS):
                _check_visible_devices(container, kind, policy)
        return untouched("no-gpu-request")
    spec = _mapping(pod, "spec")
    metadata = _mapping(pod, "metadata", optional=True)
    limits = limits or limits_from_policy(policy)
    _check_placement(spec, policy)
    _check_confinement(spec, policy)
    asks = _collect_asks(spec, policy, limits)
    demand = _check_fit(asks, policy, limits)
    layout = _layout(policy.shim, policy.env, policy.mib_per_unit)
    warnings: list[str] = []
    patch = patching.Writer()
    _scheduler_ops(spec, policy, patch)
    _volume_ops(spec, policy, layout, patch)
    for ask in asks:
        container = spec[ask.kind][ask.position]
        base = f"/spec/{ask.kind}/{ask.position}"  # no token here needs JSON-Pointer escaping
        _env_ops(container, base, ask, layout=layout, patch=patch, warnings=warnings)
        _mount_ops(container, base, ask, policy, layout=layout, patch=patch)
    _annotation_ops(metadata, asks, policy, demand, patch)
    outcome: Outcome = "mutated" if patch else "unchanged"
    return Decision(
        outcome=outcome,
        reason=outcome,
        patch_json=patch.text(),
        warnings=tuple(warnings),
        demand=demand,
        asks=tuple(asks),
    )


# --- reading the pod -------------------------------------------------------


def _mapping(parent: Mapping[str, Any], key: str, *, path: str = "", optional: bool = False) -> Any:
    value = parent.get(key)
    if value is None and optional:
        return _EMPTY
    if not isinstance(value, dict):
        raise ShapeError(f"{path}.{key}" if path else key, "an object", value)
    return value


_EMPTY: Mapping[str, Any] = {}  # never handed out to be changed


def _list(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ShapeError(f"{path}.{key}", "a list", value)
    return value


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    found: list[tuple[str, int, Mapping[str, Any]]] = []
    for kind in CONTAINER_KINDS:
        for index, container in enumerate(_list(spec, kind, "spec")):
            if not isinstance(container, dict):
                raise ShapeError(f"spec.{kind}[{index}]", "a container object", container)
            found.append((kind, index, container))
    return found


# --- validating what was asked ---------------------------------------------


def _check_placement(spec: Mapping[str, Any], policy: Policy) -> None:
    node_name = spec.get("nodeName")
    if node_name:
        raise PodError(
            f"spec.nodeName is set to {node_name!r}: a pod bound to a node skips "
            f"{policy.scheduler_name}, so no GPU would be assigned to it; remove spec.nodeName "
            "and use a nodeSelector or node affinity to choose the node",
            reason="node-name",
        )
    scheduler = spec.get("schedulerName")
    if scheduler not in (None, "", DEFAULT_SCHEDULER, policy.scheduler_name):
        raise PodError(
            f"spec.schedulerName is {scheduler!r}, but pods that ask for "
            f"{policy.resource_name} must be placed by {policy.scheduler_name!r}, which "
            "tracks GPU memory per card; remove spec.schedulerName or set it to "
            f"{policy.scheduler_name!r}",
            reason="scheduler-name",
        )


def plan_ephemeral(pod: object, policy: Policy, *, namespace: str = "") -> Decision:
    """Decide on ephemeral containers added to a running pod (``kubectl debug``).

    They get no GPU from the device plugin and no shim, so they are only
    checked for the ways they could reach the GPUs anyway.
    """
    try:
        if not isinstance(pod, dict):
            raise ShapeError("object", "a Pod object", pod)
        if namespace and namespace in policy.exclude_namespaces:
            return untouched("excluded-namespace")
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return untouched("no-gpu-request")
        gpu_pod = is_gpu_pod(pod, policy)
        for kind, container in _each_container(spec, ("ephemeralContainers",)):
            _check_visible_devices(container, kind, policy)
            if gpu_pod:
                _check_privilege(container, kind, policy)
    except PodError as error:
        return Decision(
            outcome="rejected", reason=error.reason, message=str(error), code=error.code
        )
    return untouched("ephemeral-allowed")


def _each_container(
    spec: Mapping[str, Any], kinds: tuple[str, ...]
) -> list[tuple[str, Mapping[str, Any]]]:
    """Containers of ``kinds``, skipping malformed entries (reported elsewhere, if ours)."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for kind in kinds:
        containers = spec.get(kind)
        if isinstance(containers, list):
            found += [(kind, c) for c in containers if isinstance(c, dict)]
    return found


# NVIDIA's container runtime hides every GPU for these values.
_NO_DEVICES = {"", "none", "void"}
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_ADMIN_CAPABILITIES = {"SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"}


def _check_confinement(spec: Mapping[str, Any], policy: Policy) -> None:
    if policy.security.reject_privileged and spec.get("hostPID") is True:
        raise PodError(
            "spec.hostPID is true: a GPU-memory pod that shares the node's process namespace "
            "can reach other pods' GPU processes and memory; remove hostPID",
            reason="host-pid",
        )
    for kind, container in _each_container(spec, CONTAINER_KINDS):
        _check_privilege(container, kind, policy)
        _check_visible_devices(container, kind, policy)


def _check_privilege(container: Mapping[str, Any], kind: str, policy: Policy) -> None:
    if not policy.security.reject_privileged:
        return
    context = container.get("securityContext")
    if not isinstance(context, dict):
        return
    if context.get("privileged") is True:
        raise PodError(
            f"{_label(kind, container)} sets securityContext.privileged: true; a privileged "
            "container sees every GPU of the node, past the device cgroup and the GPU shim's "
            "limit, in a GPU-memory pod: remove privileged",
            reason="privileged",
        )
    capabilities = context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    if isinstance(added, list):
        bad = sorted({str(c) for c in added} & _ADMIN_CAPABILITIES)
        if bad:
            raise PodError(
                f"{_label(kind, container)} adds capability {bad[0]} "
                "(securityContext.capabilities.add); with it a process can remount the GPU shim "
                f"away or reach other GPUs in a GPU-memory pod: remove {bad[0]}",
                reason="sys-admin",
            )


def _check_visible_devices(container: Mapping[str, Any], kind: str, policy: Policy) -> None:
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
        raise PodError(
            f"{_label(kind, container)} sets {VISIBLE_DEVICES} to {shown} (env[{index}]); the "
            "NVIDIA runtime would hand it those GPUs with no memory limit. GPUs come from the "
            f"device plugin: remove the variable and ask for {policy.resource_name}",
            reason="visible-devices",
        )


def _resources(
    container: Mapping[str, Any], kind: str, index: int
) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(limits, requests) of a container, each {} when absent."""
    if container.get("resources") is None:  # no path to build (it is only for messages)
        return _EMPTY, _EMPTY
    path = f"spec.{kind}[{index}]"
    resources = _mapping(container, "resources", path=path)
    limits = _mapping(resources, "limits", path=f"{path}.resources", optional=True)
    requests = _mapping(resources, "requests", path=f"{path}.resources", optional=True)
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
    label = _label(kind, container)
    if limit is None:
        raise QuantityError(
            f"{label} requests {resource}: {request!r} but sets no limit for it; extended "
            f"resources must be set in resources.limits (requests may be left out): add "
            f"limits.{resource}: {request!r}",
            reason="request-without-limit",
        )
    if not _same_quantity(request, limit):
        raise QuantityError(
            f"{label} requests {resource}: {request!r} but limits it to {limit!r}; extended "
            "resources cannot be overcommitted, so requests must equal limits: set both to "
            f"{limit!r} (or drop the request)",
            reason="request-differs",
        )
    return limit


def _same_quantity(a: object, b: object) -> bool:
    if a == b:
        return True  # the usual case, "4" and "4"; if malformed, reading the limit says so
    try:
        return parse_quantity(a).value == parse_quantity(b).value
    except QuantityError:
        return str(a) == str(b)  # the malformed one is reported when the limit is read


def _collect_asks(spec: Mapping[str, Any], policy: Policy, limits: GpuLimits) -> list[ContainerAsk]:
    asks = []
    unit = policy.memory_unit
    memory_name = policy.resource_name
    compute_name = policy.compute.resource_name
    count_name = policy.multi_gpu.resource_name
    for kind, index, container in _containers(spec):
        limits_, requests = _resources(container, kind, index)
        memory_raw = _resource(limits_, requests, kind, container, memory_name)
        compute_raw = _resource(limits_, requests, kind, container, compute_name)
        count_raw = _resource(limits_, requests, kind, container, count_name)
        if memory_raw is None:
            extra = compute_name if compute_raw is not None else None
            extra = extra or (count_name if count_raw is not None else None)
            if extra:
                raise QuantityError(
                    f"{_label(kind, container)} asks {extra} but no {memory_name}; a GPU share "
                    f"needs its memory too: add limits.{memory_name}",
                    reason="share-without-memory",
                )
            continue
        memory = _count(memory_raw, kind, container, memory_name, unit_word=unit, byte_unit=unit)
        gpus = 1
        if count_raw is not None:
            gpus = _count(count_raw, kind, container, count_name, unit_word="GPUs")
            memory = _per_device_memory(memory, gpus, _label(kind, container), policy)
        compute: int | None
        if compute_raw is not None:
            compute = _count(
                compute_raw, kind, container, compute_name, unit_word="percent", maximum=100
            )
        else:
            compute = _default_compute(memory, policy, limits)
        asks.append(ContainerAsk(kind, index, str(container.get("name")), memory, gpus, compute))
    return asks


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

    NB: the usual plain "4" is taken as it is, before the container's label
    for a message is built: on the accepted path the label would cost more
    than the check.
    """
    return plain_count(raw, maximum) or whole_count(
        raw,
        what=f"{_label(kind, container)} limit {resource}",
        unit_word=unit_word,
        maximum=maximum,
        byte_unit=byte_unit,
    )


def _per_device_memory(memory: int, gpus: int, label: str, policy: Policy) -> int:
    if gpus == 1 or policy.multi_gpu.memory == "perDevice":
        return memory
    if memory % gpus:
        low = memory - memory % gpus
        raise QuantityError(
            f"{label} asks {memory} {policy.memory_unit} of {policy.resource_name} over {gpus} "
            f"GPUs, which does not split evenly (each GPU gives the same share); ask a multiple "
            f"of {gpus}, such as {low or gpus} or {low + gpus}",
            reason="uneven-split",
        )
    return memory // gpus


def _default_compute(memory: int, policy: Policy, limits: GpuLimits) -> int | None:
    default = policy.compute.default
    if default == "none":
        return None
    if default == "proportional":
        largest = max(limits.largest_gpu, 1)
        return min(100, max(1, -(-memory * 100 // largest)))
    return default


def _check_fit(asks: list[ContainerAsk], policy: Policy, limits: GpuLimits) -> int:
    unit = policy.memory_unit
    # Init containers run one at a time before the app containers, which run
    # together: the GPU must hold the larger of the two phases.
    app_total = init_largest = compute_total = 0
    for ask in asks:
        if ask.kind == "containers":
            app_total += ask.memory
            compute_total += ask.compute or 0
        elif ask.memory > init_largest:
            init_largest = ask.memory
        if ask.memory > limits.largest_gpu:
            raise PodError(
                f"{ask.label} asks {ask.memory} {unit} of {policy.resource_name} per GPU, but "
                f"{limits.describe(unit)}: the pod could never be scheduled; ask at most "
                f"{limits.largest_gpu}",
                reason="exceeds-gpu",
            )
        if ask.gpus > limits.max_gpus:
            raise PodError(
                f"{ask.label} asks {ask.gpus} GPUs, but the largest GPU node has "
                f"{limits.max_gpus} ({limits.gpus_source}); ask at most {limits.max_gpus}",
                reason="too-many-gpus",
            )
    demand = max(app_total, init_largest)
    if demand > limits.largest_gpu:
        parts = ", ".join(f"{a.name}={a.memory}" for a in asks if a.kind == "containers")
        raise PodError(
            f"the pod's containers together ask {demand} {unit} of {policy.resource_name} "
            f"({parts}), and they share one GPU, but {limits.describe(unit)}; lower the requests "
            "or split the pod so its containers fit one GPU",
            reason="exceeds-gpu",
        )
    if compute_total > 100:
        parts = ", ".join(
            f"{a.name}={a.compute}" for a in asks if a.kind == "containers" and a.compute
        )
        raise PodError(
            f"the pod's containers together ask {compute_total}% of one GPU's compute "
            f"({policy.compute.resource_name}: {parts}), more than the 100% a GPU has; lower "
            "them so they add up to 100 or less",
            reason="exceeds-compute",
        )
    return demand


# --- building the patch ----------------------------------------------------


def _scheduler_ops(spec: Mapping[str, Any], policy: Policy, patch: patching.Writer) -> None:
    if spec.get("schedulerName") != policy.scheduler_name:
        patch.set_field(spec, "schedulerName", "/spec", patching.string(policy.scheduler_name))


def _volume_ops(
    spec: Mapping[str, Any], policy: Policy, layout: _Layout, patch: patching.Writer
) -> None:
    wanted = layout.volume
    volumes = _list(spec, "volumes", "spec")
    for index, volume in enumerate(volumes):
        if not isinstance(volume, dict):
            raise ShapeError(f"spec.volumes[{index}]", "a volume object", volume)
        if volume.get("name") == VOLUME_NAME:
            if volume == wanted:
                return
            raise PodError(
                f"spec.volumes[{index}] is named {VOLUME_NAME!r}, a name the webhook reserves for "
                "the GPU shim; rename the volume",
                reason="reserved-volume",
            )
        host = volume.get("hostPath")
        if isinstance(host, dict) and overlaps(str(host.get("path", "")), policy.shim.host_path):
            raise PodError(
                f"spec.volumes[{index}] ({volume.get('name')!r}) mounts host path "
                f"{host.get('path')!r}, which holds the GPU shim; a GPU pod may not mount it "
                "itself: remove the volume",
                reason="shim-host-path",
            )
    if spec.get("volumes") is None:
        patch.set_field(spec, "volumes", "/spec", patching.array([layout.volume_json]))
    else:
        patch.add("/spec/volumes/-", layout.volume_json)


@dataclass(frozen=True)
class _Layout:
    """What the webhook puts in every GPU container, worked out once per policy."""

    preload: str  # the shim's path in the container, first in LD_PRELOAD
    volume: Mapping[str, Any]  # the hostPath volume of the shim
    volume_json: str
    mount_dir: str  # the shim's mount path with one trailing slash, to compare paths
    # (path with trailing slash, mount, its JSON text)
    mounts: tuple[tuple[str, Mapping[str, Any], str], ...]
    mount_paths: frozenset[str]
    memory_limit: str
    sm_limit: str
    shadow: re.Pattern[str]  # per-device variants of the limits (CUDA_DEVICE_MEMORY_LIMIT_3)
    mib_per_unit: int


@functools.lru_cache(maxsize=16)
def _layout(shim: Shim, env: EnvNames, mib_per_unit: int) -> _Layout:
    mount_dir = shim.mount_path.rstrip("/") + "/"
    mounts: list[tuple[str, Mapping[str, Any]]] = [
        (mount_dir, {"name": VOLUME_NAME, "mountPath": shim.mount_path, "readOnly": True})
    ]
    if shim.ld_so_preload:
        # NB: <hostPath>/ld.so.preload lists the library by its path in the container.
        mounts.append(
            (
                LD_SO_PRELOAD + "/",
                {
                    "name": VOLUME_NAME,
                    "mountPath": LD_SO_PRELOAD,
                    "subPath": "ld.so.preload",
                    "readOnly": True,
                },
            )
        )
    names = f"{re.escape(env.memory_limit)}|{re.escape(env.sm_limit)}"
    volume = {"name": VOLUME_NAME, "hostPath": {"path": shim.host_path, "type": "Directory"}}
    return _Layout(
        preload=shim.preload,
        volume=volume,
        volume_json=patching.compact_json(volume),
        mount_dir=mount_dir,
        mounts=tuple((path, mount, patching.compact_json(mount)) for path, mount in mounts),
        mount_paths=frozenset(path for path, _ in mounts),
        memory_limit=env.memory_limit,
        sm_limit=env.sm_limit,
        shadow=re.compile(rf"({names})_\d+"),
        mib_per_unit=mib_per_unit,
    )


def _mount_ops(
    container: Mapping[str, Any],
    base: str,
    ask: ContainerAsk,
    policy: Policy,
    *,
    layout: _Layout,
    patch: patching.Writer,
) -> None:
    wanted = layout.mount_paths
    shim_dir = layout.mount_dir
    if container.get("volumeMounts") is None:
        texts = [text for _, _, text in layout.mounts]
        patch.set_field(container, "volumeMounts", base, patching.array(texts))
        return
    mounts = _list(container, "volumeMounts", base)
    ours: dict[str, int] = {}
    for index, mount in enumerate(mounts):
        if not isinstance(mount, dict):
            raise ShapeError(f"{ask.label} volumeMounts[{index}]", "a volume mount object", mount)
        path = mount.get("mountPath", "")
        path = (path if type(path) is str else str(path)).rstrip("/") + "/"
        name = mount.get("name")
        if name == VOLUME_NAME and path in wanted and path not in ours:
            ours[path] = index
        elif name == VOLUME_NAME:
            raise PodError(
                f"{ask.label} mounts the webhook's volume {VOLUME_NAME!r} at "
                f"{mount.get('mountPath')!r}; the shim may only be mounted read-only at "
                f"{policy.shim.mount_path}: remove that mount",
                reason="shim-mount",
            )
        elif path.startswith(shim_dir):
            raise PodError(
                f"{ask.label} mounts volume {name!r} at {mount.get('mountPath')!r}, where the "
                "webhook mounts the GPU shim; it would replace the shim and escape its limit: "
                f"mount it somewhere outside {policy.shim.mount_path}",
                reason="shim-mount",
            )
        elif path in wanted:
            raise PodError(
                f"{ask.label} mounts volume {name!r} at {mount.get('mountPath')!r}, where the "
                "webhook puts the list of preloaded libraries; it would drop the GPU shim: "
                "remove that mount",
                reason="shim-mount",
            )
    missing = []
    for path, mount, text in layout.mounts:
        if path in ours:
            if mounts[ours[path]] != mount:
                patch.replace(f"{base}/volumeMounts/{ours[path]}", text)
        else:
            missing.append(text)
    for text in missing:
        patch.add(f"{base}/volumeMounts/-", text)


def _limit_env(ask: ContainerAsk, layout: _Layout) -> dict[str, str]:
    mib = f"{ask.memory * layout.mib_per_unit}m"
    wanted = {layout.memory_limit: mib}
    if ask.gpus > 1:
        # HAMi-core reads one limit per visible device, index by index.
        for device in range(ask.gpus):
            wanted[f"{layout.memory_limit}_{device}"] = mib
    if ask.compute is not None:
        wanted[layout.sm_limit] = str(ask.compute)
    return wanted


def _env_ops(
    container: Mapping[str, Any],
    base: str,
    ask: ContainerAsk,
    *,
    layout: _Layout,
    patch: patching.Writer,
    warnings: list[str],
) -> None:
    """Ops that leave the container's env as the shim needs it, and nothing else changed.

    The limit variables and LD_PRELOAD are set where the container has them
    (its first entry of each) or appended; later duplicates, which the
    kubelet would let win, and per-device variants that would override the
    limit are removed. Entries are addressed by index: replacements first,
    then removals from the highest index down, so no op shifts another's
    target; appends last.
    """
    wanted = _limit_env(ask, layout)
    if container.get("env") is None:
        entries = [patching.env_entry(name, value) for name, value in wanted.items()]
        entries.append(patching.env_entry(PRELOAD, layout.preload))
        patch.set_field(container, "env", base, patching.array(entries))
        return
    env = _list(container, "env", base)
    prefixes = (layout.memory_limit, layout.sm_limit)
    replaced: list[tuple[int, str, str]] = []  # (index, name, value)
    removed: list[int] = []
    seen: set[str] = set()
    preload_at = -1
    user_preload = ""
    for index, entry in enumerate(env):
        name = entry.get("name") if isinstance(entry, dict) else None
        if type(name) is not str:
            raise ShapeError(f"{ask.label} env[{index}]", "an object with a string name", entry)
        if name == PRELOAD:
            if "valueFrom" in entry:
                raise PodError(
                    f"{ask.label} sets {PRELOAD} with valueFrom; the webhook must know its value "
                    "to put the GPU shim first: set it with a plain value",
                    reason="preload-value-from",
                )
            # The kubelet keeps the last entry; the shim goes first in its value,
            # at the place of the first entry, the only one left.
            user_preload = str(entry.get("value") or "")
            if preload_at >= 0:
                warnings.append(f"{ask.label}: removed a second {name} entry")
                removed.append(index)
            else:
                preload_at = index
        elif name in wanted:
            if name in seen:
                # A later duplicate would win over ours: the kubelet keeps the last one.
                warnings.append(f"{ask.label}: removed a second {name} entry")
                removed.append(index)
                continue
            seen.add(name)
            value = wanted[name]
            if entry.get("value") != value or "valueFrom" in entry:
                warnings.append(
                    f"{ask.label}: {name} was set to {entry.get('value', '(valueFrom)')!r}; "
                    f"the webhook set it to {value!r}, what the container asked for"
                )
            if len(entry) != 2 or entry.get("value") != value:
                replaced.append((index, name, value))
        elif name.startswith(prefixes) and layout.shadow.fullmatch(name):
            warnings.append(
                f"{ask.label}: removed {name}, which would override the limit the webhook sets"
            )
            removed.append(index)
    preload = _preload(user_preload, layout.preload)
    if preload_at >= 0 and env[preload_at] != {"name": PRELOAD, "value": preload}:
        replaced.append((preload_at, PRELOAD, preload))
        replaced.sort()  # by index: no two entries share one
    for index, name, value in replaced:
        patch.replace(f"{base}/env/{index}", patching.env_entry(name, value))
    for index in reversed(removed):
        patch.remove(f"{base}/env/{index}")
    for name, value in wanted.items():
        if name not in seen:
            patch.add(f"{base}/env/-", patching.env_entry(name, value))
    if preload_at < 0:
        patch.add(f"{base}/env/-", patching.env_entry(PRELOAD, preload))


@functools.lru_cache(maxsize=256)
def _preload(user_value: str, shim: str) -> str:
    """LD_PRELOAD with the shim first, then the user's libraries (the shim once)."""
    # ld.so splits LD_PRELOAD on spaces and colons alike.
    others = [item for item in re.split(r"[:\s]+", user_value) if item and item != shim]
    return ":".join([shim, *others])


def _annotation_ops(
    metadata: Mapping[str, Any],
    asks: list[ContainerAsk],
    policy: Policy,
    demand: int,
    patch: patching.Writer,
) -> None:
    containers: dict[str, dict[str, Any]] = {}
    for ask in asks:
        entry: dict[str, Any] = {"memory": f"{ask.memory * policy.mib_per_unit}m"}
        if ask.gpus > 1:
            entry["gpus"] = ask.gpus
        if ask.compute is not None:
            entry["compute"] = ask.compute
        containers[ask.name] = entry
    record = {
        "scheduler": policy.scheduler_name,
        "shim": policy.shim.preload,
        "demand": f"{demand}{policy.memory_unit}",
        "containers": containers,
    }
    value = patching.sorted_ascii_json(record)
    annotations = metadata.get("annotations")
    if annotations is None:
        ours = {STATUS_ANNOTATION: value}
        if not metadata:
            patch.add("/metadata", patching.compact_json({"annotations": ours}))
        else:
            patch.add("/metadata/annotations", patching.compact_json(ours))
        return
    if not isinstance(annotations, dict):
        raise ShapeError("metadata.annotations", "an object", annotations)
    if annotations.get(STATUS_ANNOTATION) != value:
        path = "/metadata/annotations"
        patch.set_field(annotations, STATUS_ANNOTATION, path, patching.string(value))
