"""The operator's policy: its model, its defaults and its parsing.

Owns the ``policy.yaml`` schema (mounted from a ConfigMap in a cluster) and
turns a document into a frozen :class:`Policy`, or a :class:`PolicyError`
that names the offending key and what it accepts. It never reads files: the
caller hands it text, so the same code checks a policy offline, at start-up
and on a live reload.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import yaml

from webhook.errors import PolicyError

MemoryUnit = Literal["GiB", "MiB"]
ComputeDefault = Literal["none", "proportional"] | int
MultiGpuMemory = Literal["total", "perDevice"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A qualified resource name: optional DNS prefix, a slash, then a name part.
_RESOURCE = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_DNS_LABELS = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class Shim:
    """Where the interception library lives on the node and in the container."""

    host_path: str = "/usr/local/vgpu"
    mount_path: str = "/usr/local/vgpu"
    library: str = "libvgpu.so"
    # Also preload through /etc/ld.so.preload, which a process cannot drop by
    # clearing its environment: <hostPath>/ld.so.preload is mounted there.
    ld_so_preload: bool = False

    @property
    def preload(self) -> str:
        """The path put first in LD_PRELOAD."""
        return f"{self.mount_path.rstrip('/')}/{self.library}"


LD_SO_PRELOAD = "/etc/ld.so.preload"


@dataclass(frozen=True)
class Security:
    """What a GPU-memory pod may not do, because it would reach past the shim."""

    # privileged, hostPID or CAP_SYS_ADMIN: every GPU of the node, past the device cgroup.
    reject_privileged: bool = True
    # NVIDIA_VISIBLE_DEVICES set by the user: the NVIDIA runtime would expose those GPUs.
    reject_visible_devices: bool = True


@dataclass(frozen=True)
class EnvNames:
    """Names of the environment variables the shim reads."""

    memory_limit: str = "CUDA_DEVICE_MEMORY_LIMIT"
    sm_limit: str = "CUDA_DEVICE_SM_LIMIT"


@dataclass(frozen=True)
class Compute:
    """Compute (SM) share: the resource users ask it with, and the default."""

    resource_name: str = "aliyun.com/gpu-core.percentage"
    default: ComputeDefault = "none"


@dataclass(frozen=True)
class MultiGpu:
    """Pods spanning several GPUs of one node."""

    resource_name: str = "aliyun.com/gpu-count"
    # "total": gpu-mem is the pod's total, split evenly over the GPUs (ACK's
    # multi-GPU sharing); "perDevice": gpu-mem is asked on each GPU.
    memory: MultiGpuMemory = "total"
    max_gpus: int = 8


@dataclass(frozen=True)
class Policy:
    """The effective policy, defaults filled in."""

    scheduler_name: str = "gpushare-scheduler"
    resource_name: str = "aliyun.com/gpu-mem"
    memory_unit: MemoryUnit = "GiB"
    gpu_memory: int = 16
    shim: Shim = field(default_factory=Shim)
    env: EnvNames = field(default_factory=EnvNames)
    compute: Compute = field(default_factory=Compute)
    multi_gpu: MultiGpu = field(default_factory=MultiGpu)
    security: Security = field(default_factory=Security)
    exclude_namespaces: tuple[str, ...] = ("kube-system",)

    @property
    def mib_per_unit(self) -> int:
        return 1024 if self.memory_unit == "GiB" else 1

    def to_document(self) -> dict[str, Any]:
        """The policy as the YAML document an operator writes (camelCase keys)."""
        return {
            "schedulerName": self.scheduler_name,
            "resourceName": self.resource_name,
            "memoryUnit": self.memory_unit,
            "gpuMemory": self.gpu_memory,
            "shim": {
                "hostPath": self.shim.host_path,
                "mountPath": self.shim.mount_path,
                "library": self.shim.library,
                "ldSoPreload": self.shim.ld_so_preload,
            },
            "env": {"memoryLimit": self.env.memory_limit, "smLimit": self.env.sm_limit},
            "compute": {
                "resourceName": self.compute.resource_name,
                "default": self.compute.default,
            },
            "multiGpu": {
                "resourceName": self.multi_gpu.resource_name,
                "memory": self.multi_gpu.memory,
                "maxGpus": self.multi_gpu.max_gpus,
            },
            "security": {
                "rejectPrivileged": self.security.reject_privileged,
                "rejectVisibleDevices": self.security.reject_visible_devices,
            },
            "excludeNamespaces": list(self.exclude_namespaces),
        }


DEFAULT_POLICY = Policy()

Check = Callable[[str, Any], Any]


def _string(pattern: re.Pattern[str] | None, hint: str) -> Check:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise PolicyError(
                f"policy key {key!r}: expected a non-empty string ({hint}), got {value!r}"
            )
        if pattern is not None and not pattern.fullmatch(value):
            raise PolicyError(f"policy key {key!r}: {value!r} is not valid; expected {hint}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a YAML escape such as "\ud800"
                raise PolicyError(
                    f"policy key {key!r}: {value!r} holds a lone UTF-16 surrogate, which no "
                    "file name or Kubernetes object can hold; write the characters themselves"
                ) from None
        return value

    return check


def _absolute_path(key: str, value: Any) -> str:
    path = str(_string(None, "an absolute path")(key, value))
    if not path.startswith("/") or "\x00" in path or ".." in path.split("/"):
        raise PolicyError(f"policy key {key!r}: {path!r} must be an absolute path without '..'")
    return path


def _file_name(key: str, value: Any) -> str:
    name = str(_string(None, "a file name such as libvgpu.so")(key, value))
    if "/" in name or name in {".", ".."} or any(c in name for c in " :\x00"):
        raise PolicyError(
            f"policy key {key!r}: {name!r} must be a bare file name (no '/', ':' or spaces); "
            "the directory is shim.mountPath"
        )
    return name


def _positive_int(limit: int | None = None) -> Check:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyError(
                f"policy key {key!r}: expected a positive whole number, got {value!r}"
            )
        if limit is not None and value > limit:
            raise PolicyError(f"policy key {key!r}: {value} is too large (at most {limit})")
        return value

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"policy key {key!r}: expected true or false, got {value!r}")
    return value


def _choice(*allowed: str) -> Check:
    def check(key: str, value: Any) -> str:
        if value not in allowed:
            raise PolicyError(
                f"policy key {key!r}: {value!r} is not allowed; use one of {', '.join(allowed)}"
            )
        return cast(str, value)

    return check


def _compute_default(key: str, value: Any) -> ComputeDefault:
    if value in ("none", "proportional"):
        return cast(ComputeDefault, value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100:
        return value
    raise PolicyError(
        f"policy key {key!r}: {value!r} is not allowed; use none, proportional, "
        "or a whole percentage from 1 to 100"
    )


def _namespaces(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"policy key {key!r}: expected a list of namespace names, got {value!r}")
    check = _string(_DNS_LABELS, "a namespace name")
    return tuple(check(f"{key}[{i}]", item) for i, item in enumerate(value))


_SCHEMA: dict[str, Check | dict[str, Check]] = {
    "schedulerName": _string(_DNS_LABELS, "a scheduler name such as gpushare-scheduler"),
    "resourceName": _string(_RESOURCE, "a resource name such as aliyun.com/gpu-mem"),
    "memoryUnit": _choice("GiB", "MiB"),
    "gpuMemory": _positive_int(2**40),
    "shim": {
        "hostPath": _absolute_path,
        "mountPath": _absolute_path,
        "library": _file_name,
        "ldSoPreload": _bool,
    },
    "env": {
        "memoryLimit": _string(_ENV_NAME, "an environment variable name"),
        "smLimit": _string(_ENV_NAME, "an environment variable name"),
    },
    "compute": {
        "resourceName": _string(
            _RESOURCE, "a resource name such as aliyun.com/gpu-core.percentage"
        ),
        "default": _compute_default,
    },
    "multiGpu": {
        "resourceName": _string(_RESOURCE, "a resource name such as aliyun.com/gpu-count"),
        "memory": _choice("total", "perDevice"),
        "maxGpus": _positive_int(1024),
    },
    "security": {"rejectPrivileged": _bool, "rejectVisibleDevices": _bool},
    "excludeNamespaces": _namespaces,
}


def _checked(document: Mapping[str, Any], schema: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in document.items():
        dotted = f"{prefix}{key}"
        if key not in schema:
            raise PolicyError(
                f"policy key {dotted!r} is not known; allowed keys here: {', '.join(schema)}"
            )
        rule = schema[key]
        if isinstance(rule, dict):
            if not isinstance(value, dict):
                raise PolicyError(
                    f"policy key {dotted!r}: expected a mapping with keys {', '.join(rule)}, "
                    f"got {value!r}"
                )
            out[key] = _checked(value, rule, f"{dotted}.")
        else:
            out[key] = rule(dotted, value)
    return out


def parse_policy(document: object) -> Policy:
    """Build a Policy from a decoded YAML document (None means all defaults)."""
    if document is None:
        return DEFAULT_POLICY
    if not isinstance(document, dict):
        raise PolicyError(
            f"the policy must be a YAML mapping of keys, got {type(document).__name__}"
        )
    doc = _checked(document, _SCHEMA, "")
    shim, env = doc.get("shim", {}), doc.get("env", {})
    compute, multi = doc.get("compute", {}), doc.get("multiGpu", {})
    security = doc.get("security", {})
    d = DEFAULT_POLICY
    policy = Policy(
        scheduler_name=doc.get("schedulerName", d.scheduler_name),
        resource_name=doc.get("resourceName", d.resource_name),
        memory_unit=doc.get("memoryUnit", d.memory_unit),
        gpu_memory=doc.get("gpuMemory", d.gpu_memory),
        shim=Shim(
            host_path=shim.get("hostPath", d.shim.host_path),
            mount_path=shim.get("mountPath", d.shim.mount_path),
            library=shim.get("library", d.shim.library),
            ld_so_preload=shim.get("ldSoPreload", d.shim.ld_so_preload),
        ),
        env=EnvNames(
            memory_limit=env.get("memoryLimit", d.env.memory_limit),
            sm_limit=env.get("smLimit", d.env.sm_limit),
        ),
        compute=Compute(
            resource_name=compute.get("resourceName", d.compute.resource_name),
            default=compute.get("default", d.compute.default),
        ),
        multi_gpu=MultiGpu(
            resource_name=multi.get("resourceName", d.multi_gpu.resource_name),
            memory=multi.get("memory", d.multi_gpu.memory),
            max_gpus=multi.get("maxGpus", d.multi_gpu.max_gpus),
        ),
        security=Security(
            reject_privileged=security.get("rejectPrivileged", d.security.reject_privileged),
            reject_visible_devices=security.get(
                "rejectVisibleDevices", d.security.reject_visible_devices
            ),
        ),
        exclude_namespaces=doc.get("excludeNamespaces", d.exclude_namespaces),
    )
    _cross_check(policy)
    return policy


def _cross_check(policy: Policy) -> None:
    if policy.shim.ld_so_preload and overlaps(policy.shim.mount_path, LD_SO_PRELOAD):
        raise PolicyError(
            f"policy key 'shim.mountPath': {policy.shim.mount_path!r} overlaps "
            f"{LD_SO_PRELOAD}, where shim.ldSoPreload mounts the preload list"
        )
    names = {policy.resource_name, policy.compute.resource_name, policy.multi_gpu.resource_name}
    if len(names) != 3:
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


def overlaps(path: str, other: str) -> bool:
    """True when one path is the other or lies inside it."""
    a, b = path.rstrip("/") + "/", other.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def parse_policy_text(text: str, *, source: str = "policy") -> Policy:
    """Parse a policy from YAML text; errors are prefixed with ``source``."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "malformed YAML"
        raise PolicyError(f"{source}: not valid YAML{where}: {problem}") from None
    try:
        return parse_policy(document)
    except PolicyError as error:
        raise PolicyError(f"{source}: {error}") from None


def dump_policy(policy: Policy) -> str:
    """The effective policy as YAML, every key present."""
    return yaml.safe_dump(policy.to_document(), sort_keys=False)
