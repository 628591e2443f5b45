"""The operator's policy: one table of its keys, and the model, parsing and YAML made from it.

Owns the ``policy.yaml`` schema (mounted from a ConfigMap in a cluster).
Each key is declared once, on the field of the frozen dataclass that holds
it: its YAML name, its check and a line of documentation (``setting``,
``section`` and ``by_name`` of ``webhook.decision.keys``). Parsing, the
defaults, the unknown-key message and ``policy show`` (the YAML the
docs/policy.md's reference is) are all read from those declarations. It never
reads files: the caller hands it text, so the same code checks a policy
offline, at start-up and on a live reload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal, cast

import yaml

from webhook import __version__
from webhook.decision.contract import REGION_DIR, REGION_FALLBACK
from webhook.decision.keys import (
    DNS_LABELS,
    IMAGE,
    NAMESPACE,
    AbsolutePath,
    Boolean,
    Choice,
    ComputeDefault,
    ComputeDefaultCheck,
    FileName,
    Folder,
    Named,
    NamespaceList,
    OrEmpty,
    PositiveInt,
    String,
    build,
    by_name,
    lines,
    section,
    setting,
)
from webhook.decision.quantities import MIB_PER_UNIT, MemoryUnit
from webhook.decision.schedulers import SCHEDULERS, Dra, Scheduler
from webhook.errors import PolicyError

Enforcement = Literal["enforce", "warn"]
MultiGpuMemory = Literal["total", "perDevice"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A qualified resource name: optional DNS prefix, a slash, then a name part.
_RESOURCE = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
LD_SO_PRELOAD = "/etc/ld.so.preload"


@dataclass(frozen=True)
class Shim:
    """Where the interception library lives on the node and in the container."""

    host_path: str = setting(
        "hostPath", "/usr/local/vgpu", Folder(), "directory on the node holding the shim"
    )
    mount_path: str = setting(
        "mountPath", "/usr/local/vgpu", Folder(), "where it is mounted, read-only"
    )
    library: str = setting(
        "library", "libvgpu.so", FileName(), "preloaded as LD_PRELOAD=<mountPath>/<library>"
    )
    # A process cannot drop /etc/ld.so.preload by clearing its environment, but the
    # shim it loads then reads no limit (docs/security.md, "A cleared environment").
    ld_so_preload: bool = setting(
        "ldSoPreload", False, Boolean(), "also mount <hostPath>/ld.so.preload at /etc/ld.so.preload"
    )
    # Off unless set: the step runs initImage on every GPU node, which a policy
    # written without the install cannot name (docs/policy.md, "The init step").
    init_regions: bool = setting(
        "initRegions",
        False,
        Boolean(),
        "init each GPU container's region first; mount it at " + REGION_FALLBACK,
    )
    init_image: str = setting(
        "initImage",
        f"gpushare-webhook:{__version__}",
        String(IMAGE, "an image"),
        "that init step's image: this one's",
    )
    # HAMi-core sets every KEY=VALUE line of this file over the pod's env.
    override_file: str = setting(
        "overrideFile",
        "/overrideEnv",
        OrEmpty(AbsolutePath()),
        'file the shim takes variables from; /dev/null hides it ("": none)',
    )
    # The node agent labels the nodes it installed the shim on (docs/node-agent.md).
    require_node_label: bool = setting(
        "requireNodeLabel",
        False,
        Boolean(),
        "place GPU pods only on nodes labelled gpushare-webhook.io/shim",
    )

    @property
    def preload(self) -> str:
        """The path put first in LD_PRELOAD."""
        return f"{self.mount_path.rstrip('/')}/{self.library}"


@dataclass(frozen=True)
class EnvNames:
    """Names of the environment variables the shim reads."""

    memory_limit: str = setting(
        "memoryLimit",
        "CUDA_DEVICE_MEMORY_LIMIT",
        String(_ENV_NAME, "an environment variable name"),
        'the container\'s request in MiB: "4096m"',
    )
    sm_limit: str = setting(
        "smLimit",
        "CUDA_DEVICE_SM_LIMIT",
        String(_ENV_NAME, "an environment variable name"),
        "the compute share, a percentage",
    )


@dataclass(frozen=True)
class Compute:
    """Compute (SM) share: the resource users ask it with, and the default."""

    resource_name: str = setting(
        "resourceName",
        "aliyun.com/gpu-core.percentage",
        String(_RESOURCE, "a resource name such as aliyun.com/gpu-core.percentage"),
        "a percentage of one GPU's SMs",
    )
    default: ComputeDefault = setting(
        "default",
        "none",
        ComputeDefaultCheck(),
        "none, proportional (to memory), or a percentage 1-100",
    )


@dataclass(frozen=True)
class MultiGpu:
    """Pods spanning several GPUs of one node."""

    resource_name: str = setting(
        "resourceName",
        "aliyun.com/gpu-count",
        String(_RESOURCE, "a resource name such as aliyun.com/gpu-count"),
        "how many GPUs a pod spans; also the Node capacity that counts them",
    )
    count_from: Literal["label", "resource"] = setting(
        "countFrom",
        "label",
        Choice(("label", "resource")),
        "label (the pod's label, as ACK reads it) or resource (each container's)",
    )
    memory: MultiGpuMemory = setting(
        "memory",
        "total",
        Choice(("total", "perDevice")),
        "total (split evenly over the GPUs, as ACK does) or perDevice (as HAMi does)",
    )
    max_gpus: int = setting("maxGpus", 8, PositiveInt(1024), "GPUs of the largest node")


@dataclass(frozen=True)
class Security:
    """What a GPU-memory pod may not do, because it would reach past the shim."""

    reject_privileged: bool = setting(
        "rejectPrivileged", True, Boolean(), "reject privileged, hostPID, CAP_SYS_ADMIN"
    )
    reject_visible_devices: bool = setting(
        "rejectVisibleDevices", True, Boolean(), "reject NVIDIA_VISIBLE_DEVICES set by the user"
    )


_ENFORCEMENT_DOC = "enforce (refuse) or warn (admit, with a warning per refusal)"


@dataclass(frozen=True)
class NamespacePolicy:
    """What the policy's author sets for one namespace (not its labels: its users own those)."""

    enforcement: Enforcement = setting(
        "enforcement", "enforce", Choice(("enforce", "warn")), _ENFORCEMENT_DOC
    )


