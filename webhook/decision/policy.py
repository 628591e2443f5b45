"""The operator's policy: one table of its keys, and the model, parsing and YAML made from it.

Owns the ``policy.yaml`` schema (mounted from a ConfigMap in a cluster).
Each key is declared once, on the field of the frozen dataclass that holds
it: its YAML name, its check and a line of documentation (:func:`setting`,
:func:`section`). Parsing, the defaults, the unknown-key message and
``policy show`` (the YAML the README's reference is) are all read from
those declarations. It never reads files: the caller hands it text, so the
same code checks a policy offline, at start-up and on a live reload.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, dataclass, fields, replace
from dataclasses import field as dataclass_field
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
LD_SO_PRELOAD = "/etc/ld.so.preload"

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


def _optional(check: Check) -> Check:
    """``check``, or the empty string for "none"."""

    def optional(key: str, value: Any) -> Any:
        return value if value == "" else check(key, value)

    return optional


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


def setting(key: str, default: Any, check: Check, doc: str) -> Any:
    """A policy key: its YAML name, default, check and one line for ``policy show``."""
    return dataclass_field(default=default, metadata={"key": key, "check": check, "doc": doc})


def section(key: str, kind: type, doc: str) -> Any:
    """A mapping of keys, declared by the dataclass ``kind``."""
    return dataclass_field(default_factory=kind, metadata={"key": key, "section": kind, "doc": doc})


@dataclass(frozen=True)
class Shim:
    """Where the interception library lives on the node and in the container."""

    host_path: str = setting(
        "hostPath", "/usr/local/vgpu", _absolute_path, "directory on the node holding the shim"
    )
    mount_path: str = setting(
        "mountPath", "/usr/local/vgpu", _absolute_path, "where it is mounted, read-only"
    )
    library: str = setting(
        "library", "libvgpu.so", _file_name, "preloaded as LD_PRELOAD=<mountPath>/<library>"
    )
    # A process cannot drop /etc/ld.so.preload by clearing its environment.
    ld_so_preload: bool = setting(
        "ldSoPreload", False, _bool, "also mount <hostPath>/ld.so.preload at /etc/ld.so.preload"
    )
    # HAMi-core sets every KEY=VALUE line of this file over the pod's env.
    override_file: str = setting(
        "overrideFile",
        "/overrideEnv",
        _optional(_absolute_path),
        'file the shim takes variables from; /dev/null hides it ("": none)',
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
        _string(_ENV_NAME, "an environment variable name"),
        'the container\'s request in MiB: "4096m"',
    )
    sm_limit: str = setting(
        "smLimit",
        "CUDA_DEVICE_SM_LIMIT",
        _string(_ENV_NAME, "an environment variable name"),
        "the compute share, a percentage",
    )


@dataclass(frozen=True)
class Compute:
    """Compute (SM) share: the resource users ask it with, and the default."""

    resource_name: str = setting(
        "resourceName",
        "aliyun.com/gpu-core.percentage",
        _string(_RESOURCE, "a resource name such as aliyun.com/gpu-core.percentage"),
        "a percentage of one GPU's SMs",
    )
    default: ComputeDefault = setting(
        "default",
        "none",
        _compute_default,
        "none, proportional (to memory), or a percentage 1-100",
    )


@dataclass(frozen=True)
class MultiGpu:
    """Pods spanning several GPUs of one node."""

    resource_name: str = setting(
        "resourceName",
        "aliyun.com/gpu-count",
        _string(_RESOURCE, "a resource name such as aliyun.com/gpu-count"),
        "how many GPUs a pod spans; also the Node capacity that counts them",
    )
    count_from: Literal["label", "resource"] = setting(
        "countFrom",
        "label",
        _choice("label", "resource"),
        "label (the pod's label, as ACK reads it) or resource (each container's)",
    )
    memory: MultiGpuMemory = setting(
        "memory",
        "total",
        _choice("total", "perDevice"),
        "total (split evenly over the GPUs, as ACK does) or perDevice (as HAMi does)",
    )
    max_gpus: int = setting("maxGpus", 8, _positive_int(1024), "GPUs of the largest node")


@dataclass(frozen=True)
class Security:
    """What a GPU-memory pod may not do, because it would reach past the shim."""

    reject_privileged: bool = setting(
        "rejectPrivileged", True, _bool, "reject privileged, hostPID, CAP_SYS_ADMIN"
    )
    reject_visible_devices: bool = setting(
        "rejectVisibleDevices", True, _bool, "reject NVIDIA_VISIBLE_DEVICES set by the user"
    )


@dataclass(frozen=True)
class Policy:
    """The effective policy, defaults filled in."""

    scheduler_name: str = setting(
        "schedulerName",
        "gpushare-scheduler",
        _string(_DNS_LABELS, "a scheduler name such as gpushare-scheduler"),
        "set on every GPU-memory pod",
    )
    resource_name: str = setting(
        "resourceName",
        "aliyun.com/gpu-mem",
        _string(_RESOURCE, "a resource name such as aliyun.com/gpu-mem"),
        "the resource that makes a pod a GPU-memory pod",
    )
    memory_unit: MemoryUnit = setting(
        "memoryUnit", "GiB", _choice("GiB", "MiB"), "GiB or MiB: one unit of resourceName"
    )
    gpu_memory: int = setting(
        "gpuMemory",
        16,
        _positive_int(2**40),
        "largest GPU, in memoryUnit, if nodes are unknown (16384 with MiB)",
    )
    shim: Shim = section("shim", Shim, "the interception library")
    env: EnvNames = section("env", EnvNames, "the variables the shim reads")
    compute: Compute = section("compute", Compute, "compute (SM) share")
    multi_gpu: MultiGpu = section("multiGpu", MultiGpu, "pods spanning several GPUs")
    security: Security = section("security", Security, "what a GPU-memory pod may not do")
    exclude_namespaces: tuple[str, ...] = setting(
        "excludeNamespaces", ("kube-system",), _namespaces, "pods here are never touched"
    )

    @property
    def mib_per_unit(self) -> int:
        return 1024 if self.memory_unit == "GiB" else 1

    def to_document(self) -> dict[str, Any]:
        """The policy as the YAML document an operator writes (camelCase keys)."""
        return _document(self)


DEFAULT_POLICY = Policy()


def _keys(kind: type) -> dict[str, Field[Any]]:
    return {spec.metadata["key"]: spec for spec in fields(kind)}


def _build(kind: type, document: Mapping[Any, Any], prefix: str) -> Any:
    specs = _keys(kind)
    values: dict[str, Any] = {}
    for key, value in document.items():
        dotted = f"{prefix}{key}"
        spec = specs.get(key)
        if spec is None:
            raise PolicyError(
                f"policy key {dotted!r} is not known; allowed keys here: {', '.join(specs)}"
            )
        inner = spec.metadata.get("section")
        if inner is None:
            values[spec.name] = spec.metadata["check"](dotted, value)
        elif isinstance(value, dict):
            values[spec.name] = _build(inner, value, f"{dotted}.")
        else:
            raise PolicyError(
                f"policy key {dotted!r}: expected a mapping with keys "
                f"{', '.join(_keys(inner))}, got {value!r}"
            )
    return kind(**values)


def _document(settings: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in fields(settings):
        value = getattr(settings, spec.name)
        if "section" in spec.metadata:
            value = _document(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[spec.metadata["key"]] = value
    return out


def parse_policy(document: object) -> Policy:
    """Build a Policy from a decoded YAML document (None means all defaults)."""
    if document is None:
        return DEFAULT_POLICY
    if not isinstance(document, dict):
        raise PolicyError(
            f"the policy must be a YAML mapping of keys, got {type(document).__name__}"
        )
    policy = cast(Policy, _build(Policy, document, ""))
    if policy.memory_unit == "MiB" and "gpuMemory" not in document:
        # NB: the default is 16 GiB in either unit; read as MiB it would be 16 MiB.
        policy = replace(policy, gpu_memory=DEFAULT_POLICY.gpu_memory * 1024)
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


# Where the comment of a line starts in ``policy show``; a longer line has its
# comment two spaces after it.
_COMMENT_COLUMN = 36


def dump_policy(policy: Policy) -> str:
    """The effective policy as YAML, every key present, each with its line of documentation."""
    lines = []
    for text, doc in _lines(policy, ""):
        lines.append(f"{text.ljust(_COMMENT_COLUMN - 2)}  # {doc}" if doc else text)
    return "\n".join(lines) + "\n"


def _lines(settings: Any, indent: str) -> Iterator[tuple[str, str]]:
    for spec in fields(settings):
        key, doc = spec.metadata["key"], spec.metadata["doc"]
        value = getattr(settings, spec.name)
        if "section" in spec.metadata:
            yield f"{indent}{key}:", doc
            yield from _lines(value, indent + "  ")
        else:
            plain = list(value) if isinstance(value, tuple) else value
            text = yaml.safe_dump(plain, default_flow_style=True, width=1 << 20)
            yield f"{indent}{key}: {text.removesuffix(chr(10)).removesuffix(chr(10) + '...')}", doc