@dataclass(frozen=True)
class Policy:
    """The effective policy, defaults filled in."""

    scheduler: str = setting(
        "scheduler",
        "gpushare-extender",
        Choice(tuple(SCHEDULERS)),
        "the GPU-share scheduler: gpushare-extender (open source), ack or dra",
    )
    scheduler_name: str = setting(
        "schedulerName",
        "default-scheduler",
        String(DNS_LABELS, "a scheduler name such as default-scheduler"),
        "set on every GPU-memory pod; a profile of the scheduler",
    )
    resource_name: str = setting(
        "resourceName",
        "aliyun.com/gpu-mem",
        String(_RESOURCE, "a resource name such as aliyun.com/gpu-mem"),
        "the resource that makes a pod a GPU-memory pod",
    )
    memory_unit: MemoryUnit = setting(
        "memoryUnit", "GiB", Choice(("GiB", "MiB")), "GiB or MiB: one unit of resourceName"
    )
    gpu_memory: int = setting(
        "gpuMemory",
        16,
        PositiveInt(2**40),
        "largest GPU, in memoryUnit, if nodes are unknown (16384 with MiB)",
    )
    shim: Shim = section("shim", Shim, "the interception library")
    env: EnvNames = section("env", EnvNames, "the variables the shim reads")
    compute: Compute = section("compute", Compute, "compute (SM) share")
    multi_gpu: MultiGpu = section("multiGpu", MultiGpu, "pods spanning several GPUs")
    security: Security = section("security", Security, "what a GPU-memory pod may not do")
    dra: Dra = section("dra", Dra, "scheduler: dra's DeviceClass and driver")
    exclude_namespaces: tuple[str, ...] = setting(
        "excludeNamespaces", ("kube-system",), NamespaceList(), "pods here are never touched"
    )
    enforcement: Enforcement = setting(
        "enforcement", "enforce", Choice(("enforce", "warn")), _ENFORCEMENT_DOC
    )
    namespaces: Named[NamespacePolicy] = by_name(
        "namespaces",
        NamespacePolicy,
        "per namespace: NAME: {enforcement: warn}; set only here, never by labels",
        name=NAMESPACE,
    )

    @property
    def placed_by(self) -> Scheduler:
        """The scheduler whose reservations the pod's set-up must agree with."""
        return SCHEDULERS[self.scheduler]

    @property
    def gpu_resources(self) -> tuple[str, str, str]:
        """The extended resources a pod asks a share of a GPU with: memory, compute, count."""
        return (self.resource_name, self.compute.resource_name, self.multi_gpu.resource_name)

    @property
    def mib_per_unit(self) -> int:
        return MIB_PER_UNIT[self.memory_unit]

    def enforcement_for(self, namespace: str) -> Enforcement:
        """Whether a pod in ``namespace`` that breaks a rule is refused or admitted, warned."""
        override = self.namespaces.get(namespace) if namespace else None
        return override.enforcement if override is not None else self.enforcement


DEFAULT_POLICY = Policy()


def parse_policy(document: object) -> Policy:
    """Build a Policy from a decoded YAML document (None means all defaults)."""
    if document is None:
        return DEFAULT_POLICY
    if not isinstance(document, dict):
        raise PolicyError(
            f"the policy must be a YAML mapping of keys, got {type(document).__name__}"
        )
    if "apiVersion" in document and "kind" in document:
        # The shipped policy.yaml is a ConfigMap: the likeliest wrong file to give.
        raise PolicyError(
            f"this is a Kubernetes {document['kind']}, not a policy; give the policy it holds "
            "(a ConfigMap's data.policy.yaml), as kubectl get configmap NAME "
            "-o jsonpath='{.data.policy\\.yaml}' writes it"
        )
    policy = cast(Policy, build(Policy, document, ""))
    if policy.memory_unit == "MiB" and "gpuMemory" not in document:
        # The default is 16 GiB in either unit; read as MiB it would be 16 MiB.
        policy = replace(policy, gpu_memory=DEFAULT_POLICY.gpu_memory * MIB_PER_UNIT["GiB"])
    if "schedulerName" not in document:
        policy = replace(policy, scheduler_name=policy.placed_by.scheduler_name)
    _cross_check(policy)
    return policy


def _cross_check(policy: Policy) -> None:
    if policy.shim.ld_so_preload and overlaps(policy.shim.mount_path, LD_SO_PRELOAD):
        raise PolicyError(
            f"policy key 'shim.mountPath': {policy.shim.mount_path!r} overlaps "
            f"{LD_SO_PRELOAD}, where shim.ldSoPreload mounts the preload list"
        )
    for key, path in (
        ("mountPath", policy.shim.mount_path),
        ("overrideFile", policy.shim.override_file),
    ):
        if path and overlaps(path, REGION_DIR):
            raise PolicyError(
                f"policy key 'shim.{key}': {path!r} overlaps {REGION_DIR}, where the "
                "webhook mounts the shim's accounting"
            )
    if len(set(policy.gpu_resources)) != 3:
        raise PolicyError(
            "policy keys 'resourceName', 'compute.resourceName' and 'multiGpu.resourceName' "
            "must name three different resources"
        )
    if policy.env.memory_limit == policy.env.sm_limit or "LD_PRELOAD" in (
        policy.env.memory_limit,
        policy.env.sm_limit,
    ):
        raise PolicyError(
            "policy keys 'env.memoryLimit' and 'env.smLimit' must be two different variables, "
            "neither of them LD_PRELOAD"
        )


def folder(path: str) -> str:
    """``path`` with one trailing slash: folders compare by prefix ("/a/b/" is in "/a/")."""
    return path.rstrip("/") + "/"


def overlaps(path: str, other: str) -> bool:
    """True when one path is the other or lies inside it."""
    a, b = folder(path), folder(other)
    return a.startswith(b) or b.startswith(a)


def parse_policy_text(text: str, *, source: str = "policy") -> Policy:
    """Parse a policy from YAML text; errors are prefixed with ``source``."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "malformed YAML"
        if isinstance(error, yaml.reader.ReaderError):  # a character YAML does not allow
            where = f" at character {error.position + 1}"
            found = error.character
            shown = repr(chr(found) if isinstance(found, int) else found)
            problem = f"{shown} is not allowed ({error.reason})"
        raise PolicyError(f"{source}: not valid YAML{where}: {problem}") from None
    try:
        return parse_policy(document)
    except PolicyError as error:
        raise PolicyError(f"{source}: {error}") from None


# Where the comment of a line starts in ``policy show``; a longer line has its
# comment two spaces after it.
_COMMENT_COLUMN = 36


def dump_policy(policy: Policy) -> str:
    """The effective policy as YAML, every key present, each with its line of documentation."""
    shown = []
    for text, doc in lines(policy):
        shown.append(f"{text.ljust(_COMMENT_COLUMN - 2)}  # {doc}" if doc else text)
    return "\n".join(shown) + "\n"
